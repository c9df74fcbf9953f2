"""The series vLLM 0.25-0.34 added, read back from the simulator's collector and
checked against the engine state they count; their names, types and label names
against vLLM's own expositions of those releases (``tests/data/vllm/``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from servemon.simulator.engine import Engine
from servemon.simulator.metrics import EngineMetrics
from tests.unit.simulator.test_engine import DEFAULT_ARGS, TINY, drive, step, tokens

DATA = Path(__file__).parents[2] / "data" / "vllm"
MODEL = "m"
LABELS = {"model_name": MODEL, "engine": "0"}


def make(dialect: str = "vllm-0.34", **overrides: object) -> tuple[Engine, Reader]:
    engine = Engine(TINY, dataclasses.replace(DEFAULT_ARGS, **overrides))
    registry = CollectorRegistry()
    registry.register(EngineMetrics(engine, MODEL, dialect))
    return engine, Reader(registry)


@dataclasses.dataclass
class Reader:
    registry: CollectorRegistry

    def __call__(self, name: str, **labels: str) -> float | None:
        wanted = {**LABELS, **labels}
        if name.startswith("vllm:admission_rejections"):
            del wanted["engine"]  # counted per model, as vLLM's front end does
        return self.registry.get_sample_value(name, wanted)

    def names(self) -> set[str]:
        return {family.name for family in self.registry.collect()}


# -- admission limits ------------------------------------------------------------


def test_a_request_over_the_queued_requests_limit_is_rejected_and_counted() -> None:
    engine, read = make(max_num_queued_reqs=2)
    engine.add_request("a", tokens(20), max_tokens=4)
    assert engine.admission_rejection(20) is None
    engine.add_request("b", tokens(20, 100), max_tokens=4)
    step(engine)  # one running, one waiting: both in flight
    assert engine.admission_rejection(20) == "max_num_queued_reqs"
    assert engine.admission_rejection(20) == "max_num_queued_reqs"
    rejected = "vllm:admission_rejections_total"
    assert read(rejected, reason="max_num_queued_reqs") == 2
    assert read(rejected, reason="max_num_queued_tokens") == 0
    drive(engine)
    assert engine.admission_rejection(20) is None
    assert read(rejected, reason="max_num_queued_reqs") == 2


def test_the_queued_tokens_limit_counts_prompts_until_their_first_token() -> None:
    engine, read = make(max_num_queued_tokens=100, max_num_batched_tokens=64)
    engine.add_request("a", tokens(100), max_tokens=4)
    assert engine.prefill_tokens == 100
    assert engine.admission_rejection(1) == "max_num_queued_tokens"
    step(engine)  # 64 of 100 prefilled: still in prefill
    assert engine.admission_rejection(1) == "max_num_queued_tokens"
    step(engine)  # the rest, and the first token
    assert engine.prefill_tokens == 0
    assert engine.admission_rejection(1) is None
    rejected = "vllm:admission_rejections_total"
    assert read(rejected, reason="max_num_queued_tokens") == 2
    assert read(rejected, reason="max_num_queued_reqs") == 0


def test_an_aborted_request_leaves_the_queued_tokens() -> None:
    engine, _ = make()
    req = engine.add_request("a", tokens(50), max_tokens=4)
    engine.abort(req)
    assert engine.prefill_tokens == 0


# -- the prefix cache ----------------------------------------------------------------


def test_cached_prompt_tokens_are_the_prefix_cache_hits() -> None:
    engine, read = make()
    engine.add_request("a", tokens(100), max_tokens=2)
    drive(engine)
    engine.add_request("b", tokens(100), max_tokens=2)  # 6 full blocks hit
    drive(engine)
    hits = read("vllm:prefix_cache_hits_total")
    assert hits == 96
    assert read("vllm:prompt_tokens_cached_total") == hits
    by_source = "vllm:prompt_tokens_by_source_total"
    assert read(by_source, source="local_cache_hit") == hits
    assert read(by_source, source="local_compute") == 200 - 96
    assert read(by_source, source="external_kv_transfer") == 0
    tiers = "vllm:prompt_tokens_cached_by_source_total"
    assert read(tiers, source="device") == hits
    for tier in ("host", "p2p", "disk", "external_unspecified"):
        assert read(tiers, source=tier) == 0
    computed = "vllm:request_prefill_kv_computed_tokens"
    assert read(f"{computed}_count") == 2
    assert read(f"{computed}_sum") == 100 + 4
    assert read(f"{computed}_bucket", le="5.0") == 1  # b computed 4 tokens
    assert read(f"{computed}_bucket", le="50.0") == 1
    assert read(f"{computed}_bucket", le="100.0") == 2


# -- why requests wait -------------------------------------------------------------


def test_waiting_requests_split_into_capacity_and_deferred() -> None:
    engine, read = make(lora_modules=("x", "y"), max_loras=1, max_cpu_loras=2)
    engine.add_request("a", tokens(20), max_tokens=4, lora="x")
    engine.add_request("b", tokens(20, 100), max_tokens=4, lora="y")  # LoRA budget
    engine.add_request("c", tokens(20, 200), max_tokens=4, lora="x")
    engine.schedule()
    waiting = "vllm:num_requests_waiting_by_reason"
    assert read(waiting, reason="deferred") == 1
    assert read(waiting, reason="capacity") == 0
    assert read("vllm:num_requests_waiting") == 1

    engine, read = make(max_num_seqs=1)
    for i in range(3):
        engine.add_request(str(i), tokens(20, 100 * i), max_tokens=4)
    engine.schedule()
    assert read(waiting, reason="capacity") == 2
    assert read(waiting, reason="deferred") == 0


def test_a_deferred_request_is_no_longer_deferred_once_admitted() -> None:
    engine, read = make(lora_modules=("x", "y"), max_loras=1, max_cpu_loras=2)
    engine.add_request("a", tokens(20), max_tokens=2, lora="x")
    engine.add_request("b", tokens(20, 100), max_tokens=2, lora="y")
    step(engine)
    assert engine.waiting_by_reason() == {"capacity": 0, "deferred": 1}
    drive(engine)
    assert engine.waiting_by_reason() == {"capacity": 0, "deferred": 0}
    assert read("vllm:num_requests_waiting_by_reason", reason="deferred") == 0


# -- preemptions per request -------------------------------------------------------


def test_preemptions_per_request_add_up_to_the_preemptions() -> None:
    # 6 blocks of 16: three requests growing to 48 tokens each cannot all stay.
    engine, read = make(num_gpu_blocks=6, max_model_len=64)
    for i in range(3):
        engine.add_request(str(i), tokens(16, 100 * i), max_tokens=32)
    drive(engine)
    total = read("vllm:num_preemptions_total")
    assert total
    hist = "vllm:request_num_preemptions"
    assert read(f"{hist}_count") == 3
    assert read(f"{hist}_bucket", le="+Inf") == 3
    assert read(f"{hist}_sum") == total


# -- the MFU estimates -------------------------------------------------------------


def test_the_estimates_are_the_cost_models_figures_with_the_flag() -> None:
    engine, read = make(enable_mfu_metrics=True)
    engine.add_request("a", tokens(40), max_tokens=3)
    drive(engine)
    computed = 40 + 2  # the prompt, then two decode steps (the last token is not fed)
    steps = 3
    assert read("vllm:estimated_flops_per_gpu_total") == pytest.approx(
        2 * TINY.params * computed
    )
    assert read("vllm:estimated_write_bytes_per_gpu_total") == pytest.approx(
        computed * TINY.kv_bytes_per_token
    )
    kv_read = 0 + 40 + 41  # what each step found cached before it
    assert read("vllm:estimated_read_bytes_per_gpu_total") == pytest.approx(
        steps * TINY.params * TINY.bytes_per_param + kv_read * TINY.kv_bytes_per_token
    )


def test_the_estimates_stay_at_zero_without_the_flag() -> None:
    engine, read = make()
    engine.add_request("a", tokens(40), max_tokens=3)
    drive(engine)
    for what in ("flops", "read_bytes", "write_bytes"):
        assert read(f"vllm:estimated_{what}_per_gpu_total") == 0


# -- which version has which ---------------------------------------------------------

V025 = {
    "vllm:num_requests_waiting_by_reason",
    "vllm:prompt_tokens_by_source",
    "vllm:prompt_tokens_cached",
    "vllm:request_prefill_kv_computed_tokens",
    "vllm:estimated_flops_per_gpu",
    "vllm:estimated_read_bytes_per_gpu",
    "vllm:estimated_write_bytes_per_gpu",
}
V032 = {
    "vllm:admission_rejections",
    "vllm:prompt_tokens_cached_by_source",
    "vllm:request_num_preemptions",
}


@pytest.mark.parametrize(
    ("dialect", "present", "absent"),
    [
        ("vllm", set(), V025 | V032),
        ("vllm-0.10", set(), V025 | V032),
        ("vllm-0.25", V025, V032),
        ("vllm-0.34", V025 | V032, set()),
    ],
)
def test_a_series_appears_only_in_the_versions_that_have_it(
    dialect: str, present: set[str], absent: set[str]
) -> None:
    _, read = make(dialect)
    names = read.names()
    assert present <= names
    assert not absent & names


@pytest.mark.parametrize(
    ("dialect", "fixture"),
    [("vllm-0.25", "vllm-0.25.1.txt"), ("vllm-0.34", "vllm-0.34.0.txt")],
)
def test_every_family_is_named_typed_and_labelled_as_that_vllm(
    dialect: str, fixture: str
) -> None:
    engine, read = make(dialect)
    engine.add_request("a", tokens(40), max_tokens=3)
    drive(engine)
    text = (DATA / fixture).read_text(encoding="utf-8")
    theirs = {f.name: f for f in text_string_to_metric_families(text)}
    for ours in read.registry.collect():
        if ours.name == "vllm:cache_config_info":
            continue  # an info gauge: its labels are the config
        assert ours.name in theirs, f"{ours.name} is not in vLLM {fixture}"
        family = theirs[ours.name]
        assert ours.type == family.type, ours.name
        assert label_names(ours) == label_names(family), ours.name


def label_names(family: Metric) -> set[str]:
    return {key for sample in family.samples for key in sample.labels} - {"le"}
