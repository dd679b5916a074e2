"""The checks of what the tables hold: predictions over every part at once (lazy polars queries),
attention and tokens part by part, and every column's range as ``schemas/`` declares it."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from ... import schema
from ...run import row_range_problems
from .files import Part, RunView
from .report import KEPT, ValidationReport

#: |sum(probs) - 1| allowed: probabilities are a float32 softmax whatever the model's dtype.
PROBS_TOLERANCE = 1e-4
#: |content + [CLS] + [SEP] - 1| allowed: of a float32 softmax (the SDPA capture's, whatever the dtype),
#: and of eager attention in half precision (a rounded softmax) or a dtype not recorded.
FLOAT32_MASS_TOLERANCE, MASS_TOLERANCE = 1e-4, 2e-2
#: |weight_scaled - (w - min)/(max - min)| allowed (both from the stored float32 weights).
SCALED_TOLERANCE = 1e-4
#: |weight_min/max - min/max of the stored weights| allowed (the same float32 numbers when intact).
MINMAX_TOLERANCE = 1e-6
#: How far a review's ALTI values may sum over 1 (float32 rollouts).
ALTI_TOLERANCE = 1e-4

_KEYS = schema.key("head_summary")

Rule = tuple[str, pl.Expr, pl.Expr]  # (check, True where a row breaks it, what to say of such a row)


def fmt(template: str, *args: str | pl.Expr) -> pl.Expr:
    """``pl.format`` where a plain string names a column."""
    return pl.format(template, *(pl.col(a) if isinstance(a, str) else a for a in args))


def r(name: str) -> pl.Expr:
    """A float column rounded to 6 decimals, for a message."""
    return pl.col(name).cast(pl.Float64).round(6)


def apply_rules(rec: ValidationReport, lf: pl.LazyFrame, at: pl.Expr, rules: list[Rule]) -> None:
    """Count the rows breaking each rule in one pass over ``lf``; format messages (``at``: where the row
    is) only for broken rules."""
    flags = [bad.fill_null(False) for _, bad, _ in rules]
    counts = lf.select([f.sum().alias(f"n{i}") for i, f in enumerate(flags)]).collect(engine="streaming")
    for (check, _, say), flag, n in zip(rules, flags, counts.row(0), strict=True):
        if n:
            msg = pl.format("{}: {}", at, say)
            examples = lf.filter(flag).head(KEPT).select(msg).collect(engine="streaming").to_series()
            rec.fail_many(check, int(n), examples.to_list())


def report_rows(rec: ValidationReport, check: str, rows: pl.DataFrame, message: pl.Expr) -> None:
    """Each of ``rows`` a problem of ``check``; the first ``KEPT`` of them said by ``message``."""
    rec.fail_many(check, rows.height, rows.head(KEPT).select(message).to_series().to_list())


def check_predictions(rec: ValidationReport, run: RunView) -> dict[str, int]:
    """row_index, doc_id and predictions checks over every readable predictions part; status counts."""
    parts = [p for p in run.parts if "predictions" in p.readable]
    for problem in row_range_problems(run.parts):
        rec.fail("row_index", problem)  # generation 0 tiles 0..N-1, no generation holds a row twice
    if not parts:
        for check in ("row_index", "doc_id", "predictions"):
            rec.skip(check, "no readable predictions parts")
        return {}
    by_rel = {p.files["predictions"]: p for p in parts}
    lf = pl.scan_parquet([str(run.path / rel) for rel in by_rel], include_file_paths="_file", glob=False)
    lf = lf.with_columns(pl.col("_file").replace_strict({str(run.path / rel): rel for rel in by_rel}))
    statuses = dict(lf.group_by("status").agg(pl.len()).collect(engine="streaming").iter_rows())

    per_file = lf.group_by("_file").agg(
        n=pl.len(),
        lo=pl.col("row_index").min(),
        hi=pl.col("row_index").max(),
        distinct=pl.col("row_index").n_unique(),
    )
    for rel, n, lo, hi, distinct in per_file.collect(engine="streaming").iter_rows():
        p = by_rel[rel]
        good = n == distinct and lo >= p.start_row and hi < p.end_row
        want = f"distinct indices within {p.start_row}..{p.end_row - 1}"
        if p.generation == 0:  # as many distinct indices within its range as it has: each of them
            good &= n == p.end_row - p.start_row
            want = f"each of {p.start_row}..{p.end_row - 1} once"
        if not good:
            rec.fail(
                "row_index",
                f"{rel}: {n} rows, {distinct} distinct row_index in {lo}..{hi}; expected {want}",
            )
    rec.note("row_index", f"{sum(statuses.values())} rows in {len(parts)} parts")

    dups = (
        lf.filter(pl.col("status") == "ok")
        .group_by("doc_id")
        .agg(n=pl.len(), files=pl.col("_file").unique().sort().head(2))
        .filter(pl.col("n") > 1)
        .sort("doc_id")
        .collect(engine="streaming")
    )
    said = fmt("doc '{}' scored {} times ({})", "doc_id", "n", pl.col("files").list.join(", "))
    report_rows(rec, "doc_id", dups, said)
    rec.note("doc_id", f"{statuses.get('ok', 0)} scored reviews")
    apply_rules(rec, lf, where("predictions", "_file"), _prediction_rules(run))
    labels = f", {len(run.id2label)} labels" if run.id2label else ""
    rec.note("predictions", f"{sum(statuses.values())} rows{labels}")
    return statuses


def _prediction_rules(run: RunView) -> list[Rule]:
    ok = pl.col("status") == "ok"
    probs, pred_id, n_tokens = pl.col("probs"), pl.col("pred_id"), pl.col("n_tokens")
    argmax = probs.list.arg_max()
    total = probs.list.sum().cast(pl.Float64)
    predicted = probs.is_not_null() | pred_id.is_not_null() | pl.col("pred_label").is_not_null()
    pred_prob = (pl.col("pred_prob") - probs.list.get(pred_id, null_on_oob=True)).abs()
    top = run.max_length or 2**31 - 1
    bad_argmax = ok & (pred_id.is_null() | (pred_id != argmax))
    bad_length = ok & ~n_tokens.is_between(3, top)
    stray = ~ok & (predicted | pl.col("pred_prob").is_not_null() | (n_tokens != 0))
    rules = [
        (~pl.col("status").is_in(schema.STATUSES), fmt("unknown status '{}'", "status")),
        (ok & probs.is_null(), pl.lit("scored but probs is null")),
        (ok & ~((total - 1).abs() <= PROBS_TOLERANCE), fmt("probs sum to {}", total.round(6))),
        (bad_argmax, fmt("pred_id {} is not the argmax {} of probs", "pred_id", argmax)),
        (bad_length, fmt("scored with n_tokens {}, expected 3..{}", "n_tokens", pl.lit(top))),
        (stray, fmt("status '{}' but a prediction or n_tokens {}", "status", "n_tokens")),
        (ok & ~(pred_prob <= PROBS_TOLERANCE), fmt("pred_prob {} is not probs[pred_id]", r("pred_prob"))),
    ]
    if isinstance(run_id := run.manifest.get("run_id"), str):
        rules.append((pl.col("run_id") != run_id, fmt("run_id '{}' is not the run's", "run_id")))
    if run.id2label:
        n = len(run.id2label)
        label = pred_id.cast(pl.String).replace_strict(run.id2label, default=None, return_dtype=pl.String)
        bad_label = ok & (label.is_null() | (pl.col("pred_label") != label))
        rules += [
            (ok & (probs.list.len() != n), fmt("{} probs for {} labels", probs.list.len(), pl.lit(n))),
            (bad_label, fmt("pred_label '{}' is not id2label[{}]", "pred_label", "pred_id")),
        ]
    return [("predictions", *rule) for rule in rules]


def _mass_tolerance(run: RunView) -> float:
    float32 = run.attention == "sdpa" or run.dtype == "float32"
    return FLOAT32_MASS_TOLERANCE if float32 else MASS_TOLERANCE


def check_attention(rec: ValidationReport, run: RunView) -> None:
    checks = ("layers_heads", "positions", "tokens", "attention_mass", "scaling", "measures")
    if run.layers is None or run.num_heads is None:
        for c in checks:
            rec.skip(c, "the manifest lacks model.layers or model.num_heads")
        return
    parts = [p for p in run.parts if p.readable >= set(schema.TABLES)]
    skipped = len(run.parts) - len(parts)
    found = [_PartCheck(rec, run, part).check() for part in parts]  # heads, distinct (token_id, token)
    if found:
        pairs = pl.concat([spelling for _, spelling in found]).unique()
        rec.note("tokens", f"{pairs.height} distinct tokens")
        clashes = (
            pairs.group_by("token_id")
            .agg(pl.col("token").sort())
            .filter(pl.col("token").list.len() > 1)
            .sort("token_id")
        )
        written = pl.concat_str(pl.lit("'"), pl.col("token").list.join("', '"), pl.lit("'"))
        report_rows(rec, "tokens", clashes, fmt("token id {} is written as {}", "token_id", written))
    tol = _mass_tolerance(run)
    rec.note("layers_heads", f"layers {run.layers} x {run.num_heads} heads")
    rec.note("positions", f"{sum(n for n, _ in found)} (review, layer, head) rows")
    rec.note("attention_mass", f"tolerance {tol:g} ({run.dtype}, {run.attention})")
    rec.note("scaling", f"tolerance {SCALED_TOLERANCE:g}")
    if skipped:
        for c in (*checks, "spans"):
            rec.note(c, f"{skipped} parts with a missing or bad file not checked")


class _PartCheck:
    """One part's tables, read once, and the checks over them, one method per kind."""

    def __init__(self, rec: ValidationReport, run: RunView, part: Part) -> None:
        self.rec, self.run, self.part = rec, run, part
        self.rel_attn, self.rel_sum = part.files["cls_attention"], part.files["head_summary"]
        self.rel_tok = part.files["tokens"]
        pred = pl.read_parquet(
            run.file(part, "predictions"), columns=["doc_id", "status", "n_tokens"], glob=False
        )
        self.scored = pred.filter(pl.col("status") == "ok").select("doc_id", "n_tokens").unique("doc_id")
        self.summary = pl.read_parquet(run.file(part, "head_summary"), glob=False)  # reviews x layers x heads
        self.attn = pl.scan_parquet(run.file(part, "cls_attention"), glob=False)
        self.tokens = pl.scan_parquet(run.file(part, "tokens"), glob=False)
        self.groups = (  # each (review, layer, head) of the attention rows, summed up
            self.attn.group_by(_KEYS)
            .agg(
                n=pl.len(),
                wsum=pl.col("weight").cast(pl.Float64).sum(),
                wmin=pl.col("weight").min(),
                wmax=pl.col("weight").max(),
                pmin=pl.col("position").min(),
                pmax=pl.col("position").max(),
                distinct=pl.col("position").n_unique(),
            )
            .collect(engine="streaming")
        )

    def check(self) -> tuple[int, pl.DataFrame]:
        """Every check of the part; how many heads it checked, and its distinct (token_id, token) pairs,
        which the run's parts must agree on."""
        summary = self.grid()
        self.token_positions()
        self.heads(summary)
        self.rows(summary)
        if "contributions" in self.part.readable:
            self.contributions()
        return summary.height, self.tokens.select("token_id", "token").unique().collect(engine="streaming")

    def grid(self) -> pl.DataFrame:
        """Layers and heads: every scored review has the whole grid, once, in both tables; nothing else
        does. Returns head_summary with each (review, layer, head) once."""
        run = self.run
        layer_ok = pl.col("layer").is_in(run.layers) & pl.col("head").is_between(0, run.num_heads - 1)
        heads = pl.DataFrame({"layer": run.layers, "head": [list(range(run.num_heads))] * len(run.layers)})
        heads = heads.explode("head").cast({"layer": pl.Int16, "head": pl.Int16})
        grid = self.scored.select("doc_id").join(heads, how="cross")
        dup = self.summary.group_by(_KEYS).agg(n=pl.len()).filter(pl.col("n") > 1)
        at_sum = where("head_summary", pl.lit(self.rel_sum))
        report_rows(self.rec, "layers_heads", dup, fmt("{}: {} head_summary rows", at_sum, "n"))
        summary = self.summary.unique(_KEYS, keep="first", maintain_order=True)
        for rel, table in ((self.rel_sum, summary), (self.rel_attn, self.groups)):
            at = where("head_summary", pl.lit(rel))
            wanted = f"layers {run.layers} x heads 0..{run.num_heads - 1}"
            report_rows(
                self.rec, "layers_heads", table.filter(~layer_ok), fmt("{}: not among {}", at, pl.lit(wanted))
            )
            stray = (
                table.filter(layer_ok)
                .join(self.scored, on="doc_id", how="anti")
                .unique("doc_id", maintain_order=True)
            )
            said = fmt("{} doc '{}': not a scored review of this part", pl.lit(rel), "doc_id")
            report_rows(self.rec, "layers_heads", stray, said)
            report_rows(
                self.rec, "layers_heads", grid.join(table, on=_KEYS, how="anti"), fmt("{}: missing", at)
            )
        return summary

    def token_positions(self) -> None:
        """One tokens row for each position the attention rows hold, and no other."""
        at = where("tokens", pl.lit(self.rel_tok))
        # (reviews numbered: keyed by doc_id, a set of positions holds memory in proportion to its length)
        docs = (
            pl.concat([self.attn.select("doc_id"), self.tokens.select("doc_id")])
            .unique()
            .collect(engine="streaming")
            .with_row_index("doc")
        )
        spot = ["doc", "position"]

        def positions(frame: pl.LazyFrame) -> pl.LazyFrame:
            return frame.join(docs.lazy(), on="doc_id").select(*spot)

        def named(frame: pl.DataFrame) -> pl.DataFrame:
            return frame.join(docs, on="doc").sort(schema.key("tokens"))

        written = positions(self.tokens).group_by(spot).agg(n=pl.len()).collect(engine="streaming")
        report_rows(
            self.rec, "tokens", named(written.filter(pl.col("n") > 1)), fmt("{}: written {} times", at, "n")
        )
        held = positions(self.attn).unique().collect(engine="streaming")
        report_rows(
            self.rec, "tokens", named(held.join(written, on=spot, how="anti")), fmt("{}: missing", at)
        )
        said = fmt("{}: no attention rows in {}", at, pl.lit(self.rel_attn))
        report_rows(self.rec, "tokens", named(written.join(held, on=spot, how="anti")), said)

    def heads(self, summary: pl.DataFrame) -> None:
        """Per scored (review, layer, head), its rows summed up beside its head_summary row: positions,
        mass, min/max."""
        tol = _mass_tolerance(self.run)
        n, content = pl.col("n"), pl.col("n_tokens") - 2
        mass = pl.col("wsum") + pl.col("weight_cls").cast(pl.Float64) + pl.col("weight_sep").cast(pl.Float64)
        minmax = ((pl.col("weight_min") - pl.col("wmin")).abs() <= MINMAX_TOLERANCE) & (
            (pl.col("weight_max") - pl.col("wmax")).abs() <= MINMAX_TOLERANCE
        )
        spread = (pl.col("pmin") == 1) & (pl.col("pmax") == content) & (pl.col("distinct") == n)
        rules = [
            (
                "positions",
                ~((n == pl.col("n_content")) & (pl.col("n_content") == content)),
                fmt("{} rows, n_content {}, n_tokens - 2 = {}", "n", "n_content", content),
            ),
            (
                "positions",
                ~spread,
                fmt("positions {}..{} ({} distinct in {} rows), expected 1..{} once each",
                    *("pmin", "pmax", "distinct", "n", content)),
            ),
            (
                "attention_mass",
                ~((mass - 1).abs() <= tol),
                fmt("content {} + [CLS] {} + [SEP] {} = {}, not 1 within {}",
                    *(r("wsum"), r("weight_cls"), r("weight_sep"), mass.round(6), pl.lit(tol))),
            ),
            (
                "scaling",
                ~minmax,
                fmt("weight_min/max {}/{}, but the weights' min/max are {}/{}",
                    *(r("weight_min"), r("weight_max"), r("wmin"), r("wmax"))),
            ),
        ]  # fmt: skip
        heads = self.groups.join(summary, on=_KEYS).join(self.scored, on="doc_id").lazy()
        apply_rules(self.rec, heads, where("head_summary", pl.lit(self.rel_attn)), rules)

    def rows(self, summary: pl.DataFrame) -> None:
        """Per attention row, beside its head's min and max: the scaled weight as the formula gives it,
        value zeroing set exactly where the run asked for it (each column's range is checked by
        :func:`check_ranges`)."""
        lo, hi = pl.col("weight_min").cast(pl.Float64), pl.col("weight_max").cast(pl.Float64)
        expected = pl.when(hi > lo).then((pl.col("weight").cast(pl.Float64) - lo) / (hi - lo)).otherwise(0.0)
        scaled = pl.col("weight_scaled")
        asked = bool(self.run.manifest.get("spec", {}).get("value_zeroing", False))
        off = scaled.is_between(0, 1) & ~((scaled.cast(pl.Float64) - expected).abs() <= SCALED_TOLERANCE)
        rules = [
            ("scaling", off, fmt("weight_scaled {}, but (w - min)/(max - min) = {}", r("weight_scaled"),
                                 expected.round(6))),
            ("measures", pl.col("value_zeroing").is_null() == asked,
             pl.lit(f"value_zeroing is {'null' if asked else 'set'}, "
                    f"but the run {'asked' if asked else 'did not ask'} for it")),
        ]  # fmt: skip
        rows = self.attn.join(summary.lazy().select(*_KEYS, "weight_min", "weight_max"), on=_KEYS, how="left")
        apply_rules(self.rec, rows, where("cls_attention", pl.lit(self.rel_attn)), rules)

    def contributions(self) -> None:
        """ALTI: a value for each token row and none for another position; a review's sum at most 1 (the
        range of each value is :func:`check_ranges`')."""
        alti = pl.scan_parquet(self.run.file(self.part, "contributions"), glob=False)
        key = schema.key("contributions")
        rows = alti.join(
            self.tokens.select(key).with_columns(token=pl.lit(True)), on=key, how="full", coalesce=True
        )
        rules = [
            ("measures", pl.col("alti").is_null(), pl.lit("a token without a contributions row")),
            ("measures", pl.col("token").is_null(), pl.lit("a contributions row without a token")),
        ]
        rel = pl.lit(self.part.files["contributions"])
        apply_rules(self.rec, rows, where("contributions", rel), rules)
        sums = alti.group_by("doc_id").agg(total=pl.col("alti").cast(pl.Float64).sum())
        over = ("measures", pl.col("total") > 1 + ALTI_TOLERANCE, fmt("alti sums to {}, over 1", r("total")))
        apply_rules(self.rec, sums, fmt("{} doc '{}'", rel, "doc_id"), [over])


