"""The `bertattn` application: its set-up, and how a library call's errors and signals become exit codes."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Annotated, NoReturn, TypeVar

import click
import typer
from typer.core import TyperOption

from ..errors import BertAttnError, Terminated, signals_to_handle
from ..runtime import tune_runtime
from ..storage import redact

app = typer.Typer(
    help="Stream review corpora through a fine-tuned BERT classifier; write each review's prediction "
    "and its per-head [CLS] attention to Parquet.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


T = TypeVar("T")


def _no_flag_type(self: TyperOption, ctx: click.Context) -> str | None:
    """An on/off flag has no value to type: its help shows no ``<bool>`` column."""
    return None if self.is_flag else _display_type(self, ctx)


# typer's help prints every option's type, flags' too; for a flag that says nothing (help only)
_display_type = TyperOption.display_type_rich
TyperOption.display_type_rich = _no_flag_type


#: debug: --debug was given; working: a library call is running; done: the command's work is finished
_state = {"debug": False, "working": False, "done": False}
INTERRUPTED = "interrupted; rerun the same command to resume"
#: Said of a command that reads a run and writes what it computed whole, or nothing.
REDONE = "interrupted; nothing was written: rerun the command to compute it again"


def on_signal(signum: int, frame: object) -> None:
    """SIGINT, SIGTERM and SIGHUP: inside a library call, its clean-up runs (see :func:`call`); before
    one, the command stops with the ``interrupted`` line; once the command's work is done, the signal
    is ignored, so a scheduler never sees a failure of a run that succeeded."""
    if _state["done"]:
        return
    if _state["working"]:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop = Terminated()
        stop.signum = signum
        raise stop
    print(INTERRUPTED, file=sys.stderr)
    raise SystemExit(128 + signum)


def install_signal_handlers() -> None:
    if threading.current_thread() is threading.main_thread():  # only there may a handler be set
        for sig in signals_to_handle():
            signal.signal(sig, on_signal)


class _OncePerMessage(logging.Filter):
    """Show each of the input readers' messages once: ``validate`` reads the inputs twice (coverage,
    then spans), and each reading warned of the same rows. Other messages (an out-of-memory retry that
    recurs, say) are all shown. No message shows a URI's credentials."""

    def __init__(self, most: int = 10_000) -> None:
        super().__init__()
        self._seen: set[str] = set()
        self._most = most

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact(record.getMessage()), ()  # no URI's credentials in a log
        if not record.name.startswith(("bertattn_batch.inputs", "bertattn_batch.analysis")):
            return True
        message = record.getMessage()
        if message in self._seen:
            return False
        if len(self._seen) < self._most:
            self._seen.add(message)
        return True


def setup(debug: bool) -> None:
    _state["debug"] = debug
    install_signal_handlers()
    tune_runtime()
    root = logging.getLogger()
    if not root.handlers:  # ours, not a notebook's or a test runner's
        logging.basicConfig(level=logging.INFO if debug else logging.WARNING, format="bertattn: %(message)s")
        root.handlers[0].addFilter(_OncePerMessage())
    # transformers and the hub client read these when first imported: a command that never loads a
    # model does not pay the second that importing transformers takes
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:  # imported already (a notebook, a test runner)
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    # the hub client has its own stderr handler and also propagates: each of its warnings (a retry of
    # an unreachable hub) came out twice; once, through ours, names where it comes from
    logging.getLogger("huggingface_hub").handlers.clear()


def call(fn: Callable[[], T], interrupted: str = INTERRUPTED, completes: bool = False) -> T:
    """Run a library call; a BertAttnError becomes one line on stderr and exit status 1, Ctrl-C or
    SIGTERM (SIGHUP) the line ``interrupted`` and 130 or 143 (129). Any other error (a bug, or an error
    of a library underneath that no check foresaw) is one line too, naming its type and ``--debug``,
    which raises it with its traceback: a scheduled job's log keeps one line per failure.
    ``completes``: the call is the command's work, so a signal after it returns changes nothing."""
    _state["working"] = True
    try:
        result = fn()
        _state["done"] = completes
        return result
    except BertAttnError as e:
        if _state["debug"]:
            traceback.print_exc()
        typer.echo(f"error: {redact(str(e))}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt as e:  # its args: what a rerun does where that is not to resume
        typer.echo(f"interrupted; {e.args[0]}" if e.args else interrupted, err=True)
        raise typer.Exit(128 + e.signum if isinstance(e, Terminated) else 130) from None
    except Exception as e:
        if _state["debug"]:
            raise
        typer.echo(
            f"error: {type(e).__name__}: {redact(str(e))} (rerun with --debug for the traceback)", err=True
        )
        raise typer.Exit(1) from None
    finally:
        _state["working"] = False


Debug = Annotated[bool, typer.Option("--debug", help="Show tracebacks and library logs.")]


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"bertattn-batch {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Stream review corpora through a fine-tuned BERT classifier; write each review's prediction and its
    per-head [CLS] attention to Parquet."""


class GuardedStdout:
    """Standard output that does not raise: a reader that closed the pipe early (``| head -1``) or a
    full disk made the command fail after its work was done (a complete run's extract exited 1), or
    broke a validate's verdict into a traceback. The first error is kept, later output dropped, and
    :func:`exit_now` says what became of it."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.error: OSError | None = None

    def write(self, text: str) -> int:
        if self.error is None:
            try:
                return self._stream.write(text)
            except OSError as e:
                self.error = e
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.error is None:
            try:
                self._stream.flush()
            except OSError as e:
                self.error = e

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def main() -> None:
    install_signal_handlers()
    for stream in (sys.stdout, sys.stderr):  # a token, a "−" or rich's "…" that the terminal's encoding
        if hasattr(stream, "reconfigure"):  # lacks (latin-1, cp1252) is escaped, not a traceback at the end
            stream.reconfigure(errors="backslashreplace")
    if sys.stdout is not None:  # None: started with its output closed, which click and rich allow for
        sys.stdout = GuardedStdout(sys.stdout)
    try:
        app()
    except SystemExit as e:  # how click ends every command, 0 included
        exit_now(e.code)


def exit_now(code: int | str | None) -> NoReturn:
    """Exit with ``code`` once the threads and exit hooks of Python have finished, skipping the
    interpreter's teardown. Arrow's and polars' native thread pools, torn down together, abort the process
    now and then after a command has done its work (exit 134 or 139 after ``validate`` printed
    "clean", about one run in ten on a folder of CSV files; pola-rs/polars#24169, apache/arrow#34314)."""
    if isinstance(code, str):  # sys.exit("message"), as Python prints it
        print(code, file=sys.stderr)
        code = 1
    # what Python's own exit does first: threading's exit hooks, which end the workers of thread pools
    # left open (torch.compile's: without them extract --compile never exited), then wait for threads.
    # A hook that fails (a process pool's wake-up pipe already closed: Bad file descriptor) is passed
    # over, as Python passes it over, rather than turning a finished command into exit status 1.
    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()  # logging's flush, temporary files, multiprocessing's children
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # None: started with it closed
            with contextlib.suppress(OSError):  # (stdout: GuardedStdout's error, said below)
                stream.flush()
    error = getattr(sys.stdout, "error", None)  # GuardedStdout's
    if error is not None and not isinstance(error, BrokenPipeError):  # a closed pipe: its reader's wish
        with contextlib.suppress(OSError, AttributeError):
            print(f"error: cannot write to standard output: {error.strerror or error}", file=sys.stderr)
            sys.stderr.flush()
        code = code or 1
    os._exit(code or 0)
