"""The commands that run jobs: ``extract`` and ``run``."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ..config import (
    ATTENTION_MODES,
    DEVICES_HELP,
    DTYPES,
    ON_EXISTING,
    JobSpec,
    from_dict,
    load_job,
)
from ..errors import SpecError, WriteError
from .base import Debug, app, call, setup


def _show_progress(spec: JobSpec) -> bool:
    return spec.progress and sys.stderr.isatty()


def _layers(value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(x) for x in value.replace(" ", "").split(",")]  # an empty entry is a typo too
    except ValueError:
        raise SpecError(
            f"--layers: expected comma-separated layer indices such as -2 or -2,-1; got {value!r}"
        ) from None


def _on_existing(on_existing: str | None, overwrite: bool, incremental: bool) -> str | None:
    """One answer to "what of an existing run?": the flags are shorthands that must not contradict."""
    flags = (on_existing, "overwrite" if overwrite else None, "incremental" if incremental else None)
    asked = {v for v in flags if v is not None}
    if len(asked) > 1:
        raise SpecError(f"options for an existing run disagree: {', '.join(sorted(asked))}")
    return asked.pop() if asked else None


def resume_hint(on_existing: str) -> str:
    """How to go on after an interruption or a failed write. Why: with ``overwrite`` the same command
    starts the run over, and with ``new`` it refuses the run it left."""
    if on_existing in ("resume", "incremental"):
        return "rerun the same command to resume"
    if on_existing == "overwrite":
        return (
            'to resume, rerun without --overwrite (or on_existing = "overwrite" in the job): as it is, '
            "the same command starts the run over"
        )
    return (
        f'to resume, rerun with --on-existing resume (or on_existing = "resume" in the job): with '
        f"{on_existing!r} the same command refuses a run that holds parts"
    )


def _run(spec: JobSpec) -> None:
    from ..engines import run_job

    hint = resume_hint(spec.on_existing)

    def job():
        try:
            return run_job(spec, progress=_show_progress(spec))
        except WriteError as e:  # a full disk, a permission: what was committed is kept
            raise WriteError(f"{e}; what was committed is kept: once that is fixed, {hint}") from e

    summary = call(job, interrupted=f"interrupted; {hint}", completes=True)
    typer.echo(summary.line())
    if summary.input_rows == 0:
        done = summary.skipped_committed > 0
        if done and spec.limit is not None:  # a limit takes the first rows, not the first new ones
            typer.echo(
                f"nothing new among the first {spec.limit:,} input rows (--limit); rows past them are not read"
            )
        elif done:
            typer.echo(f"nothing new to process; {spec.out} is up to date")
        else:
            typer.echo("--limit 0 reads no rows" if spec.limit == 0 else "the input holds no rows")


Overwrite = Annotated[
    bool, typer.Option("--overwrite", help="Replace an existing run in --out.", rich_help_panel="Output")
]


Incremental = Annotated[
    bool,
    typer.Option(
        "--incremental",
        help="Process only reviews whose ids are not yet in the run; append.",
        rich_help_panel="Output",
    ),
]


@app.command()
def extract(
    ctx: typer.Context,
    inputs: Annotated[
        list[str],
        typer.Argument(
            help=(
                "Parquet, JSONL, CSV/TSV, text files (also compressed: .gz, .bz2, .zst, .lz4, .xz), "
                "globs, folders, or a saved datasets folder."
            )
        ),
    ],
    model: Annotated[
        str, typer.Option(help="A local model folder or hub name of a BERT-family sequence classifier.")
    ],
    out: Annotated[str, typer.Option(help="Run directory to write (resumed if it holds this job's run).")],
    text_col: Annotated[
        str, typer.Option(rich_help_panel="Inputs", help="Column holding the review text.")
    ] = "text",
    id_col: Annotated[
        str | None,
        typer.Option(rich_help_panel="Inputs", help="Column holding review ids (default: row number)."),
    ] = None,
    label_col: Annotated[
        str | None,
        typer.Option(rich_help_panel="Inputs", help="Column holding a known label, copied to predictions."),
    ] = None,
    input_format: Annotated[
        str, typer.Option(rich_help_panel="Inputs", help="auto, parquet, jsonl, csv, tsv, text or datasets.")
    ] = "auto",
    layers: Annotated[
        str,
        typer.Option(
            rich_help_panel="Model", help="Comma-separated layer indices; negative counts from the end."
        ),
    ] = "-2",
    max_length: Annotated[
        int | None,
        typer.Option(
            rich_help_panel="Model",
            help="Truncate reviews to this many tokens, [CLS] and [SEP] included (default: the tokenizer's "
            "model_max_length; at most the model's positions).",
        ),
    ] = None,
    device: Annotated[
        str,
        typer.Option(
            rich_help_panel="Model", help=f"{DEVICES_HELP}; auto is cuda where there is one, else cpu."
        ),
    ] = "auto",
    dtype: Annotated[
        str,
        typer.Option(
            rich_help_panel="Model",
            help=f"{', '.join(DTYPES)}; auto is bfloat16 on CUDA (float16 where the GPU lacks it), float32 elsewhere.",
        ),
    ] = "auto",
    attention: Annotated[
        str,
        typer.Option(
            rich_help_panel="Model",
            help=f"{' or '.join(ATTENTION_MODES)}: sdpa computes the [CLS] row from q/k (fast); eager is transformers' output_attentions (reference).",
        ),
    ] = "sdpa",
    trim_last_layer: Annotated[
        bool,
        typer.Option(
            rich_help_panel="Model",
            help="sdpa: run the last layer's attention and feed-forward block for [CLS] only, which is all a classifier reads (same outputs, checked on load; less work).",
        ),
    ] = True,
    compile: Annotated[
        bool,
        typer.Option(
            "--compile",
            rich_help_panel="Model",
            help="torch.compile the model: one graph for every batch shape, checked against eager on load. A little faster (5 to 13% on a CPU); compiling takes 10 to 25 s and a C++ compiler, so it pays on long jobs only. See docs/performance.md.",
        ),
    ] = False,
    batch_tokens: Annotated[
        int | None,
        typer.Option(
            rich_help_panel="Batches",
            help="Padded tokens per model batch (default: 16384 on a CPU, 65536 on a GPU, which wants big batches).",
            show_default=False,
        ),
    ] = None,
    max_batch_size: Annotated[
        int | None,
        typer.Option(
            rich_help_panel="Batches",
            help="Reviews per model batch at most (default: 256 on a CPU, 1024 on a GPU).",
            show_default=False,
        ),
    ] = None,
    window: Annotated[
        int, typer.Option(rich_help_panel="Batches", help="Rows per bucketing window and per Parquet part.")
    ] = 4096,
    store_text: Annotated[
        bool,
        typer.Option(
            rich_help_panel="Output",
            help="Keep each review's text in predictions (--no-store-text leaves it out: validate's span "
            "check then reads it again from the run's inputs).",
        ),
    ] = True,
    value_zeroing: Annotated[
        bool,
        typer.Option(
            rich_help_panel="Output",
            help="Also write value zeroing (cls_attention.value_zeroing): how far each token's values move the layer's [CLS] output (Mohebbi et al., 2023); costs model time, see docs/measures.md.",
        ),
    ] = False,
    limit: Annotated[
        int | None,
        typer.Option(
            rich_help_panel="Inputs",
            help="Score only the first N rows (a job's finetune table still trains its model on all of them).",
        ),
    ] = None,
    encoding: Annotated[
        str,
        typer.Option(
            rich_help_panel="Inputs",
            help="Text encoding of CSV, TSV, JSON lines and text inputs (gb18030 for what Chinese Excel saves).",
        ),
    ] = "utf-8",
    delimiter: Annotated[
        str | None,
        typer.Option(
            rich_help_panel="Inputs", help="Field delimiter of CSV/TSV inputs, e.g. ';' or '\\t' (a tab)."
        ),
    ] = None,
    on_existing: Annotated[
        str | None,
        typer.Option(
            rich_help_panel="Output",
            help=f"What to do when --out holds a run: {', '.join(ON_EXISTING)} (default resume).",
        ),
    ] = None,
    overwrite: Overwrite = False,
    incremental: Incremental = False,
    unsafe_store_commits: Annotated[
        bool,
        typer.Option(
            rich_help_panel="Output",
            help="Write a run on a store without conditional writes (gs://, hdfs://): a writer paused past "
            "its lease could then overwrite the run another took over (docs/storage.md).",
        ),
    ] = False,
    trust_remote_code: Annotated[
        bool,
        typer.Option(
            rich_help_panel="Model", help="Allow the model folder's own Python code to run (off by default)."
        ),
    ] = False,
    allow_pickle: Annotated[
        bool,
        typer.Option(
            rich_help_panel="Model", help="Allow pickle (*.bin) weights, loaded with weights_only=True."
        ),
    ] = False,
    progress: Annotated[
        bool, typer.Option(rich_help_panel="Output", help="Show a progress bar on a terminal.")
    ] = True,
    engine: Annotated[
        str,
        typer.Option(
            rich_help_panel="Engine",
            help="local (this process) or ray (Ray actors, one model each; pip install '.\\[ray]').",
        ),
    ] = "local",
    workers: Annotated[
        int,
        typer.Option(
            rich_help_panel="Engine",
            help="Model workers of --engine ray (one GPU each where there are GPUs).",
        ),
    ] = 1,
    ray_address: Annotated[
        str | None,
        typer.Option(
            rich_help_panel="Engine", help="Ray cluster to join (default: RAY_ADDRESS, else a local runtime)."
        ),
    ] = None,
    host_processes: Annotated[
        int | None,
        typer.Option(
            rich_help_panel="Engine",
            help="Processes that encode, extract and write beside the model (--engine local); 0: threads. Default: threads on the CPU or below three cores, else one per core but the model's own. See docs/performance.md.",
            show_default=False,
        ),
    ] = None,
    debug: Debug = False,
) -> None:
    """Score reviews and write predictions and per-head [CLS] attention to a run directory.

    Examples:

    bertattn extract reviews.parquet --model models/zh-senti --out runs/r1 --id-col doc_id

    cat reviews.jsonl | bertattn extract - --input-format jsonl --model M --out runs/r2

    bertattn extract reviews/ --model M --out runs/r1 --incremental   (a nightly run: new ids only)
    """
    setup(debug)
    _run(call(lambda: job_from_options(ctx.params)))


#: extract's options that are no JobSpec key: shorthands of on_existing, and the CLI's own.
CLI_ONLY_OPTIONS = ("overwrite", "incremental", "debug")


def job_from_options(params: dict[str, Any]) -> JobSpec:
    """The JobSpec that ``extract``'s options describe: each option is the spec key of its name."""
    keys = {f.name for f in dataclasses.fields(JobSpec)}
    data = {k: v for k, v in params.items() if k in keys and v is not None}
    data["inputs"] = list(params["inputs"])
    data["layers"] = _layers(params["layers"])
    data["on_existing"] = (
        _on_existing(params["on_existing"], params["overwrite"], params["incremental"]) or "resume"
    )
    return from_dict(JobSpec, data)


