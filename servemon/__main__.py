"""``python -m servemon``."""

from servemon.cli import main

main()
