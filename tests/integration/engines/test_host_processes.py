"""Host processes (engines/processes.py) write the run the threads write: the same tables, row
for row; the windows before a failure are committed, a host process that dies is a one-line error, and
the rerun resumes."""

from __future__ import annotations

import sys
from pathlib import Path

import host_probes
import pytest
import torch
from helpers import RUN_COLUMNS, manifest_json, read_table

from bertattn_batch import schema
from bertattn_batch.config import InputSpec, JobSpec
from bertattn_batch.engines import run_job, shared_outputs
from bertattn_batch.engines.local import MAX_HOST_PROCESSES, host_processes
from bertattn_batch.errors import EngineError, SpecError, WriteError


def _spec(src, model, out, **kw) -> JobSpec:
    return JobSpec(
        inputs=InputSpec([str(src)], id_col="doc_id", label_col="label"),
        model=str(model),
        out=str(out),
        window=4,
        progress=False,
        **kw,
    )


def _tables(run) -> dict:
    return {
        t: read_table(run, t).drop_columns(list(RUN_COLUMNS)) if t == "predictions" else read_table(run, t)
        for t in schema.TABLES
    }


@pytest.fixture(scope="module")
def threaded(drug_sample, tiny_en_dir, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("threads") / "run"
    run_job(_spec(drug_sample, tiny_en_dir, out, host_processes=0))
    return _tables(out)


def test_host_processes_write_the_tables_the_threads_write(
    threaded, drug_sample, tiny_en_dir, tmp_path, monkeypatch
):
    notes = tmp_path / "notes"
    monkeypatch.setenv("PROBE_NOTES", str(notes))
    put, sent = shared_outputs.OutputBlocks.put, []  # how the outputs crossed: shared memory
    monkeypatch.setattr(
        shared_outputs.OutputBlocks, "put", lambda self, o: sent.append(put(self, o)) or sent[-1]
    )
    out = tmp_path / "run"
    summary = run_job(_spec(drug_sample, tiny_en_dir, out, host_processes=2), part_writer=host_probes.Probe)
    assert len(sent) == 6 and all(isinstance(s, shared_outputs.SharedOutputs) for s, _ in sent)
    got = _tables(out)
    for table in schema.TABLES:
        assert got[table].equals(threaded[table]), table
    assert summary.input_rows == 24 and summary.parts_written == 6
    last_run = manifest_json(out)["last_run"]  # what ran, for whoever reads the run
    assert (last_run["host_processes"], last_run["batch_tokens"], last_run["max_batch_size"]) == (
        2,
        16384,
        256,
    )
    writers = [line.split() for line in notes.read_text().splitlines()]
    # two processes wrote the parts, neither of them this one, and neither imported torch; both kept
    # their heaps for the next window, and this process did not touch its own
    assert len({pid for pid, *_ in writers}) == 2 and all(torch == "False" for _, torch, *_ in writers)
    assert str(__import__("os").getpid()) not in {pid for pid, *_ in writers}
    assert all(kept == "True" for _, _, kept, _ in writers) and not host_probes.heap_kept()
    # where the job's time went, and what the host processes used (they are not this one's children)
    assert {"load", "launch", "device_wait"} <= set(summary.seconds)
    used = manifest_json(out)["last_run"]
    assert used["host_processes_cpu_s"] > 0 and used["largest_host_process_max_rss_mb"] > 0


def test_windows_before_a_failed_one_are_committed_and_the_rerun_resumes(
    threaded, drug_sample, tiny_en_dir, tmp_path, monkeypatch
):
    """Window 12 fails in one process while window 8, before it, is still being written in the other:
    8 is finished work, committed; the rerun starts at 12."""
    monkeypatch.setenv("PROBE_SLOW", "8")
    monkeypatch.setenv("PROBE_FULL", "12")
    out = tmp_path / "run"
    spec = _spec(drug_sample, tiny_en_dir, out, host_processes=2)
    with pytest.raises(WriteError, match="No space left on device"):
        run_job(spec, part_writer=host_probes.SlowThenFull)
    manifest = manifest_json(out)
    assert manifest["status"] == "interrupted"
    assert [p["start_row"] for p in manifest["parts"]] == [0, 4, 8]
    assert not list(out.glob("*/_*"))
    summary = run_job(spec)
    assert summary.input_rows == 12  # the rest only
    got = _tables(out)
    for table in schema.TABLES:
        assert got[table].equals(threaded[table]), table


def test_a_host_process_that_dies_is_one_line_and_the_rerun_resumes(
    threaded, drug_sample, tiny_en_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("PROBE_DIE", "12")
    out = tmp_path / "run"
    spec = _spec(drug_sample, tiny_en_dir, out, host_processes=2)
    with pytest.raises(EngineError, match="host process ended abruptly"):
        run_job(spec, part_writer=host_probes.Dies)
    done = [p["start_row"] for p in manifest_json(out)["parts"]]
    assert done == list(range(0, 12, 4))  # every window before the dead one's
    run_job(spec)
    got = _tables(out)
    for table in schema.TABLES:
        assert got[table].equals(threaded[table]), table


def test_processes_by_default_only_beside_an_accelerator():
    assert host_processes(None, torch.device("cpu")) == 0
    assert host_processes(3, torch.device("cpu")) == 3
    cores = len(__import__("os").sched_getaffinity(0))
    want = 0 if cores < 3 else min(cores - 1, MAX_HOST_PROCESSES)
    assert host_processes(None, torch.device("meta")) == want
    with pytest.raises(SpecError, match="host_processes must not be negative"):
        JobSpec(inputs=["x"], model="m", out="o", host_processes=-1)


def test_more_host_processes_than_the_cores_can_take_are_refused(
    drug_sample, tiny_en_dir, tmp_path, monkeypatch
):
    """100,000 ran out of open files: an OSError that named no option, after a warning (and after a
    job's model was trained)."""
    from bertattn_batch.engines import base
    from bertattn_batch.engines.local import MAX_HOST_PROCESSES_PER_CORE, _cores

    def trained(*args, **kwargs):
        raise AssertionError("the model was trained or loaded first")

    monkeypatch.setattr(base, "ensure_model", trained)
    too_many = MAX_HOST_PROCESSES_PER_CORE * _cores() + 1
    with pytest.raises(SpecError, match=f"--host-processes {too_many} is more than this machine's"):
        run_job(_spec(drug_sample, tiny_en_dir, tmp_path / "run", host_processes=too_many))


def test_the_cli_option_runs_host_processes(
    threaded, drug_sample, tiny_en_dir, tmp_path, monkeypatch, caplog
):
    """As asked, also more than the cores (they take turns on them), with a warning that says so."""
    from typer.testing import CliRunner

    from bertattn_batch.cli import app

    monkeypatch.setattr("bertattn_batch.engines.local._cores", lambda: 1)
    out = tmp_path / "run"
    args = ["extract", str(drug_sample), "--model", str(tiny_en_dir), "--out", str(out), "--id-col", "doc_id",
            "--label-col", "label", "--window", "4", "--no-progress", "--host-processes", "2"]  # fmt: skip
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert manifest_json(out)["spec"]["host_processes"] == 2
    assert "2 host processes on 1 cores: they take turns on the cores" in caplog.text
    got = _tables(out)
    for table in schema.TABLES:
        assert got[table].equals(threaded[table]), table


def test_a_script_without_a_main_guard_fails_with_a_hint_instead_of_hanging(
    drug_sample, tiny_en_dir, tmp_path
):
    """A spawned host process imports the script that started the job; without the guard it runs the
    job again there and fails to start. The job must say so, not wait forever for it."""
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text(
        "from bertattn_batch import JobSpec, run_job\n"
        f"run_job(JobSpec(inputs=[{str(drug_sample)!r}], model={str(tiny_en_dir)!r}, "
        f"out={str(tmp_path / 'run')!r},"
        " window=4, progress=False, host_processes=1))\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 1
    assert 'under `if __name__ == "__main__":`' in done.stderr.strip().splitlines()[-1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is POSIX's")
def test_a_second_job_reuses_the_fork_server_and_passes_its_environment(drug_sample, tiny_en_dir, tmp_path):
    """Host processes are forked from one server, which a second job in the same process reuses; its
    host processes still see the environment as that job set it."""
    import os
    import subprocess

    tests = Path(__file__).resolve().parents[2]
    script = tmp_path / "job.py"
    script.write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {str(tests)!r})\n"
        "import host_probes\n"
        "from bertattn_batch import JobSpec, run_job\n"
        "if __name__ == '__main__':\n"
        "    for k in range(2):\n"
        f"        os.environ['PROBE_NOTES'] = {str(tmp_path)!r} + f'/notes-{{k}}'\n"
        f"        run_job(JobSpec(inputs=[{str(drug_sample)!r}], model={str(tiny_en_dir)!r},"
        f" out={str(tmp_path)!r} + f'/run-{{k}}', window=4, progress=False, host_processes=2),"
        " part_writer=host_probes.Probe)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PROBE_NOTES"}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    notes = [[line.split() for line in (tmp_path / f"notes-{k}").read_text().splitlines()] for k in (0, 1)]
    writers = [{pid for pid, *_ in lines} for lines in notes]
    assert all(len(w) == 2 for w in writers) and not writers[0] & writers[1]  # new processes, new notes
    assert len({server for lines in notes for *_, server in lines}) == 1  # forked from one server


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the processes in /proc")
def test_host_processes_end_when_the_jobs_process_is_killed(drug_sample, tiny_en_dir, tmp_path):
    """The job's process is the one the kernel kills when memory runs out: its host processes must not
    live on, orphaned, each holding a tokenizer and windows."""
    import os
    import signal
    import subprocess
    import time

    tests = Path(__file__).resolve().parents[2]
    script = tmp_path / "job.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(tests)!r})\n"
        "import host_probes\n"
        "from bertattn_batch import JobSpec, run_job\n"
        "if __name__ == '__main__':\n"
        f"    run_job(JobSpec(inputs=[{str(drug_sample)!r}], model={str(tiny_en_dir)!r},"
        f" out={str(tmp_path / 'run')!r}, window=2, progress=False, host_processes=2),"
        " part_writer=host_probes.Slow)\n"
    )
    job = subprocess.Popen([sys.executable, str(script)], env={**os.environ, "PROBE_SLEEP": "2"})
    try:
        deadline = time.monotonic() + 120
        hosts: list[int] = []
        while len(hosts) < 2 and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.2)
            hosts = [p for p in _descendants(job.pid) if _is_host_process(p)]
        assert len(hosts) == 2, "the host processes did not start"
        hosts = _descendants(job.pid)  # and the fork server they came from
        job.send_signal(signal.SIGKILL)
        job.wait()
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in hosts) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in hosts if _alive(p)]
    finally:
        job.kill()


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def _descendants(pid: int) -> list[int]:
    found = []
    for child in _children(pid):
        found += [child, *_descendants(child)]
    return found


