"""The commands that read a run: ``validate``, ``aggregate``, ``reviews``, ``faithfulness``, ``plot``,
``report``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ..config import JobSpec
from ..errors import StorageError
from ..storage import normalize
from .base import REDONE, Debug, app, call, setup
from .options import spec_options


def _run_location(value: str | None) -> str | None:
    """A ``file://`` URI as the path it names; a store's URI as it is; one naming no bucket, a usage
    error."""
    try:
        return None if value is None else normalize(value)
    except StorageError as e:
        raise typer.BadParameter(str(e)) from None


# fmt: off
#: A run as every command names it: a local folder, or a store's URI (credentials from the environment).
RunDir = Annotated[str, typer.Argument(
    help="A run directory (holding manifest.json): a path, or an s3://, gs:// or hdfs:// URI.",
    callback=_run_location)]
#: Options of the commands that read a head's rows: which layer and head.
Layer = Annotated[int | None, typer.Option(
    help="Only this layer; negative counts from the end (default: every layer of the run).")]
Head = Annotated[int | None, typer.Option(help="Only this head (0-based).")]
Out = Annotated[Path | None, typer.Option(help="Also write the rows asked for as .csv, .xlsx or .parquet.")]
#: The layer a command shows, the run's first by default.
FirstLayer = Annotated[int | None, typer.Option(
    help="Layer to show; negative counts from the end (default: the run's first).")]
# fmt: on


@app.command()
def validate(
    run_dir: RunDir,
    source: Annotated[
        bool, typer.Option("--source/--no-source", help="Re-read the inputs to check spans against texts.")
    ] = True,
    debug: Debug = False,
) -> None:
    """Check a run against schemas/ and its manifest; print one line per check, exit 1 on any problem.

    Example: bertattn validate runs/default
    """
    setup(debug)
    from ..analysis.validate import validate_run

    report = call(lambda: validate_run(run_dir, check_source=source), completes=True)
    typer.echo(report.render())
    if not report.ok:
        raise typer.Exit(1)


# fmt: off
@app.command()
@spec_options(JobSpec, only=("words", "user_dict"), defaults="job")
def aggregate(
    run_dir: RunDir,
    min_reviews: Annotated[int, typer.Option(
        help="Keep tokens seen in at least this many reviews of a group.")] = 5,
    rank_by: Annotated[str, typer.Option(
        help="log_odds_z or log_odds (what a head attends to more in one label than in the others: a rare "
        "token cannot top it), mean_scaled, mean_scaled_shrunk (rare tokens pulled to the head's mean), "
        "mean_weight, mean_norm (norm-based), top_share, n_top or n_reviews.")] = "log_odds_z",
    top_k: Annotated[int, typer.Option(help="Tokens per head in the printed table.")] = 5,
    unit: Annotated[str, typer.Option(help="Print tokens or words.")] = "token",
    by: Annotated[str | None, typer.Option(show_default=False, help="Print for all reviews, by pred_label "
                  "or by label \\[default: all; pred_label for a log-odds --rank-by].")] = None,
    layer: Layer = None, head: Head = None, out: Out = None, *, debug: Debug = False, **words: str | None,
) -> None:
    # fmt: on
    """Token influence by head: write RUN/aggregates/token_influence.parquet and print the top tokens.

    Examples:

    bertattn aggregate runs/default   # what each head attends to more in one predicted label

    bertattn aggregate runs/default --rank-by mean_scaled --unit word --top-k 8

    bertattn aggregate runs/default --by label --layer -2 --head 1 --out head1.xlsx
    """
    setup(debug)
    from ..analysis import aggregate as agg
    from ..run import read_manifest

    if by is None:
        by = "pred_label" if rank_by in agg.CONTRASTS else "all"
    call(lambda: agg.check_top_options(top_k, unit, by, rank_by))
    if out is not None:
        call(lambda: agg.export_path(out, run_dir=run_dir))  # before the work
    if layer is not None or head is not None or unit == "word":  # checked before the work, from one read
        manifest = call(lambda: read_manifest(run_dir))
    if unit == "word":
        call(lambda: agg.check_word_unit(manifest, **words))
    layers = None if layer is None else [call(lambda: agg.run_layer(manifest, layer))]
    if head is not None:
        call(lambda: agg.check_head(manifest, head))

    result = call(lambda: agg.aggregate(run_dir, min_reviews=min_reviews, rank_by=rank_by, **words), REDONE,
                  completes=True)  # fmt: skip
    heads = None if head is None else [head]
    shown = dict(units=result.options.get("units"), groups=result.groups, num_layers=result.num_layers,
                 byte_level=result.byte_level, heads=heads)  # fmt: skip
    typer.echo(call(lambda: agg.format_top(result.table, top_k, unit, by, layers, rank_by, **shown)))
    typer.echo(result.line())
    if out is not None:
        rows = agg.view(result.table, unit, by, layers, rank_by, heads)
        typer.echo(f"wrote {call(lambda: agg.export(rows, out))} ({rows.height} rows)")


# fmt: off
@app.command()
@spec_options(JobSpec, only=("words", "user_dict"), defaults="job")
def reviews(
    run_dir: RunDir,
    head: Annotated[int, typer.Option(help="The head (0-based).")],
    token: Annotated[str | None, typer.Option(
        help="The token, as the run's tokens spell it or as aggregate prints it.")] = None,
    word: Annotated[str | None, typer.Option(help="The word (instead of --token).")] = None,
    layer: FirstLayer = None,
    top: Annotated[int, typer.Option(help="Reviews to show.")] = 10,
    out: Out = None, *, debug: Debug = False, **words: str | None,
) -> None:
    # fmt: on
    """The reviews where a head attends most to a token or word, by raw weight.

    Each comes with its text, its prediction and the plot command that draws it.

    Examples:

    bertattn reviews runs/default --head 1 --token 差

    bertattn reviews runs/default --head 1 --word 差评 --top 20 --out 差评.xlsx
    """
    setup(debug)
    from ..analysis.aggregate import export, export_path, format_reviews, top_reviews
    from ..errors import SpecError
    from ..run import read_manifest

    def find() -> str:
        if (token is None) == (word is None):
            raise SpecError("give one of --token and --word")
        if out is not None:
            export_path(out, run_dir=run_dir)  # before the work
        unit, term = ("token", token) if word is None else ("word", word)
        found = top_reviews(run_dir, term, head, layer, unit, top, **words)
        shown = format_reviews(found, run_dir, term, unit, read_manifest(run_dir).num_layers)
        return shown if out is None else f"{shown}\nwrote {export(found, out)} ({found.height} rows)"

    typer.echo(call(find, completes=True))


# fmt: off
@app.command()
@spec_options(JobSpec, only=("trust_remote_code", "allow_pickle"))
def faithfulness(
    run_dir: RunDir,
    sample: Annotated[int, typer.Option(
        help="Reviews to measure on, stratified by predicted label (all where fewer).")] = 200,
    seed: Annotated[int, typer.Option(help="Seed of the sample and of the random ranking.")] = 0,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    model: Annotated[str | None, typer.Option(
        help="The run's model, where it is not where the run recorded it (moved, another machine).")] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar on a terminal.")] = True,
    *, debug: Debug = False, **trust: bool,
) -> None:
    # fmt: on
    """Which heads' attention tracks what moves the prediction.

    Writes RUN/faithfulness/head_faithfulness.parquet. Deletes the tokens each head ranks highest (1 to
    50% of a review) and measures how much the prediction's probability drops (comprehensiveness) and how
    much of it the tokens keep alone (sufficiency), against random tokens and gradient × input. See
    docs/measures.md.

    Examples:

    bertattn faithfulness runs/default

    bertattn faithfulness runs/default --sample 1000 --seed 1
    """
    setup(debug, loads_model=True)
    from ..analysis.faithfulness import faithfulness as measure

    options = dict(
        sample=sample, seed=seed, device=device, progress=progress and sys.stderr.isatty(), model=model
    )
    typer.echo(call(lambda: measure(run_dir, **options, **trust), REDONE, completes=True).summary())


# fmt: off
@app.command()
@spec_options(JobSpec, only=("trust_remote_code", "allow_pickle"))
@spec_options(JobSpec, only=("words", "user_dict"), defaults="job")
def plot(
    run_dir: Annotated[str | None, typer.Argument(
        help="A run directory (or a store's URI); omit it to plot --text through --model.",
        callback=_run_location)] = None,
    out: Annotated[Path, typer.Option(help="What to write: a picture (.png, or .html: self-contained), or "
                                      "the heads x tokens table (.csv, .xlsx).")] = Path("review.png"),
    doc_id: Annotated[str | None, typer.Option(
        help="Id of the review in the run (with --text: a name for the title).")] = None,
    text: Annotated[str | None, typer.Option(
        help="A review text (with --model, or the run's review's text).")] = None,
    text_file: Annotated[Path | None, typer.Option(
        help="A file holding the review text, UTF-8: no-break spaces and line breaks kept.")] = None,
    model: Annotated[str | None, typer.Option(
        help="Model folder (default for a run: the run's model).")] = None,
    layer: Annotated[int | None, typer.Option(
        help="Layer to show; negative counts from the end (default: the run's first; -2 for --text)."),
    ] = None,
    pairs: Annotated[bool, typer.Option(
        "--pairs", help="Token x token maps per head (computed with eager attention).")] = False,
    tokens: Annotated[str | None, typer.Option(
        help="Only these content tokens (long reviews), as a Python range counted from 0 at the first "
        "after [CLS]: 0:40 shows the tables' positions 1 to 40.")] = None,
    specials: Annotated[bool, typer.Option(
        help="[CLS] and [SEP] in the token x token maps (--no-specials leaves them out).")] = True,
    device: Annotated[str, typer.Option(help="Device for the model, when one is needed.")] = "cpu",
    unit: Annotated[str, typer.Option(help="Draw tokens or words.")] = "token",
    *, debug: Debug = False, **options: Any,
) -> None:
    # fmt: on
    """Heatmaps of one review: heads x tokens of the scaled [CLS] row, and token x token with --pairs.

    Examples:

    bertattn plot runs/default --doc-id neg-00017 --out review.png

    bertattn plot runs/default --doc-id neg-00017 --out review.html --pairs

    bertattn plot --text "上菜慢，服务态度差" --model models/zh-senti --out seed.png --unit word

    bertattn plot --text-file review.txt --model models/zh-senti --out review.png
    """
    setup(debug)
    from ..render.plot import output_path, review_for_plot, write_review

    def plot_to_file() -> Path:
        output_path(out, pairs)  # before any model loads
        options.update(text=text, text_file=text_file, model=model, layer=layer, device=device, unit=unit)
        review = review_for_plot(run_dir, doc_id, pairs=pairs, tokens=tokens, specials=specials, **options)
        return write_review(review, out, pairs=pairs)

    typer.echo(f"wrote {call(plot_to_file, REDONE, completes=True)}")


# fmt: off
@app.command()
@spec_options(JobSpec, only=("label_map",), default_texts={"label_map": "the run's job's"})
def report(
    run_dir: RunDir,
    out: Annotated[Path | None, typer.Option(help="HTML file to write (default: RUN/report.html).")] = None,
    layer: FirstLayer = None,
    examples: Annotated[int, typer.Option(
        help="Example reviews per predicted label, and misclassified ones shown.")] = 3,
    top_k: Annotated[int, typer.Option(help="Top tokens per head.")] = 8,
    min_reviews: Annotated[int | None, typer.Option(help="min-reviews for aggregates computed on the way "
        "(default: the run's aggregates' own, else 5); they keep their --rank-by.")] = None,
    *, debug: Debug = False, **given: str | None,
) -> None:
    # fmt: on
    """One self-contained HTML page: the run's summary, accuracy, top tokens per head, example heatmaps.

    Examples:

    bertattn report runs/default   (writes runs/default/report.html)

    bertattn report runs/stars --label-map "1,2=negative; 4,5=positive"   (star labels as the model's)
    """
    setup(debug)
    from ..render.report import build_report

    options = dict(layer=layer, examples=examples, top_k=top_k, min_reviews=min_reviews, **given)
    typer.echo(f"wrote {call(lambda: build_report(run_dir, out=out, **options), REDONE, completes=True)}")
