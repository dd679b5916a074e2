"""The `bertattn` application: its set-up, and how a library call's errors and signals become exit codes."""

from __future__ import annotations

import logging
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Iterable
from typing import Annotated, TypeVar

import typer

from ..errors import BertAttnError, Terminated
from ..runtime import INTERRUPTED, on_stop, signals_deferred, tune_runtime
from ..storage import redact

# its own help option, below: shown without a type; help read as Markdown, so that a docstring's paragraph
# wraps to the terminal's width, not at its source lines
app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    add_help_option=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)

T = TypeVar("T")
_debug = {"on": False}
#: Said of a command that reads a run and writes what it computed whole, or nothing.
REDONE = "interrupted; nothing was written: rerun the command to compute it again"


def _redacted(record: logging.LogRecord) -> bool:  # no log message shows a URI's credentials
    record.msg, record.args = redact(record.getMessage()), ()
    return True


def setup(debug: bool, loads_model: bool = False) -> None:
    """What every command does first: logging, and the native libraries' settings. ``loads_model``:
    import torch with stop signals held (a stop raised inside its native import code aborts)."""
    _debug["on"] = debug
    tune_runtime()
    if loads_model:
        with signals_deferred():
            import torch.utils.data  # noqa: F401  (torch, and the distributed package it imports)
    root = logging.getLogger()
    if not root.handlers:  # ours, not a notebook's or a test runner's
        logging.basicConfig(level=logging.INFO if debug else logging.WARNING, format="bertattn: %(message)s")
        root.handlers[0].addFilter(_redacted)
    # read when transformers and the hub client are first imported (a command may never import them)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:  # imported already (a notebook, a test runner)
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    # the hub client's warnings go through our handler only, so each prints once
    logging.getLogger("huggingface_hub").handlers.clear()
    if not debug:  # torch's notice of its own coming changes (its compiler's, as ALTI compiles)
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.")


def call(fn: Callable[[], T], interrupted: str = INTERRUPTED, completes: bool = False) -> T:
    """Run a library call: a BertAttnError becomes one line on stderr and exit status 1; Ctrl-C, SIGTERM
    or SIGHUP the ``interrupted`` line and 130, 143 or 129; any other error one line naming its type
    (``--debug`` raises it with its traceback). ``completes``: the call is the command's work, so a
    stop signal after it returns changes nothing."""
    on_stop["mode"] = "raise"
    try:
        result = fn()
        on_stop["mode"] = "ignore" if completes else "exit"
        return result
    except BertAttnError as e:
        if _debug["on"]:
            traceback.print_exc()
        typer.echo(f"error: {redact(str(e))}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt as e:  # its args: what a rerun does where that is not to resume
        typer.echo(f"interrupted; {e.args[0]}" if e.args else interrupted, err=True)
        raise typer.Exit(128 + e.signum if isinstance(e, Terminated) else 130) from None
    except Exception as e:
        if _debug["on"]:
            raise
        if isinstance(e, UnicodeEncodeError) and "surrogates" in e.reason and isinstance(e.object, str):
            said = _not_utf8(e.object)  # a name from the file system (an input folder's file) not in UTF-8
        else:
            said = f"{type(e).__name__}: {redact(str(e))} (rerun with --debug for the traceback)"
        typer.echo(f"error: {said}", err=True)
        raise typer.Exit(1) from None
    finally:
        if on_stop["mode"] == "raise":
            on_stop["mode"] = "exit"


Debug = Annotated[bool, typer.Option("--debug", help="Show tracebacks and library logs.")]


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"bertattn-batch {__version__}")
        raise typer.Exit()


def _help(ctx: typer.Context, value: bool) -> None:
    if value:
        typer.echo(ctx.get_help())
        raise typer.Exit()


# fmt: off
@app.callback()
def _options(
    ctx: typer.Context,
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.", metavar=""
    )] = False,
    _: Annotated[bool, typer.Option(
        "--help", callback=_help, is_eager=True, help="Show this message and exit.", metavar="")] = False,
) -> None:
    # fmt: on
    """Stream review corpora through a fine-tuned BERT classifier; write each review's prediction and its
    per-head [CLS] attention to Parquet."""
    # an on/off flag has no value to type: its help shows no ``<bool>`` (this runs before a command
    # parses its options, and shows its help)
    for command in ctx.command.commands.values():  # type: ignore[attr-defined]
        for param in command.get_params(ctx):
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""


class GuardedStdout:
    """Standard output that does not raise: a reader that closed the pipe early (``| head -1``) or a
    full disk must not fail a command whose work is done. The first error is kept for :func:`main`."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self.error: OSError | None = None

    def write(self, text: str) -> int:
        self._guarded(lambda: self._stream.write(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._guarded(self._stream.flush)

    def _guarded(self, call: Callable[[], object]) -> None:
        if self.error is None:
            try:
                call()
            except OSError as e:
                self.error = e

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _not_utf8(text: str) -> str:
    """What to say of a path or text holding bytes that are no UTF-8 (Python's surrogate escapes)."""
    try:
        shown = repr(text.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
        shown = ascii(text)
    return (
        f"{shown} is not valid UTF-8: bertattn records paths, ids and texts in UTF-8 files; rename it, "
        "or give it in UTF-8"
    )


def main() -> None:
    """Run the application; a failed write to standard output is one line and exit status 1, a pipe
    closed by its reader no failure. An argument that is not UTF-8 is refused before any command runs."""
    if bad := [arg for arg in sys.argv[1:] if any("\ud800" <= c <= "\udfff" for c in arg)]:
        print(f"error: {_not_utf8(bad[0])}", file=sys.stderr)
        sys.exit(2)
    if not os.environ.get("COLUMNS", "1").isdigit() or os.environ.get("COLUMNS") == "0":
        del os.environ["COLUMNS"]  # with COLUMNS=0 the help and usage errors would print nothing
    for stream in (sys.stdout, sys.stderr):  # a character the terminal's encoding lacks is escaped
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    guarded = sys.stdout = GuardedStdout(sys.stdout) if sys.stdout is not None else None
    code: int | str | None = 0
    try:
        app()
    except SystemExit as e:  # how click ends every command, 0 included
        code = e.code
    if guarded is not None:
        guarded.flush()
        if guarded.error is not None:  # what Python's docs advise: the rest goes nowhere, silently
            os.dup2(os.open(os.devnull, os.O_WRONLY), guarded.fileno())
            if not isinstance(guarded.error, BrokenPipeError):  # a closed pipe: its reader's wish
                print(f"error: cannot write to standard output: {guarded.error.strerror}", file=sys.stderr)
                code = code or 1
    sys.exit(code)
