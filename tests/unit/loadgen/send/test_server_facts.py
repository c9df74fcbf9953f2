"""What servers say about a request, read defensively: nothing is guessed."""

from __future__ import annotations

import math
from typing import Any

import pytest

from servemon.loadgen.send.client import server_facts


def test_vllm_metrics_and_cached_tokens_in_seconds() -> None:
    facts = server_facts(
        {"prompt_tokens_details": {"cached_tokens": 32}},
        {
            "queue_time_ms": 12.5,
            "time_to_first_token_ms": 40,
            "generation_time_ms": 900,
        },
        None,
    )
    assert facts == {
        "cached_tokens": 32,
        "server_source": "vllm",
        "server_queue_s": 0.0125,
        "server_prefill_s": 0.04,
        "server_decode_s": 0.9,
    }


def test_llamacpp_timings_without_a_queue() -> None:
    facts = server_facts(
        {}, None, {"cache_n": 7, "prompt_n": 20, "prompt_ms": 3.5, "predicted_ms": 8.0}
    )
    assert facts == {
        "cached_tokens": 7,
        "server_source": "llamacpp",
        "server_prefill_s": 0.0035,
        "server_decode_s": 0.008,
    }


@pytest.mark.parametrize(
    ("usage", "metrics", "timings"),
    [
        ({}, None, None),
        ({"prompt_tokens_details": None}, {}, None),
        ({"prompt_tokens_details": {"cached_tokens": "5"}}, None, None),
        ({"prompt_tokens_details": {"cached_tokens": True}}, None, None),
        ({"prompt_tokens_details": {"cached_tokens": -1}}, None, None),
        ({}, {"queue_time_ms": math.nan, "time_to_first_token_ms": "1"}, None),
        ({}, {"queue_time_ms": -3, "time_to_first_token_ms": math.inf}, None),
        ({}, None, {"prompt_ms": None, "cache_n": 1.5}),
    ],
)
def test_anything_ill_typed_is_left_out(
    usage: dict[str, Any], metrics: dict[str, Any] | None, timings: Any
) -> None:
    assert server_facts(usage, metrics, timings) == {}
