"""``python -m bertattn_batch`` runs the CLI."""

from .cli import main

main()