def check_ranges(rec: ValidationReport, run: RunView) -> None:
    """Every column that ``schemas/`` gives a range keeps it, in every readable file of its table: a
    bound is a number or another column; a float is finite too."""
    for table in run.tables:
        files = {str(run.file(p, table)): p.files[table] for p in run.parts if table in p.readable}
        if not (ranges := schema.ranges(table)) or not files:
            continue
        rules = []
        for column, low, high, check in ranges:
            value = pl.col(column)
            floating = pa.types.is_floating(schema.arrow(table).field(column).type)
            good = value.is_finite() if floating else pl.lit(True)
            for bound, keep in ((low, value.__ge__), (high, value.__le__)):
                if bound is not None:
                    good &= keep(pl.col(bound) if isinstance(bound, str) else bound)
            shown = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
            rules.append((check, ~good, fmt("{} {} outside {}", pl.lit(column), column, pl.lit(shown))))
        lf = pl.scan_parquet(list(files), include_file_paths="_file", glob=False)
        apply_rules(rec, lf.with_columns(pl.col("_file").replace_strict(files)), where(table, "_file"), rules)


def where(table: str, file: str | pl.Expr) -> pl.Expr:
    """Where a row of ``table`` is, for a message: its file, then its key (``schemas/``)."""
    key = schema.key(table)
    return fmt(" ".join(["{}", *("doc '{}'" if k == "doc_id" else f"{k} {{}}" for k in key)]), file, *key)
