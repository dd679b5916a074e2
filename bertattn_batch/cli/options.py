"""Command-line options made from the specs' fields (``config.py``): name, type, default and help are
declared once, for the job file's keys and the command line alike; a command takes them as ``**given``
(every key, None where not given) and reads them with :func:`spec_values`."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable
from dataclasses import MISSING
from typing import Annotated, Any, Literal, TypeVar

import typer

from ..config import keys, non_none, type_hints
from ..errors import SpecError

F = TypeVar("F", bound=Callable[..., Any])
#: What an option left out means: the spec's default (``spec``: shown; keys without one required), the
#: job file's value (``job``), or either (``spec or job``).
Defaults = Literal["spec", "job", "spec or job"]


def spec_options(cls: type, only: Iterable[str] | None = None, skip: Iterable[str] = (),
                 defaults: Defaults = "spec", default_texts: dict[str, str] | None = None,
                 ) -> Callable[[F], F]:  # fmt: skip
    """Give a command an option (or the argument) for each key of spec ``cls`` (or ``only`` those), in
    the signature typer reads: after its arguments, before its keyword-only options. ``default_texts``:
    what an option left out means in this command, where that is not the spec's default."""
    params = [
        _parameter(name, f, type_hints(owner)[f.name], defaults, (default_texts or {}).get(name))
        for name, (owner, f) in keys(cls).items()
        if (only is None or name in only) and name not in skip and f.metadata.get("cli", True)
    ]

    def add(command: F) -> F:
        own = list(inspect.signature(command, eval_str=True).parameters.values())
        first = [p for p in own if p.kind is p.POSITIONAL_OR_KEYWORD]
        last = [p for p in own if p.kind is p.KEYWORD_ONLY]
        command.__signature__ = inspect.Signature([*first, *params, *last])  # type: ignore[attr-defined]
        return command

    return add


def _parameter(name: str, f: Any, hint: Any, defaults: Defaults, said: str | None) -> inspect.Parameter:
    meta = f.metadata
    kind = non_none(hint)
    value = f.default_factory() if f.default_factory is not MISSING else f.default
    said = said or meta.get("default_text")
    text = meta["help"].rstrip(".")
    # the spec's default, where the command line can spell it, is the option's own, shown by typer
    own = defaults == "spec" and said is None and value is not MISSING
    if defaults == "spec" and said is not None:
        text += f" (default: {said})"
    elif defaults != "spec":
        what = said or (None if value in (None, MISSING) else _spelled(name, value))
        text += (
            f" (default: {what}, or the job's)"
            if what and defaults == "spec or job"
            else " (default: the job's)"
        )
    text = f"{text}.".replace("[", "\\[")  # a bracket as typed, never markup
    if meta.get("argument"):
        info: Any = typer.Argument(help=text, show_default=False)
    else:
        flag = name.replace("_", "-")
        # a flag off by default needs no --no- form, save to override a job file's value
        pair = kind is bool and (value is not False or defaults != "spec")
        decls = [f"--{flag}/--no-{flag}"] if pair else [f"--{flag}"]
        info = typer.Option(*decls, help=text, rich_help_panel=meta.get("panel"), show_default=own)
        if typing.get_origin(kind) is list:  # comma-separated
            kind, value = str, ",".join(map(str, value)) if isinstance(value, list) else value
    required = defaults == "spec" and value is MISSING
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        annotation=Annotated[kind if required else kind | None, info],
        default=inspect.Parameter.empty if required else value if own else None,
    )


def _spelled(name: str, value: Any) -> str:
    """A default as the command line spells it (a flag by its name)."""
    if isinstance(value, bool):
        return name.replace("_", "-") if value else f"no-{name.replace('_', '-')}"
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def spec_values(given: dict[str, Any], cls: type) -> dict[str, Any]:
    """The options given (not None) as a job file spells them, a comma-separated list as its items."""
    known, values = keys(cls), {}
    for name, value in given.items():
        if value is None or name not in known:
            continue
        owner, f = known[name]
        kind = non_none(type_hints(owner)[f.name])
        if isinstance(value, str) and typing.get_origin(kind) is list:
            (item,) = typing.get_args(kind)
            try:
                value = [item(x.strip()) for x in value.split(",")]
            except ValueError:
                flag = name.replace("_", "-")
                raise SpecError(
                    f"--{flag}: expected comma-separated {f.metadata['items']}; got {value!r}"
                ) from None
        values[name] = value
    return values