@app.command()
def run(
    job: Annotated[
        Path,
        typer.Argument(
            help="A TOML job spec (see jobs/): a key per extract option (on_existing for --overwrite)."
        ),
    ],
    out: Annotated[str | None, typer.Option(help="Override the spec's out.")] = None,
    limit: Annotated[int | None, typer.Option(help="Override the spec's limit.")] = None,
    device: Annotated[str | None, typer.Option(help="Override the spec's device.")] = None,
    dtype: Annotated[str | None, typer.Option(help="Override the spec's dtype.")] = None,
    engine: Annotated[str | None, typer.Option(help="Override the spec's engine: local or ray.")] = None,
    workers: Annotated[int | None, typer.Option(help="Override the spec's workers (--engine ray).")] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(help="Override the spec's ray_address: the Ray cluster to join (--engine ray)."),
    ] = None,
    value_zeroing: Annotated[
        bool | None,
        typer.Option(
            "--value-zeroing/--no-value-zeroing",
            help="Override the spec's value_zeroing (cls_attention.value_zeroing, docs/measures.md).",
            show_default=False,
        ),
    ] = None,
    compile: Annotated[
        bool | None,
        typer.Option(
            "--compile/--no-compile",
            help="Override the spec's compile (torch.compile of the model, docs/performance.md).",
            show_default=False,
        ),
    ] = None,
    overwrite: Overwrite = False,
    incremental: Incremental = False,
    debug: Debug = False,
) -> None:
    """Run the job a TOML spec describes (training its model first when the spec says how).

    Examples:

    bertattn run jobs/default.toml

    bertattn run jobs/default.toml --incremental --out runs/nightly   (new ids only, appended)
    """
    setup(debug)
    spec = call(
        lambda: load_job(
            job,
            out=out,
            limit=limit,
            device=device,
            dtype=dtype,
            engine=engine,
            workers=workers,
            ray_address=ray_address,
            value_zeroing=value_zeroing,
            compile=compile,
            on_existing=_on_existing(None, overwrite, incremental),
        )
    )
    _run(spec)
