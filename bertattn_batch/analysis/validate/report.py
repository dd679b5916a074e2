"""What ``bertattn validate`` reports: the checks, what each found, and the text it prints."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

#: The checks, in report order, with what each one promises.
CHECKS = {
    "manifest": "manifest readable, same format and schema versions, run complete",
    "files": "every listed part exists; no unlisted part files, no leftovers",
    "schema": "every part's columns, types, table and version equal schemas/, no nulls where none may be",
    "counts": "rows of every part and the run's totals equal the manifest's",
    "row_index": "every input row once: parts cover their row ranges, generation 0 covers 0..N-1",
    "inputs": "every input row (within the run's limit) has a predictions row with its id, label and "
    "text, and the run no review the inputs lack; the inputs are the files read",
    "doc_id": "doc ids unique among scored reviews",
    "predictions": "statuses known; probs sum to 1 and pred_id is their argmax when scored, null if not",
    "layers_heads": "every scored review has each manifest layer x heads 0..H-1 once, no other review any",
    "positions": "each head covers positions 1..n-2 once; rows = n_content = n_tokens - 2",
    "tokens": "a review's position has one token id, token and span in all its layers and heads; "
    "a token id one token",
    "attention_mass": "per head: content weights + [CLS] + [SEP] = 1, every weight in [0, 1]",
    "scaling": (
        "weight_scaled in [0, 1] and = (w - min)/(max - min), 0 with no range; min/max of the weights"
    ),
    "measures": "weight_norm finite and >= 0; value_zeroing in [0, 2], "
    "set exactly when the run asked for it; "
    "alti in [0, 1] for each token once, a review's sum at most 1",
    "spans": "0 <= start <= end <= the review text's length",
}
#: Examples shown per check in the printed report.
SHOWN = 3
#: Problems and warnings kept per check (the counts stay exact).
KEPT = 20


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a run (``severity`` 'problem') or worth knowing ('warning')."""

    check: str
    message: str
    severity: str = "problem"


@dataclass
class Check:
    """One check's outcome: exact counts, the first ``KEPT`` problems and warnings, notes, or why it was
    skipped."""

    name: str
    description: str
    problems: int = 0
    warnings: int = 0
    found: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None

    @property
    def status(self) -> str:
        return "FAIL" if self.problems else "SKIP" if self.skipped else "WARN" if self.warnings else "ok"

    def line(self) -> str:
        said = [
            f"{n} {what}{'s' * (n != 1)}"
            for n, what in ((self.problems, "problem"), (self.warnings, "warning"))
            if n
        ]
        said += [f"skipped: {self.skipped}"] if self.skipped else []
        return f"{self.status:<4}  {self.name:<14}  {'; '.join(said + self.notes) or self.description}"


@dataclass
class ValidationReport:
    """Every check run over a run directory and what it found; the checks record into it as they run."""

    run_dir: str
    checks: list[Check] = field(default_factory=lambda: [Check(n, d) for n, d in CHECKS.items()])
    header: str = ""

    @property
    def problems(self) -> list[Problem]:
        return [p for c in self.checks for p in c.found if p.severity == "problem"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for c in self.checks for p in c.found if p.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not any(c.problems for c in self.checks)

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    def fail(self, check: str, message: str) -> None:
        self.fail_many(check, 1, [message])

    def fail_many(self, check: str, count: int, examples: Iterable[str]) -> None:
        """``count`` problems of ``check``, of which the first of ``examples`` are kept."""
        c = self.check(check)
        if count > 0:
            kept = sum(p.severity == "problem" for p in c.found)
            c.found += [Problem(check, m) for m in list(examples)[: max(0, KEPT - kept)]]
            c.problems += count

    def warn(self, check: str, message: str) -> None:
        c = self.check(check)
        c.warnings += 1
        if c.warnings <= KEPT:
            c.found.append(Problem(check, message, "warning"))

    def note(self, check: str, text: str) -> None:
        self.check(check).notes.append(text)

    def skip(self, check: str, reason: str) -> None:
        self.check(check).skipped = reason

    def render(self) -> str:
        lines = [self.header or self.run_dir]
        for c in self.checks:
            shown = [f"{'warning: ' * (p.severity == 'warning')}{p.message}" for p in c.found[:SHOWN]]
            lines += [c.line(), *(f"        - {ex}" for ex in shown)]
            if shown and c.problems + c.warnings > len(shown):
                lines.append(f"        ... and {c.problems + c.warnings - len(shown)} more")
        n, failed = sum(c.problems for c in self.checks), sum(bool(c.problems) for c in self.checks)
        if not self.ok:
            return "\n".join(
                [*lines, f"damaged: {n} problem{'s' * (n != 1)} in {failed} of {len(self.checks)} checks"]
            )
        n_warn, n_skip = sum(c.warnings for c in self.checks), sum(bool(c.skipped) for c in self.checks)
        skipped, warned = f", {n_skip} skipped" * bool(n_skip), f", {n_warn} warnings" * bool(n_warn)
        return "\n".join([*lines, f"clean: {len(self.checks) - n_skip} checks passed{skipped}{warned}"])
