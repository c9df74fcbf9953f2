"""The exception tree shared by every servemon package.

::

    ServemonError                 anything servemon raises on purpose
    ├── ConfigError               a bad flag, YAML field or config file (one line)
    ├── TargetError               the endpoint under test did not answer as expected
    └── GpuUnavailable            NVML missing, no GPU (defined in monitor.gpu)

Outcomes of single requests are never exceptions: they are an enum on the request's
record. This module imports nothing of servemon's own.
"""

from __future__ import annotations

__all__ = ["ConfigError", "ServemonError", "TargetError"]


class ServemonError(Exception):
    """Base of every error servemon raises on purpose."""


class ConfigError(ServemonError):
    """Bad configuration. ``str()`` is one line naming the source and the field."""


class TargetError(ServemonError):
    """The target endpoint could not be used (unreachable, no models, bad answer)."""
