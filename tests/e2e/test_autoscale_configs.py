"""``servemon autoscale``'s files checked offline by the tools that read them.

- the recording rule: ``promtool check rules``, and ``promtool test rules`` on
  series of two pods (one with two ranks) and a pod of another workload;
- the HPA: kubernetes-validate, strict, at the oldest Kubernetes the manifests
  support and the newest it knows;
- the KEDA ScaledObject: kubernetes-validate has no CRDs, so it is held to
  ``tests/data/keda/scaledobject.schema.json``, a JSON schema of the fields servemon
  writes derived from KEDA's CRD (its ``$comment`` names the commit).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from servemon.cli import cli
from tests.support.capacityruns import write_capacity_run

pytestmark = pytest.mark.e2e

SCHEMA = Path(__file__).parents[1] / "data" / "keda" / "scaledobject.schema.json"
K8S_OLDEST = "1.29"
#: Capacity 10 req/s; the queue read 0, 1, 2, 1 after the settle: mean 1; at 11
#: req/s, 5.
SAMPLES = {1: [(t, [(w, 0.1)]) for t, w in ((1.5, 0.0), (2.5, 1.0), (3.5, 2.0))]}
SAMPLES[1].append((4.5, [(1.0, 0.1)]))
SAMPLES[2] = [(2.0, [(5.0, 0.5)])]
#: TTFTs (the SLO: ttft_p95<=0.5): 0.5 of the limit at 10 req/s, 1.5 at 11: the
#: queue at the limit is halfway, 3.
TTFTS = {0: [0.1], 1: [0.25], 2: [0.75]}
RECORD = "namespace_workload:servemon_engine_requests_waiting:per_pod_avg1m"
LLM_VLLM = f'{RECORD}{{namespace="llm",workload="vllm"}}'


def autoscale(*args: str) -> Any:
    return CliRunner().invoke(cli, ["autoscale", *args], catch_exceptions=False)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    run = write_capacity_run(
        tmp_path / "run", (8.0, 10.0, 11.0), (True, True, False), SAMPLES, ttfts=TTFTS
    )
    out = tmp_path / "out"
    result = autoscale(
        str(run),
        "--target-ref",
        "deployment/vllm",
        "--namespace",
        "llm",
        "--max-replicas",
        "4",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    return out


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool not found (Debian package prometheus)")
    return found


def test_threshold_is_the_level_at_the_limit_less_headroom_and_says_so(
    files: Path,
) -> None:
    text = (files / "keda-scaledobject.yaml").read_text(encoding="utf-8")
    assert "# threshold = 3 x (1 - 0.2) = 2.4\n" in text
    assert (
        "at the SLO's limit, between the 10 req/s step (at 0.50 of the limit: 1) "
        "and the 11 req/s step (1.50: 5), each the mean after the 1 s settle: 3 "
        "per replica" in text
    )
    trigger = load(files / "keda-scaledobject.yaml")["spec"]["triggers"][0]
    assert trigger["metadata"]["threshold"] == "2.4"
    hpa = load(files / "hpa.yaml")
    assert hpa["spec"]["metrics"][0]["external"]["target"]["value"] == "2.4"


def test_level_at_capacity_is_the_capacity_steps_mean(tmp_path: Path) -> None:
    run = write_capacity_run(
        tmp_path / "run", (8.0, 10.0, 11.0), (True, True, False), SAMPLES, ttfts=TTFTS
    )
    result = autoscale(
        str(run),
        *("--target-ref", "deployment/vllm", "--level-at", "capacity"),
        *("--format", "keda"),
    )
    assert result.exit_code == 0, result.output
    assert "# threshold = 1 x (1 - 0.2) = 0.8\n" in result.output
    assert (
        "during the 10 req/s step (4 samples after the 1 s settle): mean 1 per replica"
        in result.output
    )


def test_recording_rule_passes_promtool_and_averages_per_pod(
    files: Path, tmp_path: Path
) -> None:
    tool = promtool()
    check = subprocess.run(
        [tool, "check", "rules", str(files / "autoscale-rules.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    waiting = "servemon_engine_requests_waiting"
    series = [
        (f'{waiting}{{namespace="llm",pod="vllm-a",rank="0"}}', "1x12"),
        (f'{waiting}{{namespace="llm",pod="vllm-a",rank="1"}}', "2x12"),
        (f'{waiting}{{namespace="llm",pod="vllm-b",rank="0"}}', "1x12"),
        (f'{waiting}{{namespace="llm",pod="router-a",rank="0"}}', "50x12"),
        (f'{waiting}{{namespace="other",pod="vllm-c",rank="0"}}', "50x12"),
    ]
    tests = {
        "rule_files": [str(files / "autoscale-rules.yaml")],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "promql_expr_test": [
                    {
                        "expr": LLM_VLLM,
                        "eval_time": "2m",
                        # (1 + 2) for vllm-a, 1 for vllm-b: 2 per replica.
                        "exp_samples": [
                            {
                                "labels": LLM_VLLM,
                                "value": 2,
                            }
                        ],
                    }
                ],
            }
        ],
    }
    test_file = tmp_path / "autoscale-test.yaml"
    test_file.write_text(yaml.safe_dump(tests), encoding="utf-8")
    proc = subprocess.run(
        [tool, "test", "rules", str(test_file)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hpa_validates_against_kubernetes_schemas(files: Path) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    hpa = load(files / "hpa.yaml")
    for version in (K8S_OLDEST, kv.utils.latest_version()):
        kv.validate(hpa, version, strict=True)
    bad = json.loads(json.dumps(hpa))
    bad["spec"]["metrics"][0]["external"]["target"]["averagValue"] = "1"
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S_OLDEST, strict=True)


def test_scaled_object_validates_against_kedas_fields(files: Path) -> None:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    scaled = load(files / "keda-scaledobject.yaml")
    jsonschema.validate(scaled, schema)
    for path, value in (
        (("spec", "triggers", 0, "metadata", "threshold"), 0.8),  # not a string
        (("spec", "minReplicas"), 1),  # the HPA's spelling, not KEDA's
        (("spec", "triggers", 0, "metricType"), "Average"),
    ):
        bad = json.loads(json.dumps(scaled))
        where = bad
        for key in path[:-1]:
            where = where[key]
        where[path[-1]] = value
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    del scaled["spec"]["triggers"][0]["metadata"]["query"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(scaled, schema)


def test_an_empty_queue_at_capacity_is_a_one_line_error(tmp_path: Path) -> None:
    empty = {1: [(2.0, [(0.0, 0.1)])]}
    run = write_capacity_run(tmp_path / "run", (8.0, 10.0), (True, True), empty)
    result = CliRunner().invoke(
        cli, ["autoscale", str(run), "--target-ref", "deployment/vllm"]
    )
    assert result.exit_code == 2
    assert "no level to scale on" in result.output
    kv = autoscale(
        str(run),
        "--target-ref",
        "deployment/vllm",
        "--signal",
        "kv_cache",
        "--format",
        "keda",
    )
    assert kv.exit_code == 0, kv.output
    assert "threshold: '0.08'" in kv.output
