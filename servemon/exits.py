"""How a servemon command ends, as an exit status: the one table that the console
script exits with, that ``servemon --help`` lists and that README.md copies.

Each way a run ends has its own status, so that a script or a CI job can tell "the
target failed" from "a person stopped it" without reading the output. The numbers
follow the conventions a shell user already knows: 0 for success, 2 for a usage
error (as click and most Unix tools use it), 128 + 2 = 130 for an interrupt (the
status a shell gives a process ended by SIGINT), and ``EX_IOERR`` (74) of
``sysexits.h`` for output that could not be written. 1 is left to what Python
itself exits with on an unexpected error (a bug: a traceback), and 3 is a run that
servemon stopped on purpose because the target was failing.

A run's record says the same thing: ``summary.json``'s ``status`` is
``completed``, ``aborted`` or ``interrupted``, and :func:`for_run` maps it.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["MEANINGS", "ExitStatus", "epilog", "for_run"]


class ExitStatus(IntEnum):
    """The exit statuses of the ``servemon`` console script."""

    #: The command did what it was asked (a run went to its planned end).
    COMPLETED = 0
    #: Bad input, before anything started: a flag, a config file, a workload
    #: or trace file, a target that cannot be used (one line on stderr).
    USAGE = 2
    #: A guard rail stopped the run because the target was failing (error rate,
    #: stopped answering, runaway queue), or a capacity search or control loop
    #: could not go on (blind). ``summary.json``: ``aborted`` and ``stop_reason``.
    ABORTED = 3
    #: The run record (or a report) could not be written: a full disk, a
    #: read-only or missing directory (``EX_IOERR`` of sysexits.h).
    RECORD_ERROR = 74
    #: Stopped by SIGINT or SIGTERM (Ctrl-C): ``summary.json``: ``interrupted``.
    INTERRUPTED = 130


#: What each status means, one line each, in the order of the table.
MEANINGS: dict[ExitStatus, str] = {
    ExitStatus.COMPLETED: "completed: the run went to its planned end",
    ExitStatus.USAGE: "bad input (a flag, a file, the target), nothing started",
    ExitStatus.ABORTED: "aborted: a guard rail stopped it, the target failing",
    ExitStatus.RECORD_ERROR: "the run record could not be written (disk, path)",
    ExitStatus.INTERRUPTED: "interrupted: SIGINT or SIGTERM (Ctrl-C)",
}


def for_run(status: str) -> ExitStatus:
    """The exit status of a run whose record says ``status``. A merged run's
    status joins its shards' (``aborted+completed``): a shard interrupted makes it
    interrupted, else any shard not completed makes it aborted."""
    states = set(status.split("+"))
    if states == {"completed"}:
        return ExitStatus.COMPLETED
    if "interrupted" in states:
        return ExitStatus.INTERRUPTED
    return ExitStatus.ABORTED


def epilog() -> str:
    """The exit statuses as click prints an epilog (``\\b`` keeps the lines)."""
    lines = [f"  {int(s):>3}  {meaning}" for s, meaning in MEANINGS.items()]
    return "\b\nExit statuses:\n" + "\n".join(lines)
