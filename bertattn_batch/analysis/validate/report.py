"""What ``bertattn validate`` reports: the checks, their findings, and the text it prints."""

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
    "inputs": "every input row (within the run's limit) has a predictions row; the inputs are the files read",
    "doc_id": "doc ids unique among scored reviews",
    "predictions": "statuses known; probs sum to 1 and pred_id is their argmax when scored, null if not",
    "layers_heads": "every scored review has each manifest layer x heads 0..H-1 once, no other review any",
    "positions": "each head covers positions 1..n-2 once; rows = n_content = n_tokens - 2",
    "tokens": "a review's position has one token id, token and span in all its layers and heads; "
    "a token id one token",
    "attention_mass": "per head: content weights + [CLS] + [SEP] = 1, every weight in [0, 1]",
    "scaling": "weight_scaled in [0, 1] and = (w - min)/(max - min), 0 with no range; min/max of the weights",
    "measures": "weight_norm finite and >= 0; value_zeroing in [0, 2], set exactly when the run asked for it",
    "spans": "0 <= start <= end <= the review text's length",
}


#: Examples shown per check in the report.
SHOWN = 3
#: Problems kept per check in ``ValidationReport`` (the counts stay exact).
KEPT = 20


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a run (``severity`` 'problem') or worth knowing (``severity`` 'warning')."""

    check: str
    message: str
    severity: str = "problem"


@dataclass
class Check:
    """One check's outcome; ``problems``/``warnings`` are exact counts, ``examples`` the first few."""

    name: str
    description: str
    problems: int = 0
    warnings: int = 0
    examples: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None

    @property
    def status(self) -> str:
        if self.problems:
            return "FAIL"
        if self.skipped:
            return "SKIP"
        return "WARN" if self.warnings else "ok"

    def line(self) -> str:
        parts = []
        if self.problems:
            parts.append(f"{self.problems} problem{'s' if self.problems != 1 else ''}")
        if self.warnings:
            parts.append(f"{self.warnings} warning{'s' if self.warnings != 1 else ''}")
        if self.skipped:
            parts.append(f"skipped: {self.skipped}")
        parts.extend(self.notes)
        return f"{self.status:<4}  {self.name:<14}  {'; '.join(parts) or self.description}"


@dataclass
class ValidationReport:
    """Every check run over a run directory, and the problems and warnings they found."""

    run_dir: str
    checks: list[Check]
    problems: list[Problem]
    warnings: list[Problem]
    header: str = ""

    @property
    def ok(self) -> bool:
        return not any(c.problems for c in self.checks)

    @property
    def problem_count(self) -> int:
        return sum(c.problems for c in self.checks)

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    def render(self) -> str:
        lines = [self.header or self.run_dir]
        for c in self.checks:
            lines.append(c.line())
            for ex in c.examples[:SHOWN]:
                lines.append(f"        - {ex}")
            hidden = c.problems + c.warnings - min(len(c.examples), SHOWN)
            if c.examples and hidden > 0:
                lines.append(f"        ... and {hidden} more")
        if self.ok:
            n_warn = sum(c.warnings for c in self.checks)
            n_skip = sum(1 for c in self.checks if c.skipped)
            lines.append(
                f"clean: {len(self.checks) - n_skip} checks passed"
                + (f", {n_skip} skipped" if n_skip else "")
                + (f", {n_warn} warnings" if n_warn else "")
            )
        else:
            failed = sum(1 for c in self.checks if c.problems)
            problems = "1 problem" if self.problem_count == 1 else f"{self.problem_count} problems"
            lines.append(f"damaged: {problems} in {failed} of {len(self.checks)} checks")
        return "\n".join(lines)


class Recorder:
    """Collects findings per check; keeps exact counts and the first few messages."""

    def __init__(self) -> None:
        self.checks = {name: Check(name, desc) for name, desc in CHECKS.items()}
        self.problems: list[Problem] = []
        self.warnings: list[Problem] = []

    def fail(self, check: str, message: str) -> None:
        self.fail_many(check, 1, [message])

    def fail_many(self, check: str, count: int, examples: Iterable[str]) -> None:
        if count <= 0:
            return
        c = self.checks[check]
        kept = sum(1 for p in self.problems if p.check == check)
        for msg in list(examples)[: max(0, KEPT - kept)]:
            self.problems.append(Problem(check, msg))
            if len(c.examples) < KEPT:
                c.examples.append(msg)
        c.problems += count

    def warn(self, check: str, message: str) -> None:
        c = self.checks[check]
        c.warnings += 1
        if sum(1 for p in self.warnings if p.check == check) < KEPT:
            self.warnings.append(Problem(check, message, "warning"))
            c.examples.append(f"warning: {message}")

    def note(self, check: str, text: str) -> None:
        self.checks[check].notes.append(text)

    def skip(self, check: str, reason: str) -> None:
        self.checks[check].skipped = reason
