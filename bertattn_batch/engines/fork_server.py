"""The fork server that host processes are forked from (engines/host_processes.py): a fresh process that
imports their modules and the job's main script once, where each spawned host process imported them
all on its own (15 of them beside an H200 waited 10 s of a 33 s run for that).

Imported by the server itself too, ahead of any fork (it is in the server's preload list): there it
imports the main script, which Python's own fork server leaves to each forked process (3.11 and 3.12, at
least, look for the script under a key that multiprocessing no longer sets).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import threading
from collections.abc import Iterator
from multiprocessing import forkserver, process, resource_tracker, spawn

from ..errors import STOP_SIGNALS

#: How the job's process tells the server which main script to import (read and removed at once).
MAIN_ENV = "BERTATTN_FORKSERVER_MAIN"
#: What the server imports before any fork: this module (for the main script), the host processes'
#: module and the tokenizers' library, which each host process imported on its own when spawned.
PRELOAD = [__name__, "bertattn_batch.engines.host_processes", "transformers", "transformers.models"]

_starting = threading.Lock()


def context() -> multiprocessing.context.BaseContext:
    """The fork server's context, the server started if it is not yet (its imports run while the caller
    goes on: the model loads); spawn where there is no fork server (Windows). A server that a job
    before started is used as it is."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    with _starting:
        if getattr(forkserver._forkserver, "_forkserver_pid", None) is None:  # not started yet
            ctx.set_forkserver_preload(PRELOAD)
            keys = ("init_main_from_path", "init_main_from_name")
            main = {k: v for k, v in spawn.get_preparation_data("host").items() if k in keys}
            os.environ[MAIN_ENV] = json.dumps(main)  # the server starts with this process's environment
            try:
                # the tracker first (the server would start it with SIGHUP open); each in a block of
                # its own, as the tracker's start unblocks SIGINT on its way out
                for start in (resource_tracker.ensure_running, forkserver.ensure_running):
                    with _deaf_children():
                        start()
            finally:
                os.environ.pop(MAIN_ENV, None)
    return ctx


@contextlib.contextmanager
def _deaf_children() -> Iterator[None]:
    """Block Ctrl-C's SIGINT and a closed terminal's SIGHUP in this thread while the fork server and
    the resource tracker start: they inherit the mask, and neither unblocks SIGHUP. Here the signals
    wait for the end of the block, and then act. Host processes forked from the server inherit it too;
    they ignore both signals anyway (``host_processes._init``), and SIGTERM stays open.

    Why: both reach the whole process group. SIGHUP killed the resource tracker (which ignores SIGINT
    and SIGTERM alone), and the one started in its place printed a KeyError for each shared-memory
    block it never knew of; a Ctrl-C while the server still imported its modules printed its traceback
    after ``interrupted``."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held = {signal.SIGINT, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Keep Ctrl-C, SIGTERM and SIGHUP for the end of the block, where they act as they would have
    (only the main thread's handlers can be swapped: elsewhere the block runs as it is).

    Why: starting a process waits for the fork server, which may still be importing its modules; cut
    short there, the job went on to end, and the server forked the process after all, which found the
    job's semaphores gone and printed a traceback after ``interrupted``."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    # Python's own handlers only: an ignored SIGHUP (nohup) re-raised at the end would have stood for a
    # Ctrl-C caught after it, and SIGTERM left at its default (a library's caller) still ends the process
    held = {sig: handler for sig, handler in held.items() if callable(handler)}
    for sig in held:
        signal.signal(sig, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)
        if caught:  # a scheduler's SIGTERM after a Ctrl-C still ends the job as stopped by it
            signal.raise_signal(signal.SIGTERM if signal.SIGTERM in caught else caught[0])


def _import_main() -> None:
    """In the server: import the job's main script as each forked process would (a script that runs a
    job without ``if __name__ == "__main__":`` fails here, as it would in a spawned process)."""
    main = json.loads(os.environ.pop(MAIN_ENV))
    process.current_process()._inheriting = True
    try:
        spawn.prepare(main)
    finally:
        del process.current_process()._inheriting


if MAIN_ENV in os.environ:  # only the server starts with it
    _import_main()
