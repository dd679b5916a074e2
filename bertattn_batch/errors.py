"""Named errors raised by the library; only the CLI turns them into exit codes. ``first_line`` cuts a
library's many-line message down to what one of ours can quote."""

import signal


class BertAttnError(Exception):
    """Base class: a problem the user can fix, reported as one line."""


class SpecError(BertAttnError):
    """A job spec or option is invalid (unknown key, wrong type, bad value)."""


class InputError(BertAttnError):
    """An input file is missing, unreadable, or lacks a needed column."""


class ModelError(BertAttnError):
    """A model cannot be loaded or is not a supported BERT-family classifier."""


class RunDirError(BertAttnError):
    """A run directory belongs to another job, model or schema, or is damaged."""


class InputsEditedError(RunDirError):
    """Input rows a run committed read otherwise now: found on the way to the resume point, before the
    pass writes anything, so the run keeps the manifest it had."""


class DamagedRunError(RunDirError):
    """A run directory whose manifest or commit log cannot be read as one (cut short, edited)."""


class RunVersionError(RunDirError):
    """A run directory whose tables another version of bertattn-batch wrote in another form."""


class WriteError(BertAttnError):
    """Writing output failed (disk full, permission denied); the run can be resumed."""


class StorageError(BertAttnError):
    """A path or URI names no filesystem this install can serve, or the store refused us (bucket, keys)."""


class EngineError(BertAttnError):
    """The distributed engine cannot run: Ray is not installed, a cluster is unreachable, or a worker failed."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler stopping the job) or SIGHUP (the terminal or ssh session it ran in closed),
    handled as Ctrl-C is: the part in hand is committed or dropped whole, the manifest says
    "interrupted", and the same command resumes. ``signum``: which, for the exit status (128 + it)."""

    signum: int = signal.SIGTERM


#: The signals that stop a job as Ctrl-C does (Windows has no SIGHUP).
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


def signals_to_handle() -> list[int]:
    """The stop signals a command takes over: all but a SIGHUP that ``nohup`` set to be ignored (a job
    started so must outlive the terminal)."""
    hangup = getattr(signal, "SIGHUP", None)
    return [s for s in STOP_SIGNALS if not (s == hangup and signal.getsignal(s) is signal.SIG_IGN)]


def first_line(e: BaseException) -> str:
    """An exception's first line: library messages run over many lines, ours are one. A first line that
    ends in a colon only announces the next, so that one is kept too."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()] or [type(e).__name__]
    return f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
