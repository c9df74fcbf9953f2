"""``servemon capacity`` in-process against the simulator over real sockets.

The simulator is made to saturate at a known rate: with ``--max-num-seqs S`` and
every request ``OUTPUT`` tokens long (``ignore_eos``), each request holds a batch slot
for about ``OUTPUT + 1`` engine steps, so the engine finishes about ``S / E2E``
requests a second, where E2E is a request's time alone (its profile's step cost, or
more where the machine is busy: it is measured in the search's first, unqueued step).
Arrivals are constant (evenly spaced): below that rate nothing queues, above it the
queue grows every second, so the SLO breaks sharply at the saturation rate instead of
at a point that moves with the luck of a Poisson draw. The engine's step is long
(45 ms) and the SLO generous next to it, so that a stall of a busy machine does not
break a step by itself.

A stall can still make the client fall behind its schedule, and then the search
rightly puts the step down to the client, not the server: such a search (checked to
be right about the client) is run once more, as one would rerun a measurement the
instrument flagged as spoiled.
"""

from __future__ import annotations

import io
import json
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

from servemon.cli import cli
from servemon.core.errors import ConfigError
from servemon.core.slo import parse_slo
from servemon.load import run_command
from servemon.loadgen.record.runrecord import RunResult
from servemon.loadgen.record.summary import summarize
from servemon.loadgen.run.clientwatch import LAG_LOST_S
from servemon.loadgen.run.config import Kind, LoadConfig
from servemon.loadgen.run.flat import config_of
from servemon.simulator.profiles import load_profile
from tests.support.margins import Margin
from tests.support.runs import requests_of, run

pytestmark = pytest.mark.integration

#: The search of the main test: 8 batch slots on a tiny engine slowed 50-fold (a
#: 45 ms step), requests of 16 output tokens: about 10 requests a second.
SEQS, SPEED, OUTPUT = 8, 0.02, 16
SLO_S = 0.5
SLO = f"ttft_p95<={SLO_S:g}"
RPS_MIN, STEP_S, SETTLE_S, PRECISION = 4.0, 2.0, 0.5, 0.1


def config_for(
    target: str, tmp_path: Path, kind: Kind = "capacity", **fields: Any
) -> LoadConfig:
    """A capacity search (or a ramp: ``kind``) with short steps, constant arrivals
    and quick server samples, on a free live-metrics port."""
    base: dict[str, Any] = {
        "target": target,
        "out": str(tmp_path / "runs"),
        "metrics_port": 0,
        "workload": f"random:prompt=16,output={OUTPUT}",
        "ignore_eos": True,
        "timeout": 20.0,
        "grace": 2.0,
        "slo": SLO,
        "arrival": "constant",
        "sample_interval": 0.25,
    }
    if kind == "capacity":
        base |= {
            "rps_min": RPS_MIN,
            "step_seconds": STEP_S,
            "settle": SETTLE_S,
            "precision": PRECISION,
            "max_duration": 60.0,
        }
    return config_of(kind, ("test", {**base, **fields}))


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def blamed_client(result: RunResult, request: pytest.FixtureRequest) -> bool:
    """Whether the search put its first bad step down to the client falling behind
    its schedule, and rightly: the client's dispatch lag did pass the limit in that
    step (a stall of a busy machine). Blaming a client that kept up fails the test."""
    found = result.capacity
    assert result.info.arrival is not None  # recorded for a search too
    assert found is not None
    bad = next((s for s in found.steps if not s.good), None)
    if bad is None or bad.saturated != "client":
        return False
    lags = [t.dispatch_lag for t in requests_of(result.path, bad.stage)]
    assert lags, bad
    assert max(lags) > LAG_LOST_S, ("the client was blamed, yet it kept up", lags)
    request.node.user_properties.append(("client_fell_behind", str(result.path)))
    return True


def step_seconds(speed: float) -> float:
    """The tiny profile's engine step at ``speed`` (its fixed cost dominates)."""
    return load_profile("tiny").step_overhead_s / speed


