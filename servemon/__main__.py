"""``python -m servemon``."""

from servemon.cli import main

if __name__ == "__main__":
    main()
