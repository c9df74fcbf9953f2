"""servemon: watch LLM serving endpoints under load.

One import root, five parts, four floors (docs/architecture.md): the foundation
(:mod:`servemon.core`: errors, config fields, the vocabulary, the wire formats); the
exporter (:mod:`servemon.monitor`), the simulated endpoint
(:mod:`servemon.simulator`) and the dashboards and rules
(:mod:`servemon.dashboards`); the load generator (:mod:`servemon.loadgen`); and on
top, here, the console script (``servemon.cli``, the group, and
``servemon.commands``, one module per command), which nothing else imports.
"""

from servemon.core.version import __version__

__all__ = ["__version__"]
