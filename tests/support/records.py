"""Run records as an earlier servemon wrote them (``tests/data/records-v1``: made by
the commands below before ``run.json``'s sections were typed), and the shape of a
record's keys, to compare a new one with them."""

from __future__ import annotations

from pathlib import Path

__all__ = ["ADDED", "COMMANDS", "RECORDS", "key_paths"]

RECORDS = Path(__file__).resolve().parents[1] / "data" / "records-v1"
#: How each record was made (``merged``: ``servemon merge`` of two shards of
#: ``ramp``, with ``--shard 0/2`` and ``1/2``; ``replay``: of a small Mooncake-style
#: trace). Each ran against the built-in simulator, ``--sim-profile tiny``.
COMMANDS = {
    "ramp": (
        "ramp",
        "--workload",
        "random:prompt=16,output=4",
        "--stages",
        "4:2",
        "--slo",
        "ttft_p95<=0.5,error_rate<=0.01",
    ),
    "prefix": (
        "ramp",
        "--workload",
        "prefix:hit=0.5,prompt=512,groups=4,output=2",
        "--stages",
        "4:2",
    ),
    "sweep": (
        "sweep",
        "--workload",
        "random:prompt=16,output=4",
        "--parallel",
        "1,2",
        "--number",
        "4",
    ),
}
#: Keys a later servemon added to every record (none removed or renamed): a
#: user's ``jq`` line on the older keys still reads the same.
ADDED = frozenset({"config.drain"})  # --drain, 2026-12-06
#: Where a record's keys depend on the machine, not on servemon: the GPUs here
#: (a list where NVML answers, else why not).
MACHINE = ("environment.gpus",)


def key_paths(value: object, at: str = "") -> set[str]:
    """Every key of a JSON value, as a dotted path (``[]`` for a list's items)."""
    if at in MACHINE:
        return {at}
    if isinstance(value, dict):
        paths = set()
        for key, item in value.items():
            path = f"{at}.{key}" if at else key
            paths |= {path} | key_paths(item, path)
        return paths
    if isinstance(value, list):
        return set().union(*(key_paths(item, f"{at}[]") for item in value))
    return set()
