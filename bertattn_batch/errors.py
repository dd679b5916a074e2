"""Named errors raised by the library; only the CLI turns them into exit codes."""

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
    """The distributed engine cannot run: Ray is not installed, a cluster is unreachable, or a worker
    failed."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, handled as Ctrl-C is; ``signum``: which, for the exit status (128 + it)."""

    signum: int = signal.SIGTERM


def first_line(e: BaseException) -> str:
    """An exception's first line: library messages run over many lines, ours are one. A first line that
    ends in a colon only announces the next, so that one is kept too."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()] or [type(e).__name__]
    return f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]
