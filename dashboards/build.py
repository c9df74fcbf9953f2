"""The Grafana dashboards, generated with grafanalib on servemon's schema.

Three dashboards, one module each: **Serving overview**
(:mod:`servemon.dashboards.overview`: load, queueing, cache, latency client and server
side by side, throughput, GPU, SLO),
**Ramp test** (:mod:`servemon.dashboards.ramp`: stage boundaries as annotations, target
vs achieved rate, dispatch lag, latency against queue and KV usage) and **GPU**
(:mod:`servemon.dashboards.gpu`: per GPU and per process), made of the panels of
:mod:`servemon.dashboards.panels` and the queries of :mod:`servemon.dashboards.queries`.
Every panel has a unit, every rate uses ``$__rate_interval``, and the template variables
are datasource, target and model (and gpu).
``python -m servemon.dashboards.build dashboards/json``
(or ``servemon dashboards --out DIR``) writes the JSON; the committed files under
``dashboards/json/`` are checked against a fresh generation by a test.

The JSON is at Grafana's current ``schemaVersion``: grafanalib 0.7 writes version 12
(and the legacy ``heatmap`` panel), so :func:`servemon.dashboards.grafana_json.current`,
the one place that reshapes grafanalib's output, rewrites every dashboard before it is
written; a test validates the result against Grafana's published schema. Rows are
``row`` panels in the flat panel list.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafanalib._gen import DashboardEncoder

from servemon.dashboards.gpu import gpu
from servemon.dashboards.grafana_json import current
from servemon.dashboards.overview import overview
from servemon.dashboards.ramp import ramp

__all__ = ["DASHBOARDS", "dashboard_json", "main", "write_dashboards"]

#: File name (without .json) -> builder.
DASHBOARDS = {"servemon-overview": overview, "servemon-ramp": ramp, "servemon-gpu": gpu}


def dashboard_json(name: str, *, gpu_hour_cost: float | None = None) -> str:
    """One dashboard as the JSON text that is committed (without a price per
    GPU-hour; ``gpu_hour_cost`` adds the GPU dashboard's cost panel)."""
    board = gpu(gpu_hour_cost) if name == "servemon-gpu" else DASHBOARDS[name]()
    # Through the encoder first: grafanalib's objects become plain JSON values.
    legacy = json.loads(json.dumps(board.to_json_data(), cls=DashboardEncoder))
    return json.dumps(current(legacy), sort_keys=True, indent=2) + "\n"


def write_dashboards(
    out_dir: Path, *, gpu_hour_cost: float | None = None
) -> list[Path]:
    """Write every dashboard to ``out_dir/NAME.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in DASHBOARDS:
        path = out_dir / f"{name}.json"
        text = dashboard_json(name, gpu_hour_cost=gpu_hour_cost)
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def main(argv: list[str]) -> int:
    """``python -m servemon.dashboards.build OUT_DIR``."""
    out = Path(argv[0]) if argv else Path(__file__).parent / "json"
    for path in write_dashboards(out):
        sys.stdout.write(f"{path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
