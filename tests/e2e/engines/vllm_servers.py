"""The vLLM tier's two servers: how they are started, and a starter that runs them
ahead of pytest.

vLLM's start is a chain of processes that each import torch (the API server, the
engine core, its worker) and then a warm-up: about 70 s of one core on the 2-core
machine, which the tier's first test waited for. ``scripts/test`` starts them
right after installing vLLM instead, so that the start overlaps the rest of the
setup and the checks::

    .venv-vllm/bin/python tests/e2e/engines/vllm_servers.py start DIR
    .venv-vllm/bin/python tests/e2e/engines/vllm_servers.py stop DIR

``start`` makes the tiny model in ``DIR/model`` (``make_models.py --vllm``),
starts both servers on free loopback ports, writes ``DIR/started.json`` (the
model, and each server's port, process id, log and command line) and returns at
once; the servers run on, each in a process group of its own in the caller's
session (vLLM and its client must share a session: docs/testing.md). The tier's
session fixture adopts them when ``SERVEMON_VLLM_STARTED`` names that file, waits
for their health and kills them at its end; ``stop`` kills what is left (scripts/test
on its way out). Only the standard library: it runs with vLLM's interpreter,
which has no pytest.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"

#: The model name vLLM serves (and the exporter's ``model`` label).
VLLM_MODEL = "servemon-tiny"
#: KV cache blocks vLLM is pinned to. Its CPU build pages the cache in blocks of 128
#: tokens (``cache_config_info``'s ``block_size``): 64 blocks hold 8,192 tokens, room
#: for the seed sweep's 8 requests in flight and small enough that a load of long
#: prompts overflows it (preemptions, usage near 1, a queue).
VLLM_BLOCKS = 64
VLLM_BLOCK_SIZE = 128
VLLM_MAX_NUM_SEQS = 16
#: The second vLLM, for holding KV usage: half of 1,024 blocks is about 130
#: requests of 256 + 300 tokens (few enough that how many happen to be in flight is
#: not most of the signal), with slots to spare.
VLLM_LARGE_BLOCKS = 1024
VLLM_LARGE_MAX_NUM_SEQS = 256
#: The tier's servers: ``small`` for every test but one, ``large`` for holding KV
#: usage. (blocks, max_num_seqs) each.
SHAPES: Mapping[str, tuple[int, int]] = {
    "small": (VLLM_BLOCKS, VLLM_MAX_NUM_SEQS),
    "large": (VLLM_LARGE_BLOCKS, VLLM_LARGE_MAX_NUM_SEQS),
}
#: vLLM's environment in the tests: the cache's room (GiB; the block count is pinned
#: by ``--num-gpu-blocks-override``) and a quiet log.
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
#: What every engine the tests start runs with: nothing from a model hub.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
#: The starter's manifest, in its folder.
MANIFEST = "started.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def engine_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment, offline, with ``extra``."""
    return {**os.environ, **OFFLINE, **(extra or {})}


def make_model(out: Path, timeout_s: float = 300) -> Path:
    """The tiny model in vLLM's shape (head size 64), made with vLLM's interpreter
    into ``out``; its Hugging Face folder."""
    subprocess.run(
        [str(VLLM_PYTHON), str(HERE / "make_models.py"), str(out), "--vllm"],
        check=True,
        capture_output=True,
        timeout=timeout_s,
        env=engine_env(),
    )
    return Path(json.loads((out / "models.json").read_text())["hf"])


def vllm_argv(
    hf: Path,
    port: int,
    blocks: int = VLLM_BLOCKS,
    max_num_seqs: int = VLLM_MAX_NUM_SEQS,
) -> list[str]:
    """vLLM's OpenAI server as the tests run it: prefix caching on, the cache pinned
    small, cached tokens and per-request metrics in every answer."""
    return [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        *("--model", str(hf), "--served-model-name", VLLM_MODEL),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--max-model-len", "4096", "--dtype", "float32"),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--enable-per-request-metrics",
        *("--num-gpu-blocks-override", str(blocks)),
        *("--max-num-seqs", str(max_num_seqs)),
        "--disable-uvicorn-access-log",
    ]


def spawn_vllm(argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """One vLLM server, in a process group of its own in this session."""
    with log.open("wb") as out:
        return subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            process_group=0,
            env=engine_env(VLLM_ENV),
        )


def start(folder: Path) -> dict[str, object]:
    """The model made and both servers started (not yet healthy); the manifest,
    also written to ``folder/started.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    hf = make_model(folder / "model")
    engines: dict[str, object] = {}
    for size, (blocks, max_num_seqs) in SHAPES.items():
        port = free_port()
        argv = vllm_argv(hf, port, blocks, max_num_seqs)
        log = folder / f"vllm-{size}.log"
        proc = spawn_vllm(argv, log)
        engines[size] = {"port": port, "pid": proc.pid, "log": str(log), "argv": argv}
    manifest: dict[str, object] = {"model": str(hf), "engines": engines}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def stop(folder: Path) -> None:
    """Kill the process groups a :func:`start` left (those gone are skipped)."""
    path = folder / MANIFEST
    if not path.exists():
        return
    engines = json.loads(path.read_text())["engines"]
    for engine in engines.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(engine["pid"]), signal.SIGKILL)


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print("usage: vllm_servers.py start|stop DIR", file=sys.stderr)  # noqa: T201
        return 2
    folder = Path(argv[1])
    if argv[0] == "start":
        start(folder)
    else:
        stop(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
