"""The exception tree shared by every servemon package.

::

    ServemonError                 anything servemon raises on purpose
    ├── ConfigError               a bad flag, YAML field or config file (one line)
    ├── TargetError               the endpoint under test did not answer as expected
    ├── RecordError               a run directory could not be written (disk full, ...)
    ├── MissingExtra              a command's extra is not installed (servemon[loadgen])
    └── GpuUnavailable            NVML missing, no GPU (defined in monitor.gpu)

Outcomes of single requests are never exceptions: they are an enum on the request's
record. This module imports nothing of servemon's own.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "MissingExtra",
    "RecordError",
    "ServemonError",
    "TargetError",
]


class ServemonError(Exception):
    """Base of every error servemon raises on purpose."""


class ConfigError(ServemonError):
    """Bad configuration. ``str()`` is one line naming the source and the field."""


class TargetError(ServemonError):
    """The target endpoint could not be used (unreachable, no models, bad answer)."""


class RecordError(ServemonError):
    """A run directory could not be written (a full disk, a read-only mount).

    ``str()`` is one line naming the file and the OS's reason."""


class MissingExtra(ServemonError):
    """servemon is installed without the extra a command needs (the base install
    holds the exporter only). ``str()`` is one line with the pip command."""