def _is_host_process(pid: int) -> bool:
    """Forked from the fork server (whose command line they share), and set up: its thread that
    watches the job's process runs."""
    line = _cmdline(pid)
    forked = b"forkserver" in line and b"forkserver" in _cmdline(_parent(pid))
    return forked and len(list(Path(f"/proc/{pid}/task").glob("*"))) > 1


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is POSIX's")
def test_ctrl_c_while_the_fork_server_starts_leaves_no_traceback(drug_sample, tiny_en_dir, tmp_path):
    """A Ctrl-C while a host process waited for the fork server (still importing) left the server to
    fork it after the job had let go of its semaphores: a traceback after ``interrupted``. The slow
    import and the job's slow exit here make that race certain."""
    import subprocess

    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(3)\n")
    script = tmp_path / "job.py"
    script.write_text(
        "import atexit, time\n"
        "atexit.register(time.sleep, 5)  # runs after multiprocessing's own exit: the job lingers\n"
        "import os, signal, sys, threading\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "from bertattn_batch import JobSpec, run_job\n"
        "from bertattn_batch.engines import processes\n"
        "processes.PRELOAD.append('slow_import')\n"
        "pool = processes.ProcessPoolExecutor\n"
        "def interrupted(*args, **kwargs):  # a Ctrl-C a second after the host processes start\n"
        "    if not hasattr(interrupted, 'sent'):\n"
        "        interrupted.sent = threading.Timer(1, os.kill, (os.getpid(), signal.SIGINT))\n"
        "        interrupted.sent.start()\n"
        "    return pool(*args, **kwargs)\n"
        "processes.ProcessPoolExecutor = interrupted\n"
        "if __name__ == '__main__':\n"
        f"    run_job(JobSpec(inputs=[{str(drug_sample)!r}], model={str(tiny_en_dir)!r},"
        f" out={str(tmp_path / 'run')!r}, window=4, progress=False, host_processes=2))\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert done.stderr.strip().splitlines()[-1] == "KeyboardInterrupt", done.stderr
    assert "_serve_one" not in done.stderr and "FileNotFoundError" not in done.stderr, done.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the processes' signal masks in /proc")
def test_the_fork_server_and_resource_tracker_are_deaf_to_what_reaches_the_process_group():
    """A closed terminal's SIGHUP reaches the whole process group: it killed the resource tracker (which
    ignores SIGINT and SIGTERM alone), and the one started in its place printed a KeyError for every
    block it never knew of. A Ctrl-C while the server imported its modules printed its traceback."""
    import signal

    from helpers import python_probe

    done = python_probe(
        "import os",
        "from bertattn_batch.engines import processes",
        "processes.start_server()",
        "me = os.getpid()",
        "for pid in open(f'/proc/{me}/task/{me}/children').read().split():",
        "    status = dict(line.split(':\\t') for line in open(f'/proc/{pid}/status').read().splitlines())",
        "    print(int(status['SigBlk'], 16) | int(status['SigIgn'], 16))",
    )
    assert done.returncode == 0, done.stderr
    deaf = list(map(int, done.stdout.split()))
    assert len(deaf) == 2  # the tracker and the server
    for mask in deaf:
        assert mask & (1 << (signal.SIGINT - 1)) and mask & (1 << (signal.SIGHUP - 1))
