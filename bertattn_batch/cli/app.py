"""The ``bertattn`` application: its set-up, and how a library call's errors become exit codes."""

from __future__ import annotations

import logging
import signal
import threading
import traceback
from collections.abc import Callable
from typing import Annotated, TypeVar

import typer

from ..errors import BertAttnError
from ..runtime import tune_runtime

app = typer.Typer(
    help="Stream review corpora through a fine-tuned BERT classifier; write each review's prediction "
    "and its per-head [CLS] attention to Parquet.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


T = TypeVar("T")


_state = {"debug": False}


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler stopping the job), handled as Ctrl-C is: the part in hand is committed or
    dropped whole, the manifest says "interrupted", and the same command resumes."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated


def setup(debug: bool) -> None:
    _state["debug"] = debug
    if threading.current_thread() is threading.main_thread():  # only there may a handler be set
        signal.signal(signal.SIGTERM, _on_sigterm)
    tune_runtime()
    logging.basicConfig(level=logging.INFO if debug else logging.WARNING, format="bertattn: %(message)s")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    # the hub client has its own stderr handler and also propagates: each of its warnings (a retry of
    # an unreachable hub) came out twice; once, through ours, names where it comes from
    logging.getLogger("huggingface_hub").handlers.clear()


def call(fn: Callable[[], T], interrupted: str = "interrupted; rerun the same command to resume") -> T:
    """Run a library call; a BertAttnError becomes one line on stderr and exit status 1, Ctrl-C or
    SIGTERM the line ``interrupted`` and 130 or 143."""
    try:
        return fn()
    except BertAttnError as e:
        if _state["debug"]:
            traceback.print_exc()
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt as e:
        typer.echo(interrupted, err=True)
        raise typer.Exit(143 if isinstance(e, Terminated) else 130) from None
    except Exception as e:
        if _state["debug"]:
            raise
        typer.echo(f"error: {type(e).__name__}: {e} (rerun with --debug for the traceback)", err=True)
        raise typer.Exit(1) from None


Debug = Annotated[bool, typer.Option("--debug", help="Show tracebacks and library logs.")]


def main() -> None:
    app()
