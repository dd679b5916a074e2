"""``python -m bertattn_batch`` and the ``bertattn`` command: signals are handled from the first moment,
before the command's libraries load (a scheduler may stop a job while it is still starting)."""

from __future__ import annotations


def main() -> None:
    import os
    import signal
    import sys

    def starting(signum: int, frame: object) -> None:
        print("interrupted", file=sys.stderr)
        raise SystemExit(128 + signum)

    from .errors import signals_to_handle  # signals only: the command's libraries load after

    for sig in signals_to_handle():
        signal.signal(sig, starting)
    if not os.environ.get("COLUMNS", "1").isdigit() or os.environ.get("COLUMNS") == "0":
        del os.environ["COLUMNS"]  # COLUMNS=0 made the help and usage errors print nothing at all
    from .cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
