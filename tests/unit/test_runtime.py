"""trim_heap hands freed C-heap pages back to the system, and keep_heap keeps them for the next window
(glibc only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bertattn_batch import runtime
from bertattn_batch.runtime import trim_heap

glibc_only = pytest.mark.skipif(runtime._glibc("mallopt") is None, reason="the C library is not glibc")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@glibc_only
def test_trim_heap_returns_freed_fragments_to_the_system():
    # 200 MB in 64 KiB blocks (under glibc's mmap threshold: served from the heap), every page touched;
    # every block but the last is freed, which pins the heap's top, so free() alone keeps the pages
    blocks = [bytearray(b"x" * (64 << 10)) for _ in range(3200)]
    last = blocks[-1]
    del blocks[:-1]
    kept = _rss_mb()
    trim_heap()
    after = _rss_mb()
    assert kept - after > 0.5 * 200, (kept, after)
    assert last[:1] == b"x"  # the block still in use is intact


_KEPT = """
import json, os, numpy as np
from bertattn_batch import runtime

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

kept = runtime.keep_heap() if os.environ.get("KEEP") else False
before = rss_mb()
array = np.ones(100 << 20, np.uint8)  # 100 MB: mapped apart and unmapped once freed, unless kept
del array
runtime.trim_heap()  # a no-op while the heap is kept
print(json.dumps({"kept": kept, "freed_but_held_mb": rss_mb() - before}))
"""


def _held(**env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    done = subprocess.run([sys.executable, "-c", _KEPT], env={**base, **env}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@glibc_only
def test_a_kept_heap_holds_a_freed_array_for_the_next_window():
    # in processes of their own: there is no way back from a kept heap
    assert _held() == {"kept": False, "freed_but_held_mb": pytest.approx(0, abs=20)}
    kept = _held(KEEP="1")
    assert kept["kept"] and kept["freed_but_held_mb"] > 90, kept


@glibc_only
def test_malloc_settings_the_user_chose_are_left_alone():
    assert _held(KEEP="1", MALLOC_ARENA_MAX="2")["kept"] is False
    assert _held(KEEP="1", GLIBC_TUNABLES="glibc.malloc.trim_threshold=1000000")["kept"] is False


def test_sizes_are_printed_in_the_decimal_units_they_name():
    """The summary said "59.2 MB" for 62,062,804 bytes (it divided by 1024)."""
    from bertattn_batch._terminal import human_bytes

    got = [human_bytes(n) for n in (999, 62_062_804, 1_500, 999_999, 3e9)]
    assert got == ["999 B", "62.1 MB", "1.5 KB", "1.0 MB", "3.0 GB"]


def test_a_terminal_that_reports_no_size_still_gets_a_bar(monkeypatch):
    """A pseudo-terminal opened without a size (``script``, ``docker run -t``) reports 0 columns and 0
    rows, on which tqdm drew no bar at all: every progress bar gets a fixed size there."""
    import pty

    from tqdm import tqdm

    from bertattn_batch._terminal import bar_size

    leader, follower = pty.openpty()  # 0 x 0, as such terminals report
    try:
        with os.fdopen(follower, "w", closefd=False) as term:
            assert os.get_terminal_size(term.fileno()) == (0, 0)
            monkeypatch.setattr(sys, "stderr", term)
            assert bar_size() == {"ncols": 100, "nrows": 24}
            with tqdm(total=3, file=term, mininterval=0, **bar_size()) as bar:
                bar.update(3)
            term.flush()
            drawn = os.read(leader, 65536).decode()
        assert "3/3" in drawn, repr(drawn)
    finally:
        os.close(leader)
        os.close(follower)


def test_a_folder_without_locks_holds_no_lock_file(tmp_path, monkeypatch):
    """Where the file system has no locks, the claim left '.claimed.new' in the saved folder (a trained
    model's) and warned of a file the user never named; the folder is told by its age instead."""
    import errno
    import fcntl

    from bertattn_batch._files import atomic_dir

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with atomic_dir(tmp_path / "model") as tmp:
        (tmp / "config.json").write_text("{}")
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["config.json"]


def test_a_tree_cleared_while_another_process_removes_its_files(tmp_path, monkeypatch):
    """An --overwrite cleared the run while an aggregate removed its work files: the file gone between
    the listing and its removal stopped the extract with an OSError."""
    from bertattn_batch._files import remove_tree

    folder = tmp_path / "aggregates" / "_work-1"
    folder.mkdir(parents=True)
    for name in ("a.parquet", "b.parquet"):
        (folder / name).write_bytes(b"sums")
    unlink = os.unlink

    def removed_first(path, *, dir_fd=None):
        unlink(path, dir_fd=dir_fd)  # the other process's removal, just before ours
        unlink(path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "unlink", removed_first)
    remove_tree(tmp_path / "aggregates")
    assert not (tmp_path / "aggregates").exists()


def test_a_file_two_commands_may_write_at_once_gets_a_temporary_of_each_process(tmp_path):
    """Two aggregates of one run wrote into one temporary, and the first to finish published both
    writes mixed (a corrupt table whose footer named the other's options)."""
    from bertattn_batch._files import atomic_path

    target = tmp_path / "token_influence.parquet"
    with atomic_path(target, unique=True) as tmp:
        assert tmp.name == f".token_influence.parquet.{os.getpid()}.tmp"
        tmp.write_bytes(b"mine")
    assert target.read_bytes() == b"mine" and [p.name for p in tmp_path.iterdir()] == [target.name]


def test_a_folder_moved_aside_by_a_killed_save_goes_back(tmp_path):
    """A kill between atomic_dir's two renames left no model at its path, the old one hidden beside it
    and removed by the next save as a stale temporary."""
    from bertattn_batch._files import atomic_dir

    aside = tmp_path / ".model.old-4242"  # the old model, as the killed process left it
    aside.mkdir()
    (aside / "config.json").write_text("old")
    with atomic_dir(tmp_path / "model") as tmp:
        assert (tmp_path / "model" / "config.json").read_text() == "old"  # back before anything else
        (tmp / "config.json").write_text("new")
    assert (tmp_path / "model" / "config.json").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]


def test_a_temporary_of_a_killed_process_goes_at_once(tmp_path):
    """A report killed while writing left its temporary for six hours, and validate called the run
    damaged meanwhile; a temporary of a process still running stays."""
    from bertattn_batch._files import atomic_path

    dead = _a_dead_pid()
    (tmp_path / f".report.html.{dead}.tmp").write_text("killed")
    (tmp_path / f".report.html.{os.getppid()}.tmp").write_text("writing now")
    with atomic_path(tmp_path / "report.html", unique=True) as tmp:
        tmp.write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".report.html.{os.getppid()}.tmp", "report.html"]


def _a_dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
