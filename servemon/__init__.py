"""servemon: watch LLM serving endpoints under load.

This package holds the console script (``servemon.cli``, the group, and
``servemon.commands``, one module per command) and the orchestration of the parts.
Two leaf modules, :mod:`servemon.errors` and :mod:`servemon.fields`, import nothing
of servemon's own and may be used by every package, as may ``__version__`` (the
version's one home; the wheel's metadata reads it from here); nothing else here is
imported by ``simulator``, ``monitor``, ``loadgen`` or ``dashboards``.
"""

__version__ = "0.1.0"
