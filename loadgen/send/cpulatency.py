"""Keeping the CPUs out of deep idle while a run measures (``--cpu-dma-latency``).

A load generator spends most of its time waiting: for the next send, for the next
token. An idle CPU is halted, and waking it is the kernel's and (in a VM) the host's
business: on the 2-vCPU Firecracker VM this project is built on, a bare timer wake on
an idle loop had a p99 of 2.8-6.9 ms, against 0.24-0.26 ms with the CPUs kept
polling (``benchmarks/results/replay-timing.md``). That is the client's
own latency, and it lands in every dispatch lag and every token timestamp.

Linux's PM QoS interface takes a bound on that wake-up latency: a process writes a
32-bit number of microseconds to ``/dev/cpu_dma_latency`` and the bound holds while
it keeps the file open (``tuned``'s latency-performance profile and ``cyclictest``
do the same). 0 keeps idle CPUs polling, which costs power on every CPU of the
machine; the request ends when the run does, or when the process dies. Writing the
file needs root or a udev rule that grants it, so this is opt-in, checked before
anything starts, and recorded in ``run.json``.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator
from pathlib import Path

from servemon.core.errors import ConfigError

__all__ = ["PM_QOS_PATH", "check_cpu_latency", "hold_cpu_latency"]

PM_QOS_PATH = Path("/dev/cpu_dma_latency")


def check_cpu_latency(microseconds: int, path: Path = PM_QOS_PATH) -> None:
    """Raise a one-line :class:`ConfigError` if the bound cannot be asked for."""
    if microseconds < 0:
        raise ConfigError(f"--cpu-dma-latency {microseconds}: must be 0 or more")
    if not path.exists():
        raise ConfigError(
            f"--cpu-dma-latency: {path} does not exist here (Linux's PM QoS "
            "interface); run without it"
        )
    if not os.access(path, os.W_OK):
        raise ConfigError(
            f"--cpu-dma-latency: cannot write {path} (it needs root, or a udev "
            "rule that lets this user write it)"
        )


@contextlib.contextmanager
def hold_cpu_latency(
    microseconds: int | None, path: Path = PM_QOS_PATH
) -> Iterator[None]:
    """Hold a PM QoS request of ``microseconds`` for the ``with`` body (None:
    nothing)."""
    if microseconds is None:
        yield
        return
    check_cpu_latency(microseconds, path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"--cpu-dma-latency: cannot open {path}: {exc}") from None
    try:
        os.write(fd, struct.pack("=i", microseconds))
        yield
    finally:
        os.close(fd)  # the kernel drops the request with the last descriptor
