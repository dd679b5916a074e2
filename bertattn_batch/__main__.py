"""``python -m bertattn_batch`` and the ``bertattn`` command: stop signals are handled from the first
moment, before the command's libraries load (a scheduler may stop a job while it is still starting)."""

from __future__ import annotations


def main() -> None:
    from .runtime import install_signal_handlers  # signals only: the command's libraries load after

    install_signal_handlers()
    from .cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
