"""Generated rules under Prometheus' own promtool: they load, and every alert fires
when its series breach and stays silent on healthy series and without traffic."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from servemon.dashboards.rules import RULES_FILE, load_slo_config, write_rules
from tests.support.rule_tests import promtool_tests

PROMTOOL = shutil.which("promtool")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        PROMTOOL is None,
        reason="promtool not on PATH (Debian: apt-get install prometheus)",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "deploy" / "rules" / RULES_FILE

#: SLO files beside the example: short windows (as the end-to-end test runs them),
#: explicit pairs with other factors and no traffic minimum, engine SLOs only.
CONFIGS = {
    "example": (ROOT / "deploy" / "slos.example.yaml").read_text(),
    "short-windows": """
window: 28d
min_request_rate: 0.5
burn_windows: {scale: 0.0166667}
loadgen_slo: "ttft_p99<=0.35"
slos:
  - {name: ttft, type: latency, figure: ttft, threshold: 0.35, objective: 0.99}
  - {name: ttft-strict, type: latency, figure: ttft, threshold: 0.35, objective: 0.999}
  - {name: e2e, type: latency, figure: e2e, threshold: 10, objective: 0.95}
  - {name: ok, type: availability, objective: 0.99}
saturation:
  waiting_requests: {above: 4, for: 30s}
  kv_cache_usage: {above: 0.9, for: 30s}
  preemptions: {window: 30s, for: 30s}
  gpu_memory: {above: 0.95, for: 1m}
health:
  target_down: {for: 30s}
  exporter_absent: {for: 30s}
  engine_metrics_absent: {for: 1m}
  client_stalled: {for: 1m}
""",
    "explicit-pairs": """
min_request_rate: 0
runbook_url: https://wiki.example.com/runbook
burn_windows:
  page: [{long: 20m, short: 2m, factor: 10}]
  ticket: [{long: 2h, short: 10m, factor: 2.5}, {long: 6h, short: 30m, factor: 1.2}]
slos:
  - {name: tpot, type: latency, figure: tpot, threshold: 0.05, objective: 0.98}
  - {name: itl, type: latency, figure: itl, threshold: 0.1, objective: 0.99}
saturation: {waiting_requests: {above: 2.5, for: 1m, severity: page}}
""",
    "engine-only": """
slos:
  - {name: ttft, type: latency, figure: ttft, source: engine, threshold: 2.5,
     objective: 0.95}
  - {name: itl, type: latency, figure: itl, source: engine, threshold: 0.075,
     objective: 0.99}
  - {name: e2e, type: latency, figure: e2e, source: engine, threshold: 60,
     objective: 0.99}
  - {name: aborts, type: availability, source: engine, objective: 0.99}
health: {exporter_absent: null, client_stalled: null}
""",
}


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )


def generate(tmp_path: Path, name: str) -> tuple[list[Path], Path]:
    slo_file = tmp_path / "slos.yaml"
    slo_file.write_text(CONFIGS[name])
    config = load_slo_config(slo_file)
    rule_files = write_rules(config, tmp_path / "rules")
    tests = promtool_tests(config, [str(p) for p in rule_files])
    test_file = tmp_path / "rules_test.yaml"
    test_file.write_text(yaml.safe_dump(tests, sort_keys=False))
    return rule_files, test_file


def test_the_committed_rules_pass_promtool_check() -> None:
    done = promtool("check", "rules", str(COMMITTED), cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.parametrize("name", CONFIGS)
def test_generated_rules_pass_promtool_check(tmp_path: Path, name: str) -> None:
    rule_files, _ = generate(tmp_path, name)
    done = promtool("check", "rules", *map(str, rule_files), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.parametrize("name", CONFIGS)
def test_every_alert_fires_and_stays_silent_under_promtool(
    tmp_path: Path, name: str
) -> None:
    _, test_file = generate(tmp_path, name)
    done = promtool("test", "rules", str(test_file), cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-20_000:]
    assert "SUCCESS" in done.stdout
