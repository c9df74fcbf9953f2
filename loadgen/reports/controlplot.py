"""The report's picture of ``servemon control``: the signal against its setpoint
(with the ±15 % band the benchmark judges), and the rate the controller offered
against the rate that went out, tick by tick from ``control.jsonl``."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt

from servemon.loadgen.record.findings import ControlResult
from servemon.loadgen.record.record import read_jsonl
from servemon.loadgen.reports.plots import svg

__all__ = ["plot_control"]


def plot_control(run_dir: Path, held: ControlResult | None) -> str | None:
    """The control section's plot; None when the run has no ticks."""
    ticks = list(read_jsonl(run_dir / "control.jsonl"))
    if not ticks:
        return None
    t = [float(x["t_s"]) for x in ticks]
    measured = [math.nan if x.get("measured") is None else x["measured"] for x in ticks]
    setpoint = float(ticks[0]["setpoint"])
    signal = str(ticks[0].get("signal", "signal"))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 5.2), sharex=True)
    top.axhspan(setpoint * 0.85, setpoint * 1.15, color="tab:green", alpha=0.15)
    top.axhline(setpoint, color="tab:green", label=f"setpoint {setpoint:g}")
    top.plot(t, measured, ".-", color="tab:blue", label=f"{signal} (measured)")
    blind = [ti for ti, m in zip(t, measured, strict=True) if math.isnan(m)]
    if blind:
        top.plot(blind, [setpoint] * len(blind), "x", color="tab:red", label="blind")
    if held is not None and held.settle_s:
        for axis in (top, bottom):
            axis.axvline(t[0] - held.interval_s + held.settle_s, color="grey", ls=":")
    top.set_ylabel(signal)
    top.set_ylim(bottom=0)
    top.legend(fontsize=7, loc="upper right")
    top.set_title(f"Holding {signal} at {setpoint:g} (±15 % band; dotted: settled)")
    bottom.plot(t, [x["offered_rps"] for x in ticks], "-", label="offered")
    bottom.plot(
        t, [x["achieved_rps"] for x in ticks], ".", alpha=0.6, label="sent (achieved)"
    )
    served = [x.get("served_rps") for x in ticks]
    if any(s is not None for s in served):
        bottom.plot(t, [math.nan if s is None else s for s in served], ".", alpha=0.4,
                    label="completed")  # fmt: skip
    bottom.set_ylabel("requests/s")
    bottom.set_xlabel("seconds since the run's start")
    bottom.set_ylim(bottom=0)
    bottom.legend(fontsize=7, loc="upper right")
    for axis in (top, bottom):
        axis.grid(alpha=0.3)
    return svg(fig)
