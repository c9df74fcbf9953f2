"""How well ``servemon control`` holds each signal on the simulator, and follows a
change of the server's speed back to the setpoint.

For each signal (``waiting``, ``kv_cache_usage``, ``ttft_p95``) a ``servemon sim``
is started with an engine shaped so that the setpoint sits inside its range (a
batch limit for the queue, long-lived requests for KV usage, 1,024-token prompts
for TTFT), and ``servemon control
--hold SIGNAL=SETPOINT`` runs for ``--soak`` seconds against it, as a user runs it
(Poisson arrivals, the signal read from the target's ``/metrics``, every 0.5 s for
the queue and KV usage, no real-time scheduling; ``--pace`` or ``--no-pace`` is
passed on where given; ``--seed`` passes ``--seed``: every run of a seed draws
the same arrivals, so variants compare on the same draws and repeats take other
seeds). Halfway through, the simulator's
speed is changed (``PUT /sim/config {"speed": ...}``): the server gets slower and the
same rate means a different signal. From ``control.jsonl`` it prints, for each half
after its settle time, the share of control ticks whose measured signal was within
±15 % of the setpoint, the signal's median and the median offered rate.

    .venv/bin/python benchmarks/control_hold.py [--soak 600] [--signals waiting,...]

With ``--cold`` each case of :data:`COLD` (``--signals`` names cases) is held
as a new user holds it the
first time: through a real Prometheus (Debian's ``prometheus``, scraping
``servemon exporter`` in front of the simulator every second), with no
``--scrape-interval`` (the run reads it from Prometheus' targets API) and from the
default start of 1 req/s. It prints when the signal first came within ±15 % of the
setpoint (the reach time, from the start) and the share of ticks within ±15 % after
that, over ``--soak`` seconds (``--repeat`` runs, seeds ``--seed`` up); ``--pace``
or ``--no-pace`` is passed to every run where given (the tool paces the queue and
KV usage by default, TTFT only when asked).

With ``--cold --vllm`` the cases of :data:`COLD_VLLM` are held on vLLM's CPU build
instead, started as the test suite starts it (``benchmarks/vllm_calibration.py``:
the tiny model, in this script's session) with the cache and slots of the tier's
control tests; ``--repeat`` runs share one server a case, each from an idle one.

With ``--pin RATE`` the law's rate is pinned (``--rps-min = --rps-max = RATE``) and
no speed change is made: for ``ttft_p95``, runs with and without ``--no-pace``
print the share of 30-s p95s within ±15 % of their own median: the noise floor of
the signal itself, which the pace on the sends lowers
(``loadgen/drivers/control/backlog.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path

from _common import SERVEMON, sim_process
from vllm_calibration import samples, vllm_process

#: signal -> (setpoint, simulator flags, control flags)
CASES: dict[str, tuple[float, list[str], list[str]]] = {
    "waiting": (
        64.0,
        ["--max-num-seqs", "32"],
        ["--workload", "random:prompt=64,output=32", "--sample-interval", "0.5"],
    ),
    # Long-lived requests (512 output tokens, ~25 s each): KV usage moves on the
    # timescale of a lifetime, which the controller can follow. With short ones
    # (32 tokens, ~2 s) it moves faster than an interval and a fixed rate holds it
    # no better than the controller (results/control.md).
    "kv_cache_usage": (
        0.7,
        ["--max-num-seqs", "256"],
        [
            "--workload",
            "random:prompt=256,output=512",
            "--ignore-eos",
            "--sample-interval",
            "0.5",
            "--control-interval",
            "4",
            "--rps-start",
            "2",
        ],
    ),
    # Long prompts and no batch limit: TTFT is the wait for the prefill budget
    # (2,048 tokens a step), a stationary queue below its knee, so a function of
    # the rate; behind a batch limit it is a drifting queue (see docs/capacity.md).
    "ttft_p95": (
        0.4,
        ["--max-num-seqs", "256"],
        [
            "--workload",
            "random:prompt=1024,output=32",
            "--signal-window",
            "30",
            "--control-interval",
            "10",
            # From 4 req/s the integral step at 10 s intervals took 200 s to climb.
            "--rps-start",
            "8",
        ],
    ),
}
SPEED_AFTER = 0.7
TOLERANCE = 0.15
DEFAULT_SIGNALS = "waiting,kv_cache_usage,ttft_p95"
#: --cold: case -> (signal, setpoint, simulator flags, control flags): a queue
#: of 48 behind a batch of 16 (about 8 req/s), the same with requests four times
#: as long (about 2 req/s: the arrivals' noise over an interval is half), the
#: setpoint of 6 a new user first tried (issue 27), and a cache fill of
#: short-lived requests.
COLD: dict[str, tuple[str, float, list[str], list[str]]] = {
    "waiting": (
        "waiting",
        48.0,
        ["--max-num-seqs", "16"],
        ["--workload", "random:prompt=128,output=64"],
    ),
    "waiting-long": (
        "waiting",
        48.0,
        ["--max-num-seqs", "16"],
        ["--workload", "random:prompt=128,output=256"],
    ),
    "waiting-6": (
        "waiting",
        6.0,
        ["--max-num-seqs", "16"],
        ["--workload", "random:prompt=128,output=64"],
    ),
    "kv_cache_usage": (
        "kv_cache_usage",
        0.5,
        ["--max-num-seqs", "256", "--num-gpu-blocks", "1000", "--block-size", "16"],
        ["--workload", "random:prompt=64,output=96", "--ignore-eos"],
    ),
}


#: --cold --vllm: case -> (signal, setpoint, (KV blocks, --max-num-seqs), control
#: flags): the tier's control tests (tests/e2e/engines/test_vllm.py) held longer.
COLD_VLLM: dict[str, tuple[str, float, tuple[int, int], list[str]]] = {
    "vllm-waiting": (
        "waiting",
        96.0,
        (64, 16),
        ["--workload", "random:prompt=64,output=300", "--ignore-eos"],
    ),
    "vllm-kv": (
        "kv_cache_usage",
        0.5,
        (1024, 256),
        ["--workload", "random:prompt=256,output=300", "--ignore-eos"],
    ),
}


def _slow_down(url: str, at: float) -> None:
    time.sleep(max(0.0, at - time.monotonic()))
    body = json.dumps({"speed": SPEED_AFTER}).encode()
    request = urllib.request.Request(
        url + "/sim/config",
        data=body,
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5):
        pass


def _half(ticks: list[dict[str, float]], setpoint: float) -> dict[str, float]:
    measured = [t["measured"] for t in ticks if t["measured"] is not None]
    inside = sum(abs(m - setpoint) <= TOLERANCE * setpoint for m in measured)
    return {
        "ticks": len(ticks),
        "within": inside / len(ticks) if ticks else 0.0,
        "median": statistics.median(measured) if measured else float("nan"),
        "offered": statistics.median(t["offered_rps"] for t in ticks)
        if ticks
        else float("nan"),
    }


def run_case(
    signal: str, soak: float, settle: float, work: Path, pace: bool | None, seed: int
) -> list[str]:
    setpoint, sim_args, control_args = CASES[signal]
    out = work / signal
    with sim_process("--profile", "qwen3-0.6b-eager", *sim_args) as url:
        switch_at = time.monotonic() + soak / 2
        slower = threading.Thread(target=_slow_down, args=(url, switch_at))
        slower.start()
        command = [
            str(SERVEMON), "control", "--target", url,
            "--hold", f"{signal}={setpoint:g}", "--duration", f"{soak:g}",
            "--rps-start", "4", "--metrics-port", "0", "--out", str(out),
            "--seed", str(seed), *control_args,
            *([] if pace is None else ["--pace" if pace else "--no-pace"]),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        slower.join()
    if done.returncode != 0:
        raise SystemExit(f"servemon control failed: {done.stderr[-2000:]}")
    (run,) = out.glob("*-control")
    ticks = [json.loads(x) for x in (run / "control.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text())
    start = float(summary["stages"][0]["start_s"])
    first = [t for t in ticks if settle <= t["t_s"] - start < soak / 2]
    second = [t for t in ticks if soak / 2 + settle <= t["t_s"] - start]
    rows = []
    for name, part in (("before", first), (f"after speed {SPEED_AFTER:g}", second)):
        h = _half(part, setpoint)
        rows.append(
            f"{signal:<15} {setpoint:>8g} {name:<17} {h['ticks']:>5.0f} "
            f"{h['within']:>7.0%} {h['median']:>8.3f} {h['offered']:>8.2f}"
        )
    return rows


@contextlib.contextmanager
def prometheus_over(url: str, target: str, work: Path) -> Iterator[str]:
    """``servemon exporter`` in front of ``url`` (named ``target``), scraped every
    second by Debian's Prometheus; yields Prometheus' URL once it has the target's
    queue."""
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise SystemExit("--cold needs Debian's prometheus (scripts/system-deps)")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        log = (work / "exporter.log").open("wb")
        exporter = subprocess.Popen(
            [str(SERVEMON), "exporter", "--target", f"{target}={url}",
             "--listen", "127.0.0.1:0", "--no-gpu"],
            stdout=subprocess.PIPE, stderr=log,
        )  # fmt: skip
        procs.append(exporter)
        assert exporter.stdout is not None
        ready = exporter.stdout.readline().decode()
        found = re.search(r"http://127\.0\.0\.1:(\d+)", ready)
        if found is None:
            raise SystemExit(f"servemon exporter did not start: {ready!r}")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        config = work / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
            "scrape_configs:\n  - job_name: servemon\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{found.group(1)}']}}]\n"
        )
        procs.append(
            subprocess.Popen(
                [
                    prometheus,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={work / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=subprocess.DEVNULL,
                stderr=(work / "prometheus.log").open("wb"),
            )
        )
        prom = f"http://127.0.0.1:{port}"
        query = prom + "/api/v1/query?query=servemon_engine_requests_waiting"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(query, timeout=2) as resp:
                    if json.load(resp)["data"]["result"]:
                        break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            raise SystemExit("Prometheus did not scrape the exporter in 60 s")
        yield prom
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextlib.contextmanager
def prometheus_stack(sim_args: list[str], work: Path) -> Iterator[tuple[str, str]]:
    """``servemon sim`` behind :func:`prometheus_over`; yields (the simulator's
    URL, Prometheus' URL)."""
    with (
        sim_process("--profile", "qwen3-0.6b-eager", *sim_args) as url,
        prometheus_over(url, "sim", work) as prom,
    ):
        yield url, prom


def cold(case: str, soak: float, work: Path, seed: int, pace: list[str]) -> str:
    """One cold start of the simulator through Prometheus (see the module): a row."""
    signal, setpoint, sim_args, control_args = COLD[case]
    control_args = [*control_args, *pace]
    out = work / f"cold-{case}-{seed}"
    out.mkdir(parents=True)
    with prometheus_stack(sim_args, out) as (url, prom):
        return cold_run(
            case, signal, setpoint, (url, prom), soak, out, seed, control_args
        )


def cold_vllm(
    case: str, soak: float, work: Path, seeds: Iterable[int], pace: list[str]
) -> Iterator[str]:
    """Cold starts of vLLM's CPU build through Prometheus, one server for the case,
    each run from an idle one: a row each."""
    signal, setpoint, (blocks, max_num_seqs), control_args = COLD_VLLM[case]
    out = work / f"cold-{case}"
    out.mkdir(parents=True)
    with (
        vllm_process(out, blocks, max_num_seqs) as (url, _log),
        prometheus_over(url, "vllm", out) as prom,
    ):
        tokenizer = out / "model" / "hf" / "tokenizer.json"
        for seed in seeds:
            deadline = time.monotonic() + 120
            while (busy := _busy(url)) and time.monotonic() < deadline:
                time.sleep(0.5)  # a poll interval under a deadline
            if busy:
                raise SystemExit(f"vLLM still busy after 120 s: {busy}")
            flags = [*control_args, *pace, "--tokenizer", str(tokenizer)]
            run = out / f"seed-{seed}"
            run.mkdir()
            yield cold_run(case, signal, setpoint, (url, prom), soak, run, seed, flags)


def _busy(url: str) -> float:
    """vLLM's requests running and waiting."""
    found = samples(url)
    return found.get("vllm:num_requests_running", 0.0) + found.get(
        "vllm:num_requests_waiting", 0.0
    )


def cold_run(
    case: str,
    signal: str,
    setpoint: float,
    urls: tuple[str, str],
    soak: float,
    out: Path,
    seed: int,
    control_args: list[str],
) -> str:
    """``servemon control`` against ``urls`` (the target, Prometheus): a row."""
    url, prom = urls
    command = [
        str(SERVEMON), "control", "--target", url, "--prometheus", prom,
        "--hold", f"{signal}={setpoint:g}", "--duration", f"{soak:g}",
        "--metrics-port", "0", "--out", str(out / "runs"), "--seed", str(seed),
        *control_args,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"servemon control failed: {done.stderr[-2000:]}")
    (run,) = (out / "runs").glob("*-control")
    ticks = [json.loads(x) for x in (run / "control.jsonl").read_text().splitlines()]
    start = float(
        json.loads((run / "summary.json").read_text())["stages"][0]["start_s"]
    )
    scrape = json.loads((run / "run.json").read_text())["server_metrics"][
        "scrape_interval"
    ]
    band = [
        t["measured"] is not None
        and abs(t["measured"] - setpoint) <= TOLERANCE * setpoint
        for t in ticks
    ]
    first = band.index(True) if True in band else None
    reach = None if first is None else ticks[first]["t_s"] - start
    after = band[first:] if first is not None else []
    within = sum(after) / len(after) if after else 0.0
    started = sum(t.get("phase") == "start" for t in ticks)
    interval = ticks[1]["t_s"] - ticks[0]["t_s"] if len(ticks) > 1 else float("nan")
    return (
        f"{case:<15} {setpoint:>8g} {seed:>4} {scrape['seconds']:>6g} "
        f"{interval:>8.1f} {started:>6} "
        f"{'never' if reach is None else f'{reach:.0f} s':>7} {len(after):>5} "
        f"{within:>7.0%} {statistics.median(t['offered_rps'] for t in ticks):>8.2f}"
    )


def pinned(signal: str, rate: float, soak: float, settle: float, work: Path) -> None:
    """The signal's own spread at a pinned rate, paced and not (see the module)."""
    setpoint, sim_args, control_args = CASES[signal]
    pin = [f"--rps-{x}={rate:g}" for x in ("start", "min", "max")]
    print(
        f"{'pace':<8} {'ticks':>5} {'within':>7} {'median':>8} {'range':>13} {'rps':>6}"
    )
    for pace in ("--pace", "--no-pace"):
        out = work / f"pinned{pace}"
        with sim_process("--profile", "qwen3-0.6b-eager", *sim_args) as url:
            command = [
                str(SERVEMON), "control", "--target", url,
                "--hold", f"{signal}={setpoint:g}", "--duration", f"{soak:g}",
                "--metrics-port", "0", "--out", str(out), *control_args, *pin, pace,
            ]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"servemon control failed: {done.stderr[-2000:]}")
        (run,) = out.glob("*-control")
        lines = (run / "control.jsonl").read_text().splitlines()
        start = json.loads((run / "summary.json").read_text())["stages"][0]["start_s"]
        ticks = [json.loads(x) for x in lines]
        seen = [
            t["measured"]
            for t in ticks
            if t["measured"] is not None and t["t_s"] - float(start) >= settle
        ]
        median = statistics.median(seen)
        inside = sum(abs(m - median) <= TOLERANCE * median for m in seen) / len(seen)
        sent = statistics.mean(t["achieved_rps"] for t in ticks[1:])
        print(
            f"{pace.lstrip('-'):<8} {len(seen):>5} {inside:>7.0%} {median:>8.3f} "
            f"{min(seen):>6.3f}-{max(seen):.3f} {sent:>6.2f}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--soak", type=float, default=600.0)
    parser.add_argument("--settle", type=float, default=60.0)
    parser.add_argument("--signals", default=DEFAULT_SIGNALS)
    parser.add_argument(
        "--keep", type=Path, default=None, help="keep the run directories here"
    )
    parser.add_argument(
        "--pace",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="servemon control --pace / --no-pace (default: the tool's own)",
    )
    parser.add_argument(
        "--pin", type=float, default=None, help="pin the rate (see the module)"
    )
    parser.add_argument("--seed", type=int, default=0, help="servemon control --seed")
    parser.add_argument(
        "--cold",
        action="store_true",
        help="cold starts through Prometheus at 1 s (see the module)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="--cold: runs a signal")
    parser.add_argument(
        "--vllm", action="store_true", help="--cold: on vLLM's CPU build (see above)"
    )
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="control-hold-"))
    if args.cold:
        server = "vLLM's CPU build" if args.vllm else "servemon sim (qwen3-0.6b-eager)"
        print(
            f"control_hold --cold: servemon control through Prometheus (1 s scrapes "
            f"of servemon exporter) against {server}, "
            f"{args.soak:g} s from 1 req/s, no --scrape-interval, Poisson arrivals"
            f"{'' if args.pace is None else ', --pace' if args.pace else ', --no-pace'}"
        )
        print(
            f"{'case':<15} {'setpoint':>8} {'seed':>4} {'scrape':>6} "
            f"{'interval':>8} {'start':>6} {'reach':>7} {'ticks':>5} {'within':>7} "
            f"{'rps':>8}"
        )
        cases = COLD_VLLM if args.vllm else COLD
        signals = args.signals if args.signals != DEFAULT_SIGNALS else ",".join(cases)
        seeds = range(args.seed, args.seed + args.repeat)
        pace = [] if args.pace is None else ["--pace" if args.pace else "--no-pace"]
        for case in signals.split(","):
            if case not in cases:
                raise SystemExit(f"--signals: no --cold case {case!r}: {list(cases)}")
            if args.vllm:
                for row in cold_vllm(case, args.soak, work, seeds, pace):
                    print(row, flush=True)
                continue
            for seed in seeds:
                print(cold(case, args.soak, work, seed, pace), flush=True)
        if args.keep is None:
            subprocess.run(["rm", "-rf", str(work)], check=False)
        return
    if args.pin is not None:
        print(
            f"control_hold --pin: servemon control at a pinned {args.pin:g} req/s "
            f"against servemon sim (qwen3-0.6b-eager), {args.soak:g} s each, "
            f"Poisson arrivals, the first {args.settle:g} s not judged"
        )
        for signal in args.signals.split(","):
            pinned(signal, args.pin, args.soak, args.settle, work)
        if args.keep is None:
            subprocess.run(["rm", "-rf", str(work)], check=False)
        return
    print(
        f"control_hold: servemon control against servemon sim (qwen3-0.6b-eager); "
        f"{args.soak:g} s a signal, the speed changed to {SPEED_AFTER:g} at half "
        f"time; Poisson arrivals (seed {args.seed}); the first {args.settle:g} s of "
        "each half not judged"
    )
    print(
        f"{'signal':<15} {'setpoint':>8} {'half':<17} {'ticks':>5} {'within':>7} "
        f"{'median':>8} {'rps':>8}"
    )
    for signal in args.signals.split(","):
        for row in run_case(signal, args.soak, args.settle, work, args.pace, args.seed):
            print(row, flush=True)
    if args.keep is None:
        subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    main()
