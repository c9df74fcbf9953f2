"""The run directory: what a load run leaves behind, readable however it ended.

::

    RUN_DIR/
      run.json             config (secrets redacted), command line, versions, target,
                           client limits, clock origin, stage timeline, status
      requests.jsonl       one line per finished request, appended and flushed as it
                           finishes (a kill -9 leaves it valid up to the last line)
      server_metrics.jsonl the target's /metrics, sampled (see loadgen.sampler)
      summary.json         per stage or level, and overall
      summary.csv          the same, one row per stage, flat

``run.json`` is written at the start (``status: running``) and rewritten at the end.
The format of a ``requests.jsonl`` line is documented in ``docs/metrics.md`` and is
stable: fields are only ever added.
"""

from __future__ import annotations

import csv
import json
import os
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from loadgen.slo import parse_slo
from loadgen.summary import summarize_stages
from loadgen.timing import Outcome, RequestTiming, TokenSource

__all__ = [
    "RECORD_VERSION",
    "UNFINISHED",
    "RunDirectory",
    "rebuild_summary",
    "request_line",
    "timing_from_line",
    "write_summary",
]

RECORD_VERSION = 1


def request_line(t: RequestTiming) -> dict[str, Any]:
    """The ``requests.jsonl`` form of one request (monotonic seconds)."""
    return {
        "id": t.request_id,
        "stage": t.stage,
        "outcome": str(t.outcome),
        "status": t.status,
        "scheduled_s": t.scheduled_s,
        "sent_s": t.sent_s,
        "headers_s": t.headers_s,
        "first_chunk_s": t.first_chunk_s,
        "first_content_s": t.first_content_s,
        "end_s": t.end_s,
        "ttft_s": t.ttft,
        "ttfc_s": t.time_to_first_chunk,
        "e2e_s": t.e2e,
        "tpot_s": t.tpot,
        "itl_s": t.itl,
        "dispatch_lag_s": t.dispatch_lag,
        "ttft_from_scheduled_s": t.ttft_from_scheduled,
        "e2e_from_scheduled_s": t.e2e_from_scheduled,
        "prompt_tokens": t.prompt_tokens,
        "output_tokens": t.output_tokens,
        "token_source": str(t.token_source),
        "finish_reason": t.finish_reason,
        "error": t.error,
        "done_sentinel": t.done_sentinel,
        "reconnects": t.reconnects,
        "cached_tokens": t.cached_tokens,
        "cached_fraction": t.cached_fraction,
        "server_source": t.server_source,
        "server_queue_s": t.server_queue_s,
        "server_prefill_s": t.server_prefill_s,
        "server_decode_s": t.server_decode_s,
        "server_ttft_s": t.server_ttft,
        "ttft_gap_s": t.ttft_gap,
    }


def timing_from_line(line: dict[str, Any], shift_s: float = 0.0) -> RequestTiming:
    """A ``requests.jsonl`` line back as a timing (times moved by ``shift_s``).

    Content chunk times are rebuilt from ``first_content_s`` and the ITL gaps.
    """

    def at(key: str) -> float | None:
        value = line.get(key)
        return None if value is None else float(value) + shift_s

    content: list[float] = []
    first = at("first_content_s")
    if first is not None:
        content.append(first)
        for gap in line.get("itl_s") or []:
            content.append(content[-1] + float(gap))
    return RequestTiming(
        request_id=str(line["id"]),
        stage=int(line.get("stage", 0)),
        scheduled_s=float(line["scheduled_s"]) + shift_s,
        sent_s=float(line["sent_s"]) + shift_s,
        end_s=float(line["end_s"]) + shift_s,
        outcome=Outcome(line["outcome"]),
        headers_s=at("headers_s"),
        first_chunk_s=at("first_chunk_s"),
        content_s=tuple(content),
        status=line.get("status"),
        prompt_tokens=line.get("prompt_tokens"),
        output_tokens=int(line.get("output_tokens") or 0),
        token_source=TokenSource(line.get("token_source", "chunks")),
        finish_reason=line.get("finish_reason"),
        error=line.get("error"),
        done_sentinel=bool(line.get("done_sentinel", False)),
        reconnects=int(line.get("reconnects") or 0),
        cached_tokens=line.get("cached_tokens"),
        server_source=line.get("server_source"),
        server_queue_s=line.get("server_queue_s"),
        server_prefill_s=line.get("server_prefill_s"),
        server_decode_s=line.get("server_decode_s"),
    )


