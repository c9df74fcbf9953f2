"""What a run keeps of each line of the server's signals for its drivers: one
:class:`~servemon.loadgen.record.reading.Reading`, whichever sampler wrote the line."""

from __future__ import annotations

from dataclasses import fields

from servemon.core.signals import SIGNALS
from servemon.loadgen.record.reading import Reading, reading_of
from servemon.loadgen.run.sampler import parse_engine_samples


def family(kind: str, name: str, values: list[float]) -> str:
    """One family, a sample per data-parallel rank."""
    suffix = "_total" if kind == "counter" else ""
    return f"# HELP {name} x\n# TYPE {name} {kind}\n" + "".join(
        f'{name}{suffix}{{model_name="m",engine="{rank}"}} {value}\n'
        for rank, value in enumerate(values)
    )


def test_a_scrape_of_metrics_is_read_once_ranks_summed_kv_the_fullest() -> None:
    text = (
        family("gauge", "vllm:num_requests_running", [3.0, 4.0])
        + family("gauge", "vllm:num_requests_waiting", [2.0, 3.0])
        + family("gauge", "vllm:kv_cache_usage_perc", [0.5, 0.75])
        + family("counter", "vllm:num_preemptions", [1.0, 2.0])
        + family("counter", "vllm:prefix_cache_hits", [30.0, 30.0])
        + family("counter", "vllm:prefix_cache_queries", [90.0, 90.0])
        + family("counter", "vllm:prompt_tokens", [100.0, 100.0])
    )
    samples, _info = parse_engine_samples(text)
    reading = reading_of({"mono_s": 7.5, "samples": samples})

    assert reading == Reading(
        7.5,
        waiting=5.0,
        running=7.0,
        kv_cache_usage=0.75,
        preemptions=3.0,
        prefix_hits=60.0,
        prefix_queries=180.0,
    )


def test_a_target_without_a_series_reads_none_never_zero() -> None:
    samples, _info = parse_engine_samples(
        family("gauge", "vllm:num_requests_running", [2.0])
    )
    reading = reading_of({"mono_s": 1.0, "samples": samples})
    assert reading is not None
    assert (reading.running, reading.waiting, reading.kv_cache_usage) == (
        2.0,
        None,
        None,
    )
    assert not reading.judged()


def test_prometheus_lines_give_every_signal_and_an_error_is_a_blind_reading() -> None:
    signals = {name: float(i) for i, name in enumerate(SIGNALS)}
    reading = reading_of({"mono_s": 2.0, "source": "prometheus", "signals": signals})
    assert reading is not None
    assert {name: reading.signal(name) for name in SIGNALS} == signals

    blind = reading_of({"mono_s": 3.0, "source": "prometheus", "error": "timeout"})
    assert blind == Reading(3.0)
    assert not blind.judged()


def test_failed_scrapes_and_energy_lines_are_no_reading() -> None:
    assert reading_of({"mono_s": 1.0, "error": "ClientConnectorError: refused"}) is None
    assert reading_of({"mono_s": 1.0, "energy": {"joules": 5.0}}) is None


def test_a_reading_has_a_field_for_every_signal_prometheus_answers() -> None:
    # A signal added to core.signals without a field here would be dropped.
    assert set(SIGNALS) <= {f.name for f in fields(Reading)}
