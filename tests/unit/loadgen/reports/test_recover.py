"""``servemon merge RUN_DIR --spool FILE...``: a killed fleet run takes in the
records its workers kept, into a new run directory, with exact counts."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from servemon.commands.runs import merge_command
from servemon.core.errors import ConfigError
from servemon.loadgen.record.fleet import FleetRecord, WorkerRecord
from servemon.loadgen.record.line import request_line
from servemon.loadgen.record.record import RunDirectory, read_jsonl, read_run
from servemon.loadgen.record.runrecord import RunInfo, StageResult, write_record
from servemon.loadgen.reports.recover import recover_spools
from servemon.loadgen.send.timing import Outcome, RequestTiming

TAG = "abc123"


def timing(index: int, **fields: object) -> RequestTiming:
    at = 100.0 + index * 0.1
    base: dict[str, object] = {
        "request_id": f"{TAG}-{index}",
        "scheduled_s": at,
        "sent_s": at + 0.001,
        "end_s": at + 0.05,
        "outcome": Outcome.OK,
        "first_chunk_s": at + 0.01,
        "content_s": (at + 0.02, at + 0.03),
        "output_tokens": 2,
        "prompt_tokens": 16,
    }
    return RequestTiming(**{**base, **fields})  # type: ignore[arg-type]


def killed_run(tmp_path: Path) -> Path:
    """A fleet run whose coordinator died: requests 0-4 recorded (4 of worker 0's
    and worker 1's, and 5 cancelled when worker 1 was lost); 6-9 never came."""
    rundir = RunDirectory(tmp_path / "runs" / "killed")
    for index in range(5):
        rundir.append_request(timing(index, worker=index % 2))
    rundir.append_request(
        timing(5, outcome=Outcome.CANCELLED, error="worker 1 lost", worker=1)
    )
    rundir.close()
    workers = [WorkerRecord(0, "w0"), WorkerRecord(1, "w1")]
    info = RunInfo(
        kind="ramp",
        status="running",
        clock_origin=rundir.clock_origin,
        stages=[StageResult(0, "10 req/s", target_rate=10.0, planned_s=1.0)],
        fleet=FleetRecord("127.0.0.1:9500", 2, workers=workers),
    )
    write_record(rundir.path, info)
    return rundir.path


def spool(path: Path, *lines: dict[str, object] | str) -> Path:
    """A spool as a worker writes it (``worker`` null: the worker does not know
    its index)."""
    with path.open("w", encoding="utf-8") as handle:
        for line in lines:
            text = line if isinstance(line, str) else orjson.dumps(line).decode()
            handle.write(text + "\n")
    return path


def spools(tmp_path: Path) -> list[Path]:
    folder = tmp_path / "spool"
    folder.mkdir()
    other = {**request_line(timing(0)), "id": "fff000-0"}
    w0 = spool(
        folder / "w0.jsonl",
        other,  # the worker's earlier run
        *(request_line(timing(i)) for i in (0, 2, 4, 6, 8)),
        '{"id": "abc123-1',  # cut by a kill
    )
    w1 = spool(
        folder / "w1.jsonl",
        *(request_line(timing(i)) for i in (1, 3, 5, 7)),
        {"hello": 1},
        request_line(timing(9, outcome=Outcome.CANCELLED, error="cancelled")),
    )
    return [w0, w1]


def test_the_spools_fill_in_what_the_killed_coordinator_never_wrote(
    tmp_path: Path,
) -> None:
    run = killed_run(tmp_path)
    before = (run / "requests.jsonl").read_bytes()
    w0, w1 = spools(tmp_path)
    result = recover_spools(run, [w0, w1])

    first, second = result.spools
    assert (first.worker, first.recovered, first.replaced) == (0, 2, 0)
    assert (first.present, first.other_runs) == (3, 1)
    assert first.unreadable == [f"{w0}:7: not JSON (cut by a kill?)"]
    assert (second.worker, second.recovered, second.replaced) == (1, 2, 1)
    assert (second.present, second.other_runs) == (2, 0)
    assert len(second.unreadable) == 1
    assert second.unreadable[0].startswith(f"{w1}:5: not a request record")

    # A new directory beside the run; the run is left as it was.
    assert result.path.parent == run.parent
    assert (run / "requests.jsonl").read_bytes() == before
    assert not (run / "summary.json").exists()
    lines = list(read_jsonl(result.path / "requests.jsonl"))
    by_id = {line["id"]: line for line in lines}
    assert len(lines) == len(by_id) == 10
    assert all(by_id[f"{TAG}-{i}"]["worker"] == i % 2 for i in range(10))
    # The worker's record of 5 replaced the coordinator's "worker 1 lost".
    assert by_id[f"{TAG}-5"]["outcome"] == "ok"
    assert by_id[f"{TAG}-9"]["outcome"] == "cancelled"
    # Times stay on the run's clock (the spools' lines were on it already).
    assert by_id[f"{TAG}-8"]["scheduled_s"] == pytest.approx(100.8)

    # The summary, rebuilt as a killed run's, counts every request.
    data = read_run(result.path)
    assert data.record.status == "unfinished"
    assert data.overall.requests == 10
    assert data.overall.ok == 9
    assert data.record.merged_from == [str(run), str(w0), str(w1)]
    info = json.loads((result.path / "run.json").read_text())
    assert (
        info["clock_origin"]
        == json.loads((run / "run.json").read_text())["clock_origin"]
    )
    assert info["merged_from"][1:] == [
        {"path": str(w0), "worker": 0, "recovered": 2, "replaced": 0},
        {"path": str(w1), "worker": 1, "recovered": 2, "replaced": 1},
    ]
    assert (result.path / "report.html").stat().st_size > 0


def test_merge_with_spools_says_what_each_spool_gave(tmp_path: Path) -> None:
    run = killed_run(tmp_path)
    w0, w1 = spools(tmp_path)
    out = tmp_path / "recovered"
    argv = [str(run), "--spool", str(w0), "--spool", str(w1), "--out", str(out)]
    result = CliRunner().invoke(merge_command, argv)
    assert result.exit_code == 0, result.output
    assert (
        f"{w0} (worker 0): 2 recovered, 0 replacing cancelled records, 3 already "
        "in the run, 1 of other runs, 1 unreadable"
    ) in result.stdout
    assert f"{w1} (worker 1): 2 recovered, 1 replacing" in result.stdout
    assert f"skipped {w0}:7: not JSON" in result.stderr
    (made,) = out.iterdir()
    assert f"recovered run directory: {made}" in result.stdout


def test_a_spool_not_named_in_run_json_is_told_by_the_run_s_records(
    tmp_path: Path,
) -> None:
    # A worker that joined after run.json was written: the run's records of its
    # requests (1 and 3) name its index.
    run = killed_run(tmp_path)
    late = spool(tmp_path / "late.jsonl", *(request_line(timing(i)) for i in (1, 3, 7)))
    (count,) = recover_spools(run, [late]).spools
    assert (count.worker, count.recovered, count.present) == (1, 1, 2)


def test_a_spool_whose_worker_cannot_be_told_is_refused(tmp_path: Path) -> None:
    run = killed_run(tmp_path)
    stray = spool(tmp_path / "w7.jsonl", request_line(timing(6)))
    with pytest.raises(ConfigError, match=r"w7\.jsonl: which worker .* not known"):
        recover_spools(run, [stray])
    assert list((tmp_path / "runs").iterdir()) == [run]  # nothing written
    result = CliRunner().invoke(merge_command, [str(run), str(run), "--spool", "x"])
    assert result.exit_code != 0
    assert "--spool takes one fleet run directory" in str(result.exception)
