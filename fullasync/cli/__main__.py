"""`python -m fullasync.cli ...` runs the `fullasync` command."""

from fullasync.cli.main import main

main()