def judged_ttft_p95(result: RunResult) -> float:
    """TTFT p95 of a one-stage ramp, judged as the search judges a step: only the
    requests scheduled after the settle time."""
    stage = result.stages[0]
    assert stage.start_s is not None
    start = result.info.origin_s + stage.start_s
    judged = [
        t for t in requests_of(result.path, 0) if t.scheduled_s >= start + SETTLE_S
    ]
    assert len(judged) >= 10, len(judged)
    value = summarize(judged, slo=parse_slo(SLO)).value("ttft_p95")
    assert value is not None
    return value


@pytest.mark.asyncio
async def test_capacity_holds_at_0_8x_and_breaks_at_1_3x(
    start_sim: Any, tmp_path: Path, request: pytest.FixtureRequest, margin: Margin
) -> None:
    async with start_sim(max_num_seqs=SEQS, speed=SPEED) as server:
        for attempt in range(2):
            out = io.StringIO()
            result = await run_command(
                "capacity",
                config_for(server.url, tmp_path / f"search-{attempt}"),
                ["servemon", "capacity", "(test)"],
                console=Console(file=out, width=200),
            )
            if not blamed_client(result, request):
                break
        found = result.capacity
        assert found is not None
        capacity = found.capacity_rps
        assert capacity is not None, found

        below = await run(
            "ramp",
            config_for(server.url, tmp_path, "ramp", stages=f"{0.8 * capacity:.4g}:3"),
        )
        above = await run(
            "ramp",
            config_for(server.url, tmp_path, "ramp", stages=f"{1.3 * capacity:.4g}:3"),
        )

    # The search: doubling from --rps-min to the first breach, then bisecting down
    # to --precision; the answer is the highest good rate.
    assert result.status == "completed"
    assert found.ended_because == "precision reached"
    low, high = found.bracket
    assert low == capacity
    assert high is not None
    assert 0 < (high - low) / low <= PRECISION
    rates = [s.rate for s in found.steps]
    first_bad = next(i for i, s in enumerate(found.steps) if not s.good)
    assert rates[: first_bad + 1] == [RPS_MIN * 2**i for i in range(first_bad + 1)]
    assert max(s.rate for s in found.steps if s.good) == capacity
    assert min(s.rate for s in found.steps if not s.good) == high
    # A step runs long enough for 10 judged requests (unless a signal cut it short).
    assert all(s.judged_requests >= 10 for s in found.steps if s.good), found.steps
    bad = found.steps[first_bad]
    assert found.first_breach == (bad.breaches[0] if bad.breaches else bad.early_stop)
    assert found.first_breach is not None
    if bad.breaches:
        assert found.first_breach.startswith(f"{SLO} (was ")
    # Batch slots ran out with a generous KV pool: requests waited for a slot.
    assert found.saturated_first == "queue", "(twice the client fell behind?)"
    assert bad.saturated == "queue"

    # Where the simulator saturates: all batch slots busy. A request alone takes
    # its steps (more if the machine is busy); the SLO allows a short queue.
    alone = statistics.median(
        t.e2e for t in requests_of(result.path, 0) if t.e2e is not None
    )
    assert alone >= 0.9 * OUTPUT * step_seconds(SPEED), alone
    # Above that rate the queue grows through a step, so a request scheduled t s
    # in waits about (rate / served - 1) * t: the last judged ones meet the TTFT
    # SLO up to about (1 + SLO_S / STEP_S) times the rate served. Without that
    # factor the search found 1.25-1.35 x SEQS / alone (7 runs), close to 1.4.
    expected = SEQS / alone * (1 + SLO_S / STEP_S)
    ratio = capacity / expected
    margin("capacity / expected", ratio, low=0.7, high=1.4, why=(capacity, expected))

    # One run directory: every step a stage, the answer in summary.json; run.json
    # and summary.json tell the same story.
    summary = read_json(result.path / "summary.json")
    run_json = read_json(result.path / "run.json")
    assert summary["capacity"] == json.loads(json.dumps(found.to_json()))
    assert summary["capacity"]["capacity_rps"] == capacity
    assert summary["status"] == run_json["status"] == "completed"
    assert [s["target_rate"] for s in summary["stages"]] == rates
    assert [s["target_rate"] for s in run_json["stages"]] == rates
    assert [s["stage"] for s in run_json["stages"]] == list(range(len(rates)))
    assert [s["sent"] for s in run_json["stages"]] == [
        s["sent"] for s in summary["stages"]
    ]
    assert (result.path / "report.html").stat().st_size > 0

    # Printed.
    printed = out.getvalue()
    assert f"capacity: {capacity:.4g} req/s meets the SLO" in printed, printed
    assert f"SLO that broke first: {found.first_breach}" in printed, printed
    assert "saturated first: queue" in printed, printed

    # The answer holds: 0.8x meets the SLO, 1.3x breaks it, judged as a step is
    # (after the settle time) and as the ramp's own summary judges its stage.
    for ramp, meets in ((below, True), (above, False)):
        assert ramp.status == "completed"
        assert set(ramp.summaries[0].outcomes) == {"ok"}, ramp.summaries[0].outcomes
        p95 = judged_ttft_p95(ramp)
        assert (p95 <= SLO_S) is meets, (ramp.stages[0].target_rate, p95)
        stage = read_json(ramp.path / "summary.json")["stages"][0]
        assert stage["summary"]["slo_met"] == {SLO: meets}, stage["summary"]["ttft"]


