"""The version's one home: the wheel's metadata reads it from here (pyproject.toml,
``[tool.hatch.version]``), the CLI prints it and every run records it."""

__all__ = ["__version__"]

__version__ = "0.1.0"
