"""SLO parsing, load config validation, secrets and the dispatcher's counting."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from servemon.core.errors import ConfigError
from servemon.core.fields import Secret, merge
from servemon.core.slo import SloTerm, parse_slo
from servemon.loadgen.record.slo import request_meets
from servemon.loadgen.run.config import (
    LoadConfig,
    auth_headers,
    config_headers,
    header_lines,
    parse_extra_body,
    secret_header_names,
)
from servemon.loadgen.run.live import LiveMetrics
from servemon.loadgen.run.sampler import parse_engine_samples
from servemon.loadgen.runner import recorded_config, redact_argv
from servemon.loadgen.send.arrivals import Due
from servemon.loadgen.send.dispatch import OpenLoop
from servemon.loadgen.send.timing import Outcome, RequestTiming


def test_slo_terms_parse() -> None:
    terms = parse_slo("ttft_p95<=0.5, itl_p99<=0.05,error_rate<=0.01,e2e_max<=10")
    assert [str(t) for t in terms] == [
        "ttft_p95<=0.5",
        "itl_p99<=0.05",
        "error_rate<=0.01",
        "e2e_max<=10",
    ]
    assert terms[0].key == "ttft_p95"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("ttft_p95<0.5", "expected FIGURE_STAT<=NUMBER"),
        ("latency_p95<=1", "unknown figure 'latency'"),
        ("ttft<=1", "name a statistic"),
        ("ttft_p95<=-1", ">= 0"),
        ("", "no terms"),
    ],
)
def test_bad_slo_is_one_line_naming_the_term(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match="--slo") as info:
        parse_slo(text)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def _timing(
    ttft: float, gaps: list[float], outcome: Outcome = Outcome.OK
) -> RequestTiming:
    content = [10.0 + ttft]
    for gap in gaps:
        content.append(content[-1] + gap)
    return RequestTiming(
        request_id="x",
        scheduled_s=10.0,
        sent_s=10.0,
        end_s=content[-1],
        outcome=outcome,
        content_s=tuple(content),
        output_tokens=len(content),
    )


def test_goodput_judges_each_request_on_its_own() -> None:
    slo = [SloTerm("ttft", "p95", 0.5), SloTerm("itl", "max", 0.1)]
    assert request_meets(_timing(0.2, [0.05, 0.05]), slo)
    assert not request_meets(_timing(0.7, [0.05]), slo)
    assert not request_meets(_timing(0.2, [0.05, 0.2]), slo)
    assert not request_meets(_timing(0.2, [0.05], Outcome.HTTP_ERROR), slo)


def test_load_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^cfg\.yaml: late: "):
        merge(LoadConfig(), {"late": "maybe"}, "cfg.yaml")
    with pytest.raises(ConfigError, match="no_such: unknown field"):
        merge(LoadConfig(), {"no_such": 1}, "cfg.yaml")
    with pytest.raises(ConfigError, match="--extra-body: expected a JSON object"):
        parse_extra_body("[1]")
    assert merge(LoadConfig(), {"sim_args": ["--a"]}, "x").sim_args == ("--a",)


def test_secrets_never_print_and_are_redacted_in_records() -> None:
    config = LoadConfig(header=("X-Api-Key: hdr-SECRET",))
    headers = auth_headers({"SERVEMON_API_KEY": "key-SECRET"}, config_headers(config))
    assert headers["Authorization"].reveal() == "Bearer key-SECRET"
    assert headers["X-Api-Key"] == Secret("hdr-SECRET")
    shown = f"{headers} {headers['X-Api-Key']!r} {headers['X-Api-Key']}"
    assert "SECRET" not in shown
    assert "SECRET" not in str(recorded_config(config))
    argv = ["ramp", "--header", "X-Api-Key: hdr-SECRET", "--header=A: b-SECRET"]
    assert "SECRET" not in " ".join(redact_argv(argv))
    assert "X-Api-Key: <redacted>" in redact_argv(argv)
    with pytest.raises(ConfigError, match="--header 1") as info:
        config_headers(LoadConfig(header=("no colon here",)))
    assert "no colon" not in str(info.value)


def test_a_header_file_gives_headers_and_never_shows_a_value(tmp_path: Path) -> None:
    path = tmp_path / "headers"
    path.write_text(
        "# the gateway's key\n\nAuthorization: Bearer file-SECRET\nX-Team:  a b \n"
    )
    config = LoadConfig(header_file=str(path), header=("X-Team: flag",))
    headers = auth_headers({"SERVEMON_API_KEY": "env-SECRET"}, config_headers(config))
    # The file's Authorization over SERVEMON_API_KEY's, a flag over the file.
    assert headers["Authorization"].reveal() == "Bearer file-SECRET"
    assert headers["X-Team"].reveal() == "flag"
    assert "SECRET" not in str(recorded_config(config))
    assert recorded_config(config)["header_file"] == str(path)
    path.write_text("X-Ok: 1\nBearer file-SECRET\n")
    with pytest.raises(ConfigError, match="line 2") as info:
        header_lines(path)
    assert "SECRET" not in str(info.value)
    with pytest.raises(ConfigError, match="cannot read"):
        config_headers(LoadConfig(header_file=str(tmp_path / "absent")))


@pytest.mark.parametrize(
    ("header", "secret"),
    [
        ("Authorization: Bearer x", True),
        ("authorization: x", True),
        ("Proxy-Authorization: x", True),
        ("api-key: x", True),
        ("X-Api-Key: x", True),
        ("X-Auth-Token: x", True),
        ("Cookie: a=b", True),
        ("X-Client-Secret: x", True),
        ("X-Team: x", False),
        ("Accept: text/plain", False),
    ],
)
def test_secret_header_names(header: str, secret: bool) -> None:
    assert bool(secret_header_names([header])) == secret


def test_live_histograms_have_a_bucket_at_every_slo_threshold() -> None:
    live = LiveMetrics("http://t", "m", parse_slo("ttft_p95<=0.123,e2e_p99<=7.77"))
    live.observe(_timing(0.1, [0.01]))
    text = generate_latest(live.registry).decode()
    edges = {
        (s.name, s.labels.get("le"))
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.endswith("_bucket")
    }
    assert ("servemon_client_ttft_seconds_bucket", "0.123") in edges
    assert ("servemon_client_e2e_seconds_bucket", "7.77") in edges


def test_live_metrics_carry_reconnects_and_the_servers_share_of_ttft() -> None:
    live = LiveMetrics("t", "m")
    timing = replace(
        _timing(0.1, [0.01]),
        reconnects=2,
        server_queue_s=0.03,
        server_prefill_s=0.05,
    )
    live.observe(timing)
    live.observe(_timing(0.1, [0.01]))  # a server that reported nothing
    r = live.registry
    labels = {"target": "t", "model": "m", "stage": str(timing.stage)}
    assert r.get_sample_value("servemon_client_reconnects_total", labels) == 2
    assert r.get_sample_value("servemon_client_server_queue_seconds_count", labels) == 1
    assert (
        r.get_sample_value("servemon_client_server_queue_seconds_sum", labels) == 0.03
    )
    gap = r.get_sample_value("servemon_client_ttft_gap_seconds_sum", labels)
    assert gap == pytest.approx(0.1 - 0.08)
    assert r.get_sample_value("servemon_client_ttft_gap_seconds_count", labels) == 1


def test_sampler_keeps_normalized_series_without_buckets() -> None:
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="m",engine="0"} 3\n'
        "# TYPE vllm:e2e_request_latency_seconds histogram\n"
        'vllm:e2e_request_latency_seconds_bucket{model_name="m",le="1.0"} 2\n'
        'vllm:e2e_request_latency_seconds_bucket{model_name="m",le="+Inf"} 2\n'
        'vllm:e2e_request_latency_seconds_count{model_name="m"} 2\n'
        'vllm:e2e_request_latency_seconds_sum{model_name="m"} 1.5\n'
        "# TYPE process_cpu_seconds_total counter\n"
        "process_cpu_seconds_total 4\n"
    )
    samples, info = parse_engine_samples(text)
    assert [s[0] for s in samples] == [
        "servemon_engine_requests_running",
        "servemon_engine_e2e_seconds_count",
        "servemon_engine_e2e_seconds_sum",
    ]
    assert samples[0][1] == {"model": "m", "engine": "vllm", "rank": "0"}
    assert samples[0][2] == 3.0
    assert info["engine"] == "vllm"


@pytest.mark.asyncio
async def test_the_cap_holds_requests_back_and_counts_them() -> None:
    release = asyncio.Event()
    started: list[int] = []

    async def send(due: Due, at: float, _: object) -> None:
        started.append(due.index)
        await release.wait()

    loop = OpenLoop(send, max_inflight=2)
    schedule = [Due(i, 0, 0.0) for i in range(5)]
    run = asyncio.create_task(loop.run(schedule, time.monotonic()))
    for _ in range(1000):  # bounded: a few event-loop turns are enough
        if len(started) == 2 and loop.counts.held_back[0]:
            break
        await asyncio.sleep(0)
    assert started == [0, 1]
    assert loop.counts.held_back[0] == 1  # the third waits; the rest are not due yet
    release.set()
    await asyncio.wait_for(run, 2)
    await asyncio.gather(*loop.tasks)
    assert started == [0, 1, 2, 3, 4]
    assert loop.counts.sent[0] == 5


@pytest.mark.asyncio
async def test_late_requests_are_skipped_and_counted_with_skip() -> None:
    sent: list[int] = []

    async def send(due: Due, at: float, _: object) -> None:
        sent.append(due.index)

    skipped: list[int] = []
    loop = OpenLoop(
        send,
        max_inflight=10,
        late="skip",
        late_tolerance_s=0.5,
        on_skip=lambda due: skipped.append(due.index),
    )
    now = time.monotonic()
    # The first two were due a second ago; the third is due now.
    schedule = [Due(0, 0, 0.0), Due(1, 0, 0.0), Due(2, 0, 1.0)]
    await loop.run(schedule, now - 1.0)
    await asyncio.gather(*loop.tasks)
    assert sent == [2]
    assert skipped == [0, 1]
    assert loop.counts.skipped[0] == 2
