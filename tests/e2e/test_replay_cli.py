"""``servemon trace synth`` then ``servemon replay``, as a user runs them; a bad
trace line fails before anything starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.publictraces import BURSTGPT

pytestmark = pytest.mark.e2e

SERVEMON = [sys.executable, "-m", "servemon"]


def servemon(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERVEMON, *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=tmp_path,
    )


@pytest.mark.report
def test_a_synthetic_trace_replays_against_the_built_in_simulator(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "trace.jsonl"
    made = servemon(
        tmp_path,
        "trace",
        "synth",
        "--out",
        str(trace),
        "--duration",
        "30",
        "--rate",
        "1",
        "--turns",
        "3",
        "--think",
        "3",
        "--input-median",
        "64",
        "--output-median",
        "8",
        "--seed",
        "2",
    )
    assert made.returncode == 0, made.stderr
    assert "prefix-cache hit ratio from its hash_ids" in made.stdout
    lines = trace.read_text().splitlines()
    assert {"timestamp", "input_length", "output_length", "hash_ids"} <= set(
        json.loads(lines[0])
    )
    done = servemon(
        tmp_path,
        "replay",
        str(trace),
        "--to",
        "20",
        "--rate-scale",
        "4",
        "--sim-profile",
        "tiny",
        "--metrics-port",
        "0",
        "--out",
        "runs",
    )
    assert done.returncode == 0, done.stderr
    assert "servemon replay: completed" in done.stdout
    (run,) = (tmp_path / "runs").glob("*-replay")
    stamps = [json.loads(x)["timestamp"] for x in lines]
    sent = [t for t in stamps if t - min(stamps) < 20_000]  # --to: from the first
    requests = (run / "requests.jsonl").read_text().splitlines()
    assert len(requests) == len(sent)
    info = json.loads((run / "run.json").read_text())
    assert info["kind"] == "replay"
    assert info["config"]["rate_scale"] == 4.0
    assert (run / "report.html").stat().st_size > 10_000


def test_a_bad_trace_line_fails_before_anything_starts(tmp_path: Path) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 2}\n'
        '{"timestamp": 5, "input_length": "ten", "output_length": 2}\n'
    )
    done = servemon(tmp_path, "replay", str(trace), "--out", "runs")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"{trace}: line 2: input_length: must be a whole number" in line
    assert "simulator" not in done.stdout
    assert not (tmp_path / "runs").exists()


def _lengths_trace(path: Path, lengths: list[int], output: int = 8) -> Path:
    """A JSONL trace of prompt lengths, one request every 100 ms."""
    path.write_text(
        "".join(
            json.dumps(
                {"timestamp": i * 0.1, "prompt_tokens": n, "output_tokens": output}
            )
            + "\n"
            for i, n in enumerate(lengths)
        )
    )
    return path


def _replay(
    tmp_path: Path, trace: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    return servemon(
        tmp_path,
        "replay",
        str(trace),
        "--sim-profile",
        "tiny",
        "--metrics-port",
        "0",
        "--out",
        "runs",
        *args,
    )


def _rows(
    tmp_path: Path, policy: str
) -> tuple[dict[str, object], list[dict[str, object]]]:
    (run,) = (tmp_path / "runs").glob("*-replay")
    rows = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
    record = json.loads((run / "run.json").read_text())
    run.rename(tmp_path / f"run-{policy}")
    return record, rows


def test_prompts_longer_than_131071_tokens_replay_where_the_context_takes_them(
    tmp_path: Path,
) -> None:
    # A context of 200,000 tokens (the simulator's /v1/models says so, as vLLM's
    # max_model_len does) takes a prompt of 150,000 tokens.
    trace = _lengths_trace(tmp_path / "long.jsonl", [150_000, 64])
    done = _replay(
        tmp_path,
        trace,
        "--sim-arg=--max-model-len=200000",
        "--sim-arg=--num-gpu-blocks=16000",
    )
    assert done.returncode == 0, done.stderr
    record, rows = _rows(tmp_path, "long")
    assert [r["outcome"] for r in rows] == ["ok", "ok"]
    assert sorted(r["prompt_tokens"] for r in rows)[-1] >= 150_000
    assert record["workload"]["context_tokens"] == 200_000
    assert record["workload"]["entries_over_context"] == 0


@pytest.mark.parametrize("policy", ["error", "skip", "truncate", "send"])
def test_a_trace_longer_than_the_targets_context_follows_the_chosen_policy(
    tmp_path: Path, policy: str
) -> None:
    # Two of five requests need more than the context of 4,096 tokens (with their
    # 8 tokens of output).
    trace = _lengths_trace(tmp_path / "t.jsonl", [100, 5_000, 200, 4_090, 300])
    done = _replay(
        tmp_path, trace, "--sim-arg=--max-model-len=4096", "--over-context", policy
    )
    if policy == "error":
        assert done.returncode == 2
        (line,) = done.stderr.strip().splitlines()
        assert "2 of 5 requests do not fit the target's context of 4096" in line
        assert "line 2, needs 5008" in line
        assert "--over-context" in line
        assert not (tmp_path / "runs").exists() or not list(
            (tmp_path / "runs").glob("*-replay")
        )
        return
    assert done.returncode == 0, done.stderr
    record, rows = _rows(tmp_path, policy)
    assert record["workload"]["over_context"] == policy
    assert record["workload"]["entries_over_context"] == 2
    outcomes = sorted(str(r["outcome"]) for r in rows)
    stage = record["stages"][0]
    if policy == "skip":
        assert outcomes == ["ok"] * 3
        assert stage["skipped"] == 2
        assert stage["sent"] == 3
    elif policy == "truncate":
        assert outcomes == ["ok"] * 5
        assert max(int(str(r["prompt_tokens"])) for r in rows) <= 4096 - 8
    else:
        assert outcomes == ["http_error", "http_error", "ok", "ok", "ok"]


def test_burstgpt_replays_as_downloaded_its_failed_lines_skipped_or_kept(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "BurstGPT_1.csv"
    trace.write_text(BURSTGPT)
    skipped = _replay(tmp_path, trace, "--rate-scale", "40")
    assert skipped.returncode == 0, skipped.stderr
    assert "trace: 1 failed lines (Response tokens 0) skipped, of 3" in skipped.stdout
    record, rows = _rows(tmp_path, "skipped")
    assert len(rows) == 2
    assert record["workload"]["failed_lines"] == 1
    kept = _replay(tmp_path, trace, "--rate-scale", "40", "--keep-failed")
    assert kept.returncode == 0, kept.stderr
    assert "1 failed lines (Response tokens 0) sent" in kept.stdout
    record, rows = _rows(tmp_path, "kept")
    assert len(rows) == 3
    assert record["workload"]["spec"].endswith(",failed=keep")
    assert record["workload"]["failed_lines_policy"] == "keep"