#: Long answers (16 + 96 tokens: 7 KV blocks each) at a step of about 5 ms.
ATTRIBUTION = {"workload": "random:prompt=16,output=96", "rps_min": 3.0}


@pytest.mark.parametrize(
    ("sim", "what"),
    [
        # About 3 requests' worth of KV blocks, batch slots to spare.
        pytest.param({"num_gpu_blocks": 24, "max_num_seqs": 64}, "kv_cache", id="kv"),
        # 3 batch slots, the profile's 4,096 blocks.
        pytest.param({"max_num_seqs": 3}, "queue", id="queue"),
    ],
)
@pytest.mark.asyncio
async def test_what_saturated_first(
    start_sim: Any,
    tmp_path: Path,
    sim: dict[str, Any],
    what: str,
    request: pytest.FixtureRequest,
) -> None:
    async with start_sim(speed=0.2, **sim) as server:
        for attempt in range(2):
            # --precision 1 ends the search at the first bracket: a good step, a bad.
            config = config_for(
                server.url, tmp_path / f"search-{attempt}", precision=1.0, **ATTRIBUTION
            )
            result = await run("capacity", config)
            if not blamed_client(result, request):
                break
    found = result.capacity
    assert found is not None
    assert result.status == "completed"
    bad = [s for s in found.steps if not s.good]
    assert bad, found.steps
    assert bad[0].saturated == what, bad[0]
    assert found.saturated_first == what
    assert read_json(result.path / "summary.json")["capacity"]["saturated_first"] == (
        what
    )


@pytest.mark.asyncio
async def test_capacity_without_an_slo_is_a_one_line_config_error(
    start_sim: Any, tmp_path: Path, http: Any, scrape: Any
) -> None:
    async with start_sim() as server:
        config = config_for(server.url, tmp_path, slo=None)
        with pytest.raises(ConfigError) as caught:
            await run("capacity", config)
        served = await scrape(http, server.url)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("--slo:"), message
    # Refused before any load: the target saw no completion request.
    assert served.get("vllm:prompt_tokens_total") == 0
    assert served.get("vllm:request_success_total") == 0


#: An unroutable name (RFC 2606): connecting to it could only fail.
REMOTE = "http://example.invalid:8000"


@pytest.mark.asyncio
async def test_remote_target_without_rps_max_fails_before_connecting(
    tmp_path: Path,
) -> None:
    config = config_for(REMOTE, tmp_path)
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        await run("capacity", config)
    elapsed = time.monotonic() - started
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("--rps-max:"), message
    assert "example.invalid" in message
    # No connection, no name lookup, no run directory: refused up front.
    assert elapsed < 1.0
    assert not (tmp_path / "runs").exists()


def test_remote_target_without_rps_max_is_one_line_on_the_command_line(
    tmp_path: Path,
) -> None:
    args = [
        "capacity",
        "--target",
        REMOTE,
        "--slo",
        SLO,
        "--metrics-port",
        "0",
        "--out",
        str(tmp_path / "runs"),
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("servemon: error: --rps-max:"), lines
    assert "Traceback" not in result.output
    assert not (tmp_path / "runs").exists()
