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

    for name in ("SIGTERM", "SIGINT", "SIGHUP"):  # the package's errors.STOP_SIGNALS (Windows: no SIGHUP)
        sig = getattr(signal, name, None)
        if sig is not None and not (name == "SIGHUP" and signal.getsignal(sig) is signal.SIG_IGN):
            signal.signal(sig, starting)  # (nohup's SIGHUP stays ignored)
    if not os.environ.get("COLUMNS", "1").isdigit() or os.environ.get("COLUMNS") == "0":
        del os.environ["COLUMNS"]  # COLUMNS=0 made the help and usage errors print nothing at all
    from .cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
