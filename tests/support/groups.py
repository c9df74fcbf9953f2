"""The suite's groups under pytest-xdist (``scripts/test``: ``--dist loadgroup``).

What shares a fixture shares a worker: each test module is one group, so that its
module-scoped stack (Prometheus, nginx, a fleet of simulators, a browser's pages)
starts once, and all of ``tests/e2e/engines/`` is one group, so that the tiny models
and each engine start once and two engines never share the cores.

xdist's own ``loadgroup`` reads ``xdist_group`` marks through a suffix it writes
into each item's node id on the worker; pytest 9 keeps the node id elsewhere, so the
suffix is lost and ``loadgroup`` silently spread each module over every worker
(xdist 3.8: a module with a module-scoped stack started it once per worker that got
one of its tests). The groups are therefore read from the node id itself, by the
scheduler, in the controller.

Groups are sent longest first (:data:`LONGEST`, then collection order): a long
group started last would run alone at the end while the other workers idle.
"""

from __future__ import annotations

from collections import OrderedDict

from xdist.scheduler import LoadScopeScheduling

#: Every test under this folder is one group (the real engines).
ENGINES = "tests/e2e/engines/"

#: The groups of the most test time on the 2-core machine, longest first (from a
#: fresh clone's JUnit XML; ``scripts/margins`` reads the same files). Any group
#: not named follows in collection order.
LONGEST = (
    "tests/e2e/test_control_cold_start.py",
    "engines",
    "tests/e2e/test_fleet.py",
    "tests/e2e/test_cli.py",
    "tests/integration/test_control.py",
    "tests/e2e/test_energy_cli.py",
    "tests/integration/test_compare_verdicts.py",
    "tests/e2e/test_alerting_stack.py",
    "tests/e2e/test_fleet_netns.py",
    "tests/e2e/test_faults.py",
    "tests/e2e/test_replay_cli.py",
    "tests/e2e/test_fleet_run.py",
    "tests/e2e/test_autoscale_fleet.py",
)


def group_of(nodeid: str) -> str:
    """The group of a test: ``engines``, or its module's path."""
    path = nodeid.split("::", 1)[0]
    return "engines" if path.startswith(ENGINES) else path


class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
    """xdist's scope scheduling with :func:`group_of` as the scope, longest first."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)

    def _assign_work_unit(self, node: object) -> None:
        # Sent from the head of the queue: the named groups first (a stable sort,
        # so the rest keep collection order).
        rank = {group: i for i, group in enumerate(LONGEST)}
        self.workqueue = OrderedDict(
            sorted(
                self.workqueue.items(), key=lambda unit: rank.get(unit[0], len(rank))
            )
        )
        super()._assign_work_unit(node)
