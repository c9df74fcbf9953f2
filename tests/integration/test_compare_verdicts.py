"""``compare``'s verdicts on real runs against the simulator over real sockets:
the same configuration run twice is called no different, a simulator 20 % slower
is called slower with an interval reaching the true ratio, and runs without
repeats are judged from their requests and say so.

The slower simulator runs at ``speed=0.8``: every engine step (and the front-end
wait, 0 here) is divided by the speed, so each step takes 1.25 times as long. A
token gap is one step, and a request's E2E is its steps and its wait for the step
under way, so the true TPOT and E2E ratio is 1.25 where the batch does not change
a step's cost (here 0.5 us per sequence on an 80 ms step) and the client's own
share (well under a millisecond) is small. The profile below makes a step 80.0 ms,
and 100.0 ms at 0.8, whole milliseconds on purpose: the event loop sleeps to whole
milliseconds (epoll's timeout is rounded up), so with the 1 ms steps of the
``tiny`` profile a 1.25 ms step is slept as 2 ms and the measured TPOT ratio was
1.45, not 1.25 (and 1.30 with steps of 10.1 and 12.6 ms). And 80 ms rather than 40:
the simulator catches up a wake-up late by up to half a step, so the longer step
covers the longer stalls of a busy machine. With 40-ms steps on six pytest workers
the slow run's interval low came down to 1.054-1.18 in four fresh clones of five
(the reference run's stages 2.6-6.9 % over their step); with 80, run seven times
beside five workers of the end-to-end tests, 1.20-1.25 (stages at most 2.4 % over).

Each run: 20 and 40 requests a second for 1 s, three repeats, 16 output tokens a
request; about 6 s; each run gets a fresh simulator. The two runs of one
configuration share their ``--seed``, as a rerun with the default seed does: two
seeds are two draws of arrivals, and a stage's TTFT mean is a function of its draw
(each request waits for the step under way), reproduced to 0.5 ms from run to run.
Over seven seeds (2026-12-06), seed 5's three repeats at 20 req/s came out at
65.7, 65.7 and 66.3 ms (seed 1's: 60.3, 58.2, 60.9), so narrow a spread that
``compare`` rightly called its TTFT mean different from seeds 1, 2 and 4 (4 of 21
pairs); seeds 1 and 2 sat near that edge at 40 req/s ([1.003-1.141] slower in one
fresh clone). What differs between two runs of one seed is the machine.

The verdicts asserted are those on means and throughputs. A tail of one repeat
(ITL p95 from about 300 gaps) moves with every stall of the one event loop the
client and the in-process simulator share, on a machine shared with other work:
in 2 of 7 runs of this file it called the same configuration different, or gave
the slow one an interval as wide as [0.49-4.49]. (A simulator in a process of its
own is not steadier here: beside four busy loops its first stage ran 2.5 % late
and the slow run's interval low at 20 req/s came down to 1.18-1.19, against
1.23-1.25 in-process, 2026-12-06.) How often compare calls anything
different, tails included, is measured over real runs with the simulator in its
own process: ``benchmarks/compare_repeats.py`` (benchmarks/results/compare.md).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest

from servemon.loadgen.record.runrecord import RunResult
from servemon.loadgen.reports.compare import (
    Comparison,
    compare,
    verdict_notes,
    verdict_text,
    write_compare,
)
from servemon.loadgen.reports.report import write_report
from servemon.loadgen.reports.significance import Difference
from servemon.simulator.config import SimConfig
from servemon.simulator.server import SimServer
from tests.support.margins import Margin
from tests.support.processes import ahead_of_the_suite
from tests.support.runs import config_for, requests_of, run

pytestmark = pytest.mark.integration

STAGES = "20:1,40:1"
LEVELS = ("20 rps", "40 rps")
WORKLOAD = "random:prompt=16,output=16"
#: The ``tiny`` profile with a step of 80.0 ms (0.1 ms of it reading the weights).
PROFILE = """\
name: tiny-40ms
model: sim-tiny
params: 5.0e7
bytes_per_param: 2
kv_bytes_per_token: 16384
memory_bandwidth: 1.0e12
compute_flops: 2.0e13
step_overhead_s: 0.0799
per_seq_overhead_s: 0.0000005
frontend_latency_s: 0.0
num_gpu_blocks: 4096
block_size: 16
max_model_len: 4096
eos_probability: 0.0
"""
#: The step ratio, 1 / speed 0.8; what the client measures adds its own share c
#: to both sides, (100 + c) / (80 + c): down to TRUE_LOW with c up to 0.8 ms (1 % of
#: a step; a TPOT interval of 1.236-1.249 was seen on the 2-core machine).
TRUE_RATIO = 1.25
TRUE_LOW = (100 + 0.8) / (80 + 0.8)
#: Figures whose value rests on every request of a repeat: a mean, a rate.
WHOLE = ("output tok/s", "requests/s", "TTFT mean ms", "TPOT mean ms", "E2E mean s")
#: How far from 1 a ratio's whole interval may lie when two runs of one
#: configuration are called different. The simulator's steps run late by what the
#: machine's load takes from them, and that load moves between two runs (the
#: suite's other workers beside): in a fresh-clone run on five workers (2026-12-05)
#: the second run's TPOT at 40 req/s was 0.05-1.2 % lower, [0.9880-0.9995], and
#: called faster, truly of those two runs. A difference a user acts on is larger.
DRIFT = 0.02


#: The profile's step at speed 1, and how far over its step a stage's TPOT mean
#: may be before the run is taken as stalled by the machine (:func:`pace`).
STEP_S = 0.080
STALL_OVER = 0.05
#: The true ratio moves up to TRUE_HIGH where the slow simulator's steps run later than
#: the fast one's: by as much as a run keeps before it counts as stalled (STALL_OVER,
#: with the fast one on time). A fraction of a millisecond already moves it above 1.25:
#: in a fresh clone, steps 0.17 ms over 50 against 0.05 over 40 gave an interval of
#: [1.2507-1.2548]. A ratio the client or ``compare`` inflates (the 1.45 of rounded
#: sleeps above) stays outside.
TRUE_HIGH = TRUE_RATIO * (1 + STALL_OVER)
#: Runs of a repeated configuration at most, a stalled one thrown away.
TRIES = 2


def pace(result: RunResult, step_s: float) -> float:
    """The highest TPOT mean of a stage of ``result`` over the profile's step.

    The simulator keeps its profile's pace through wake-ups late by up to half a
    step (:data:`servemon.simulator.engine.MAX_CATCH_UP`), so a stage's TPOT mean
    is its step and the client's share: 1.001-1.036 steps beside two busy loops.
    Over :data:`STALL_OVER` the machine took the process for longer than a step
    (1.06-8 steps, seen only with another suite's vLLM tests on the same cores):
    not what a second run of the configuration gives, and ``compare`` would be
    right to call it different. Such a run is run again (:data:`TRIES`); a
    broken ``compare`` is still judged on the runs that kept the pace."""
    means = [
        tpot.mean
        for stage in result.record.stages
        if stage.summary and (tpot := stage.summary.figure("tpot")) is not None
    ]
    assert means, "no stage has a TPOT"
    return max(means) / step_s


@dataclass(frozen=True, slots=True)
class Runs:
    same_a: RunResult
    same_b: RunResult
    slower: RunResult
    single_a: RunResult
    single_b: RunResult
    #: Each run's tries: (name, TPOT mean over the step).
    paces: list[tuple[str, float]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    tmp = tmp_path_factory.mktemp("verdicts")
    paces: list[tuple[str, float]] = []  # each try's TPOT mean over its step
    profile = tmp / "tiny-40ms.yaml"
    profile.write_text(PROFILE, encoding="utf-8")

    async def once(name: str, seed: int, *, speed: float, repeats: int) -> RunResult:
        sim = SimConfig(host="127.0.0.1", port=0, profile=str(profile), speed=speed)
        async with SimServer(sim) as server:
            config = config_for(
                server,
                tmp / name,
                stages=STAGES,
                workload=WORKLOAD,
                seed=seed,
                repeats=repeats,
                energy="off",
            )
            return await run("ramp", config)

    async def one(name: str, seed: int, *, speed: float, repeats: int) -> RunResult:
        for attempt in range(1, TRIES + 1 if repeats > 1 else 2):
            result = await once(f"{name}-{attempt}", seed, speed=speed, repeats=repeats)
            paces.append((name, pace(result, STEP_S / speed)))
            if paces[-1][1] <= 1 + STALL_OVER:
                break
        return result

    async def go() -> Runs:
        return Runs(
            await one("same-a", 1, speed=1.0, repeats=3),
            await one("same-b", 1, speed=1.0, repeats=3),
            await one("slower", 3, speed=0.8, repeats=3),
            await one("single-a", 1, speed=1.0, repeats=1),
            await one("single-b", 2, speed=1.0, repeats=1),
            paces,
        )

    # The runs' stages are timed by the simulator in this process: ahead of the
    # other workers' tests in theirs.
    with ahead_of_the_suite():
        return asyncio.run(go())


def differences(c: Comparison) -> dict[tuple[str, str], str]:
    return {key: verdict_text(d) for key, d in c.differences[0].items()}


def _alike(d: Difference) -> bool:
    """No difference, or one inside the machine's drift (:data:`DRIFT`)."""
    if d.verdict == "no difference":
        return True
    return (
        d.low is not None
        and d.high is not None
        and d.low >= 1 - DRIFT
        and d.high <= 1 + DRIFT
    )


def test_the_same_configuration_twice_is_called_no_different(runs: Runs) -> None:
    c = compare([runs.same_a.path, runs.same_b.path])
    found = c.differences[0]
    whole = [d for (_, figure), d in found.items() if figure in WHOLE]
    assert len(whole) == len(WHOLE) * len(LEVELS)
    off = {(d.level, d.figure): verdict_text(d) for d in whole if not _alike(d)}
    assert not off, off
    assert {d.basis for d in whole} == {"repeats"}
    assert "resting on repeats" in verdict_notes(c)[0]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("figure", ["TPOT mean ms", "E2E mean s"])
def test_a_slower_simulator_is_called_slower_with_the_true_ratio_inside(
    runs: Runs,
    level: str,
    figure: str,
    request: pytest.FixtureRequest,
    margin: Margin,
) -> None:
    c = compare([runs.same_a.path, runs.slower.path])
    d = c.differences[0][(level, figure)]
    assert d.low is not None
    assert d.high is not None
    request.node.user_properties += [(f"pace {n}", p) for n, p in runs.paces]
    # Slower, and the interval meets the true ratio as far as each side's own
    # pace moves it.
    margin(
        "interval low",
        d.low,
        above=1,
        high=TRUE_HIGH,
        why=f"{verdict_text(d)}, paces {runs.paces}",
    )
    assert d.verdict == "slower", verdict_text(d)
    assert d.high >= TRUE_LOW, verdict_text(d)


def test_runs_without_repeats_are_judged_from_their_requests_and_say_so(
    runs: Runs,
) -> None:
    c = compare([runs.single_a.path, runs.single_b.path])
    found = c.differences[0]
    judged = [d for d in found.values() if d.confidence is not None]
    assert judged
    assert {d.basis for d in judged} == {"one run each"}
    # Nothing per request shows how a throughput varies.
    assert found[(LEVELS[0], "output tok/s")].verdict == "cannot tell"
    assert verdict_text(found[(LEVELS[0], "TPOT mean ms")]).endswith("(one run each)")
    notes = verdict_notes(c)
    assert "resting on one run each" in notes[0]
    assert "use --repeats 3 on both" in notes[0]


def test_the_reports_show_the_pooled_repeats_and_the_verdicts(
    runs: Runs, tmp_path: Path
) -> None:
    report = write_report(runs.same_a.path).read_text(encoding="utf-8")
    pooled = report.split("<h2 id='repeats'>Repeats pooled</h2>", 1)[1]
    table = pooled.split("</table>", 1)[0]
    for level in LEVELS:
        assert f"<td>{level}</td><td>3</td>" in table
    page = tmp_path / "compare.html"
    c = write_compare([runs.same_a.path, runs.slower.path], page)
    text = page.read_text(encoding="utf-8")
    tpot = verdict_text(c.differences[0][(LEVELS[1], "TPOT mean ms")])
    assert tpot.endswith("slower")
    assert tpot in text
    assert "figures judged together" in text


def test_a_sweep_runs_each_levels_number_on_every_repeat(tmp_path: Path) -> None:
    async def go() -> RunResult:
        sim = SimConfig(host="127.0.0.1", port=0, profile="tiny")
        async with SimServer(sim) as server:
            config = config_for(
                server, tmp_path, "sweep", parallel=(1, 2), number=(3, 5), repeats=2
            )
            return await run("sweep", config)

    result = asyncio.run(go())
    stages = result.record.stages
    assert [(s.label, s.repeat, s.sent) for s in stages] == [
        ("parallel 1", 1, 3),
        ("parallel 1", 2, 3),
        ("parallel 2", 1, 5),
        ("parallel 2", 2, 5),
    ]
    ids = [t.request_id for t in requests_of(result.path, stage=3)]
    assert len(ids) == 5
    assert all("-p2r2-" in i for i in ids), ids
    assert result.record.by_level is not None
    assert {k: v.requests for k, v in result.record.by_level.items()} == {
        "parallel 1": 6,
        "parallel 2": 10,
    }
