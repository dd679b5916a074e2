"""How the process answers stop signals (runtime.py), and the package's small helpers (_util.py)."""

from __future__ import annotations

import os
import subprocess
import sys


def test_deferred_signals_act_at_the_end_and_leave_what_python_does_not_handle_as_it_is():
    """A signal caught in the block acts at its end. Under nohup an ignored SIGHUP is not taken over
    (re-raised at the end in place of a Ctrl-C caught after it, it lost the Ctrl-C), and SIGTERM at its
    default (a library's caller) is not held (a hung clean-up could no longer be stopped with it)."""
    from helpers import python_probe

    done = python_probe(  # in a process of its own: signals sent here would reach the test runner
        "import os, signal",
        "from bertattn_batch.runtime import signals_deferred",
        "signal.signal(signal.SIGHUP, signal.SIG_IGN)",
        "try:",
        "    with signals_deferred():",
        "        os.kill(os.getpid(), signal.SIGHUP)",
        "        os.kill(os.getpid(), signal.SIGINT)",
        "        print('block done')",
        "except KeyboardInterrupt:",
        "    print('ctrl-c kept')",
        "with signals_deferred():",
        "    print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,"
        " signal.getsignal(signal.SIGHUP) is signal.SIG_IGN)",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["block done", "ctrl-c kept", "True True"], done.stdout


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