class RunDirectory:
    """Creates and fills one run directory."""

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=False)
        self.path = path
        #: The monotonic time of the run's start; stage times in run.json are
        #: offsets from it, request times in requests.jsonl are absolute.
        self.origin_s = time.monotonic()
        self.clock_origin: dict[str, Any] = {
            "monotonic_s": self.origin_s,
            "utc": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "clock": "CLOCK_MONOTONIC (time.monotonic)",
        }
        self._requests: TextIO = (path / "requests.jsonl").open("a", encoding="utf-8")
        self._server: TextIO | None = None

    @classmethod
    def create(cls, parent: Path, kind: str) -> RunDirectory:
        """A new directory ``parent/YYYYmmdd-HHMMSS-KIND[-n]``."""
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        for n in range(1000):
            name = f"{stamp}-{kind}" + (f"-{n}" if n else "")
            try:
                return cls(parent / name)
            except FileExistsError:
                continue  # another run (a shard) took it a moment ago
        raise FileExistsError(f"{parent}: too many runs named {stamp}-{kind}")

    def write_run(self, run: Mapping[str, Any]) -> None:
        """(Re)write ``run.json`` atomically."""
        self._write_json("run.json", {"record_version": RECORD_VERSION, **run})

    def append_request(self, timing: RequestTiming) -> None:
        """Append one finished request and flush it to the OS."""
        line = json.dumps(request_line(timing), separators=(",", ":"))
        self._requests.write(line + "\n")
        self._requests.flush()

    def append_server_sample(self, sample: Mapping[str, Any]) -> None:
        """Append one sample of the target's metrics."""
        if self._server is None:
            self._server = (self.path / "server_metrics.jsonl").open(
                "a", encoding="utf-8"
            )
        self._server.write(json.dumps(sample, separators=(",", ":")) + "\n")
        self._server.flush()

    def write_summary(
        self, summary: Mapping[str, Any], rows: Iterable[Mapping[str, Any]]
    ) -> None:
        """Write ``summary.json`` and ``summary.csv``."""
        write_summary(self.path, summary, rows)

    def close(self) -> None:
        """Close the open files."""
        self._requests.close()
        if self._server is not None:
            self._server.close()

    def _write_json(self, name: str, data: Mapping[str, Any]) -> None:
        _write_json(self.path / name, data)


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def write_summary(
    run_dir: Path, summary: Mapping[str, Any], rows: Iterable[Mapping[str, Any]]
) -> None:
    """Write ``summary.json`` and ``summary.csv`` (each atomically) into ``run_dir``."""
    _write_json(run_dir / "summary.json", summary)
    rows = list(rows)
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    tmp = run_dir / "summary.csv.tmp"
    with tmp.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, run_dir / "summary.csv")


#: What a rebuilt summary says of the run.
UNFINISHED = (
    "the run did not finish (killed or crashed): its summary was rebuilt from "
    "requests.jsonl"
)


def rebuild_summary(
    run_dir: Path, run: Mapping[str, Any], lines: Iterable[Mapping[str, Any]]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``summary.json`` and its CSV rows for a run that never wrote them.

    ``lines`` are its ``requests.jsonl`` lines (a torn last line already left out),
    read once. Stages are the ones ``run.json`` planned plus any a request names;
    throughput divides by the span of each stage's requests, since how far a stage
    got is not known. The status is ``unfinished``.
    """
    by_stage: dict[int, list[RequestTiming]] = {}
    for line in lines:
        try:
            timing = timing_from_line(dict(line))
        except (KeyError, TypeError, ValueError):
            continue  # not a request line servemon wrote: skipped, not fatal
        by_stage.setdefault(timing.stage, []).append(timing)
    planned = {
        int(stage["stage"]): stage
        for stage in run.get("stages") or ()
        if isinstance(stage, Mapping) and isinstance(stage.get("stage"), int)
    }
    indices = sorted(set(planned) | set(by_stage))
    metas = []
    for index in indices:
        meta = dict(planned.get(index, {"stage": index, "label": f"stage {index + 1}"}))
        meta.pop("summary", None)
        meta["sent"] = len(by_stage.get(index, ()))
        metas.append(meta)
    slo = parse_slo(",".join(run.get("slo") or [])) if run.get("slo") else []
    built = summarize_stages(
        metas, [by_stage.get(i, []) for i in indices], [None] * len(indices), slo
    )
    summary = {
        "kind": run.get("kind"),
        "status": "unfinished",
        "stages": built.entries,
        "overall": built.overall.to_json(),
        "slo": [str(t) for t in slo],
        "stop_reason": UNFINISHED,
        "rebuilt_from": "requests.jsonl",
    }
    return summary, built.rows
