"""``run.json``'s sections, typed (:mod:`servemon.loadgen.record.sections`): a record an
earlier servemon wrote reads into them and writes back key for key, and one from
before a section (or with parts this machine cannot make) still reads."""

from __future__ import annotations

import json
import shutil
from dataclasses import fields
from pathlib import Path

import pytest

from servemon.core.slo import parse_slo
from servemon.loadgen.record.record import read_run
from servemon.loadgen.record.runrecord import read_record
from servemon.loadgen.record.sections import (
    ClientRecord,
    PromSource,
    QueryRecord,
    ScrapeIntervalRecord,
    SignalsRead,
    TraceSource,
)
from servemon.loadgen.send.client import ClientSettings
from tests.support.records import RECORDS, key_paths

NAMES = sorted(p.name for p in RECORDS.iterdir())


@pytest.mark.parametrize("name", NAMES)
def test_a_record_of_the_previous_servemon_reads_and_writes_back_unchanged(
    name: str,
) -> None:
    """Every key and value of ``run.json`` survives the typed sections: a ``jq``
    line over run directories keeps working."""
    raw = json.loads((RECORDS / name / "run.json").read_text())
    info, summary = read_record(RECORDS / name)
    assert summary is not None
    assert info.to_json() == raw
    assert key_paths(info.to_json()) == key_paths(raw)


def test_the_sections_read_into_their_types() -> None:
    prefix = read_run(RECORDS / "prefix").info
    assert prefix.workload.prefix is not None
    assert prefix.workload.prefix.asked_hit == 0.5
    assert prefix.workload.trace is None
    assert prefix.target.embedded_simulator is not None
    assert prefix.target.embedded_simulator.profile == "tiny"
    assert prefix.engine_info["engine"] == "vllm"
    replay = read_run(RECORDS / "replay").info
    assert replay.workload.trace is not None
    assert replay.workload.trace.source == TraceSource("jsonl", 0, "skip")
    assert replay.workload.prefix is None
    ramp = read_run(RECORDS / "ramp").info
    assert ramp.terms() == parse_slo("ttft_p95<=0.5,error_rate<=0.01")
    assert ramp.slo == ["ttft_p95<=0.5", "error_rate<=0.01"]
    merged = read_run(RECORDS / "merged").info
    assert [m.shard for m in merged.merged_from or ()] == ["0/2", "1/2"]


def test_a_prometheus_run_keeps_its_sources_parts(tmp_path: Path) -> None:
    """A ``--prometheus`` run's ``server_metrics`` has keys no other run has (the
    queries, each signal's first read, the scrape interval's targets): written
    as the previous servemon wrote them, they read into their parts and back."""
    shutil.copytree(RECORDS / "ramp", tmp_path / "run")
    path = tmp_path / "run" / "run.json"
    raw = json.loads(path.read_text())
    raw["server_metrics"] = {
        "scrapes": 12,
        "errors": 1,
        "engine_info": None,
        "source": "prometheus",
        "prometheus": "http://127.0.0.1:9090",
        "select": 'job="vllm"',
        "stale_after_s": 30.0,
        "queries": {"waiting": {"value": "sum(x)", "age": "time() - y"}},
        "first_read_s": 0.5,
        "tries": 2,
        "signals_first_read_s": {"waiting": 0.5, "kv_usage": None},
        "scrape_interval": {
            "seconds": 15.0,
            "source": "prometheus",
            "matched_by": "series",
            "targets": {"vllm/a:8000": 15.0},
            "why": None,
        },
    }
    raw["energy"] = {
        "source": "prometheus",
        "first_read_s": 3.25,
        "tries": 3,
        "said": "energy: read from 3.2 s on",
    }
    path.write_text(json.dumps(raw))
    info, _ = read_record(tmp_path / "run")
    metrics = info.server_metrics
    assert metrics is not None
    assert metrics.prom_source == PromSource(
        "http://127.0.0.1:9090",
        'job="vllm"',
        30.0,
        {"waiting": QueryRecord("sum(x)", "time() - y")},
    )
    assert metrics.signals == SignalsRead({"waiting": 0.5, "kv_usage": None})
    assert metrics.scrape_interval == ScrapeIntervalRecord(
        15.0, "prometheus", "series", {"vllm/a:8000": 15.0}
    )
    assert info.energy is not None
    assert info.energy.tries == 3
    assert info.to_json() == raw


def test_a_record_from_before_the_sections_still_reads(tmp_path: Path) -> None:
    """An old record: the SLO as text alone, no energy, no server metrics (a run
    killed early), sections with fewer keys. Missing fields take defaults; the
    SLO's terms are parsed from its text."""
    (tmp_path / "run.json").write_text(
        json.dumps(
            {
                "kind": "ramp",
                "status": "running",
                "clock_origin": {"monotonic_s": 9.0, "utc": "2026-01-01T00:00:00Z"},
                "target": {"url": "http://x:8000", "model": "m"},
                "workload": {"spec": "random:prompt=8,output=8"},
                "client": {"max_connections": 10},
                "environment": {"python": "3.11.0", "gpus": "none"},
                "slo": ["ttft_p95<=0.5"],
            }
        )
    )
    info, summary = read_record(tmp_path)
    assert summary is None
    assert info.origin_s == 9.0
    assert info.terms() == parse_slo("ttft_p95<=0.5")
    assert info.slo == ["ttft_p95<=0.5"]
    assert info.server_metrics is None
    assert info.energy is None
    assert info.engine_info == {}
    assert info.workload.prefix is None
    assert info.client.max_connections == 10
    assert info.environment.gpus == "none"


def test_the_client_record_keeps_every_client_setting() -> None:
    """A setting added to :class:`ClientSettings` reaches ``run.json``."""
    recorded = {f.name for f in fields(ClientRecord)}
    assert {f.name for f in fields(ClientSettings)} <= recorded
    settings = ClientSettings(max_connections=7, timeout_s=3.0)
    record = ClientRecord.of(
        settings, loop="asyncio", cpu_dma_latency_us=None, live_metrics=None
    )
    for f in fields(ClientSettings):
        assert getattr(record, f.name) == getattr(settings, f.name)
