"""Every option that more than one command takes, declared once, with one help text.

A command composes the ones it takes with :func:`compose`. Where commands differ
only in the default, the option takes it: ``default=`` is a value click fills in
and shows (``demo``, ``merge``); ``shown=`` names a default that the command's
config supplies later (defaults, then ``--config``, then flags:
:func:`servemon.core.fields.layer_config`), so that click leaves the flag ``None`` when
it is not given (:func:`servemon.commands.defaults.fill_defaults` shows it). Options
of one command only live in that command's module.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

__all__ = [
    "arrival",
    "compose",
    "config_file",
    "drain",
    "exit_with_parent",
    "load_options",
    "max_duration",
    "max_num_seqs",
    "out",
    "profile",
    "run_dirs",
    "seed",
    "step_seconds",
    "web_config_file",
]

F = TypeVar("F", bound=Callable[..., Any])
#: What click.option and click.argument return.
Decorator = Callable[[Any], Any]


def compose(*decorators: Decorator) -> Callable[[F], F]:
    """One decorator that applies ``decorators``, the first one outermost (so the
    first option is listed first in ``--help``)."""

    def apply(func: F) -> F:
        decorated: Any = func
        for decorator in reversed(decorators):
            decorated = decorator(decorated)
        result: F = decorated
        return result

    return apply


def _option(
    *decls: str, help: str, shown: str | None = None, **attrs: Any
) -> Decorator:
    """``click.option``; ``shown`` goes into the help as the default, and a real
    ``default`` is shown by click."""
    if shown is not None:
        help = f"{help} [default: {shown}]"
    if attrs.get("default") is not None:
        attrs.setdefault("show_default", True)
    return click.option(*decls, help=help, **attrs)


# -- shared by several commands ---------------------------------------------------


def config_file() -> Decorator:
    """``--config``: a YAML file under the flags (``sim``, ``exporter``, the load
    commands)."""
    return _option(
        "--config",
        "config_file",
        type=click.Path(path_type=Path),
        help="YAML file with any of these settings (names with underscores); "
        "flags win.",
    )


def seed(**how: Any) -> Decorator:
    """``--seed`` (``sim``, ``demo``, the load commands)."""
    return _option(
        "--seed",
        type=int,
        help="Seed of every random draw (the same seed, the same draws).",
        **how,
    )


def out(**how: Any) -> Decorator:
    """``--out`` (a ``str``): where run directories go (demo, merge, load commands)."""
    return _option(
        "--out", type=click.Path(), help="Parent of the run directory.", **how
    )


def step_seconds(**how: Any) -> Decorator:
    """``--step-seconds`` (``ramp``, ``capacity``, ``demo``)."""
    return _option(
        "--step-seconds",
        type=float,
        help="Seconds per step: each rate of a ramp, each rate a search tries.",
        **how,
    )


def max_duration(**how: Any) -> Decorator:
    """``--max-duration`` (``capacity``, ``demo``)."""
    return _option(
        "--max-duration",
        type=float,
        help="Seconds the whole capacity search may take.",
        **how,
    )


def open_loop() -> Callable[[F], F]:
    """What every open-loop schedule takes (``ramp``, ``replay``): the in-flight
    cap, a truncation, sharding and a shared start."""
    return compose(
        _option(
            "--max-inflight",
            type=int,
            help="Safety cap on requests in flight; what it holds back is counted.",
        ),
        _option("--max-requests", type=int, help="Stop the schedule after this many."),
        _option(
            "--shard",
            help="Run shard I of N (0-based): every N-th request of the same "
            "schedule; merge the shards with servemon merge.",
        ),
        _option(
            "--start-at",
            help="Start the schedule at this UTC time (ISO 8601), so that shards "
            "start together.",
        ),
    )


def drain() -> Decorator:
    """``--drain`` (every open loop: ramp, replay, capacity, control)."""
    return _option(
        "--drain",
        type=float,
        help="Seconds the requests still in flight when the schedule ends get "
        "before they are cancelled (recorded as cancelled; an overloaded "
        "server's queue can take minutes to drain). Default: until they finish "
        "or reach --timeout.",
    )


def arrival() -> Decorator:
    """``--arrival`` (``ramp``, ``capacity``)."""
    return _option("--arrival", help="constant | poisson | gamma:CV.")


def profile(**how: Any) -> Decorator:
    """``--profile``: the simulator's profile (``sim``, ``demo``)."""
    return _option(
        "--profile",
        help="Simulator profile: built-in (tiny, qwen3-0.6b-eager, vllm-cpu-tiny) "
        "or a profile YAML file.",
        **how,
    )


def max_num_seqs(**how: Any) -> Decorator:
    """``--max-num-seqs``: the simulator's batch size (``sim``, ``demo``)."""
    how.setdefault("type", int)
    return _option(
        "--max-num-seqs",
        help="Most sequences the simulator runs in one step (its batch size).",
        **how,
    )


def web_config_file() -> Decorator:
    """``--web-config-file``: TLS and basic auth of the /metrics servers
    (``exporter``, the load commands' live client metrics)."""
    return _option(
        "--web-config-file",
        help="exporter-toolkit web config YAML (tls_server_config, "
        "basic_auth_users with bcrypt hashes, http_server_config.headers) for "
        "this command's /metrics; see docs/security.md.",
    )


def exit_with_parent() -> Decorator:
    """``--exit-with-parent``, hidden: what servemon gives its own children."""
    return click.option(
        "--exit-with-parent",
        is_flag=True,
        hidden=True,
        help="Stop when the parent process goes away (for embedding).",
    )


def run_dirs() -> Decorator:
    """``RUN_DIRS...``: the run directories a command reads (``compare``,
    ``merge``)."""
    return click.argument(
        "run_dirs",
        nargs=-1,
        required=True,
        type=click.Path(path_type=Path, file_okay=False),
    )


def prometheus() -> Callable[[F], F]:
    """Reading the server's signals from Prometheus (``ramp``, ``sweep``,
    ``capacity``, ``control``)."""
    return compose(
        _option(
            "--prometheus",
            help="Read the server's signals (queue, KV cache, TTFT, errors, GPU) "
            "from this Prometheus, over --select, instead of the target's /metrics.",
        ),
        _option(
            "--prometheus-auth-file",
            help="YAML with bearer_token or basic_auth for --prometheus (never "
            "logged).",
        ),
        _option(
            "--select",
            help="Label matchers every signal query gets, e.g. "
            '\'model="qwen",target=~"pool-a.*"\'.',
        ),
        _option(
            "--scrape-interval",
            type=float,
            help="Prometheus' scrape interval: a signal older than two is stale, "
            "and control waits two between rate changes.",
            shown="read from Prometheus' targets API, else 15",
        ),
        _option(
            "--signal-window",
            type=float,
            help="Seconds of the rate windows in the signal queries.",
        ),
    )


# -- every load command (ramp, sweep, capacity) -----------------------------------


def _extra_body(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> dict[str, Any] | None:
    # Imported here: the exporter's and the simulator's commands share this module,
    # and the base install (without servemon[loadgen]) must load it.
    from servemon.loadgen.run.config import parse_extra_body

    return None if value is None else parse_extra_body(value)


def load_options() -> Callable[[F], F]:
    """The options every load command takes, first in its ``--help``."""
    return compose(
        config_file(),
        _option(
            "--target",
            help="Base URL of an OpenAI-compatible server. "
            "Without it the built-in simulator is started on a free port.",
        ),
        _option(
            "--target-name",
            help="The target label of the live client series.",
            shown="host:port of --target, as the exporter names it",
        ),
        _option("--model", help="Model to ask for.", shown="the first of /v1/models"),
        _option("--api", type=click.Choice(["chat", "completions"]), help="Which API."),
        _option(
            "--stream/--no-stream",
            default=None,
            help="Stream responses (TTFT and ITL need it).",
        ),
        _option(
            "--workload",
            help="random:prompt=N,output=N | shared-"
            "prefix:prefix=N,prompts=N,suffix=N,output=N | file:PATH.",
        ),
        _option(
            "--over-context",
            type=click.Choice(["error", "skip", "truncate", "send"]),
            help="A trace's requests whose prompt and output do not fit the "
            "target's context (its max_model_len): refuse the run before it "
            "starts, leave them out (counted as skipped), cut their prompts to fit, "
            "or send them for the server to refuse.",
        ),
        _option(
            "--tokenizer",
            help="A local tokenizer.json for exact prompt lengths.",
            shown="the target's /tokenize, else an estimate",
        ),
        _option(
            "--ignore-eos/--no-ignore-eos",
            default=None,
            help="Ask for the full output length.",
        ),
        _option(
            "--extra-body",
            callback=_extra_body,
            help="JSON object merged into every request body.",
        ),
        _option(
            "--header",
            multiple=True,
            help="'Name: value' added to every request (never recorded). Not for "
            "secrets: every user can read a command line; use SERVEMON_API_KEY "
            "(a bearer token) or --header-file.",
        ),
        _option(
            "--header-file",
            help="File of 'Name: value' lines (# comments) added to every request, "
            "e.g. an Authorization header (never recorded).",
        ),
        _option("--timeout", type=float, help="Seconds a request may take."),
        out(),
        _option(
            "--report/--no-report",
            default=None,
            help="Write report.html at the end (or later: servemon report RUN_DIR).",
        ),
        _option(
            "--metrics-host",
            help="Address of the live client /metrics (0.0.0.0 inside a pod).",
        ),
        _option(
            "--metrics-port",
            type=int,
            help="Port of the live client /metrics on 127.0.0.1 (0: any free).",
        ),
        web_config_file(),
        seed(),
        _option(
            "--repeats",
            type=int,
            help="Run each stage of a ramp (a sweep's level) this many times in "
            "a row with new draws; the report pools them and shows the spread "
            "between repeats, and compare judges differences by it (capacity, "
            "control and replay refuse it).",
        ),
        _option(
            "--energy",
            help="Where to read the target's GPU energy (J/token, W, cost per "
            "token): auto (Prometheus with --prometheus, else NVML here when the "
            "target runs here), nvml, off, or the URL of its exporter's /metrics.",
        ),
        _option(
            "--gpu-hour-cost",
            type=float,
            help="Price of one of the target's GPUs per hour: cost per million "
            "output tokens and per thousand good requests.",
        ),
        _option(
            "--node-hour-cost",
            type=float,
            help="Price of the whole target per hour (instead of --gpu-hour-cost).",
        ),
        _option(
            "--slo",
            multiple=True,
            help="e.g. ttft_p95<=0.5,itl_p95<=0.05,error_rate<=0.01 "
            "(seconds): goodput and pass/fail per stage. capacity takes several "
            "named tiers, each its own --slo NAME=TERMS (e.g. --slo "
            "interactive=ttft_p95<=0.3 --slo batch=e2e_p95<=30), and finds each "
            "one's capacity in one search.",
        ),
        _option(
            "--cancel-fraction",
            type=float,
            help="Fraction of requests the client walks away from.",
        ),
        _option("--cancel-after", type=float, help="... after this many seconds."),
        _option(
            "--cancel-after-tokens",
            type=int,
            help="... or after this many content chunks.",
        ),
        _option(
            "--grace",
            type=float,
            help="Seconds requests in flight get after Ctrl-C or SIGTERM.",
        ),
        _option(
            "--sample-interval",
            type=float,
            help="Seconds between reads of the server's signals (the target's "
            "/metrics, or Prometheus with --prometheus) into server_metrics.jsonl.",
        ),
        _option(
            "--cpu-dma-latency",
            type=int,
            help="Keep this machine's CPUs out of idle states slower to leave than "
            "this many microseconds while the run sends (PM QoS, "
            "/dev/cpu_dma_latency; 0: idle CPUs poll). An idle VM's CPU can take "
            "milliseconds to wake, which lands in every dispatch lag and token "
            "time. Needs write access to the device (root or a udev rule).",
        ),
        _option(
            "--sim-arg",
            "sim_args",
            multiple=True,
            help="Extra flag for the built-in simulator, e.g. "
            "--sim-arg=--max-num-seqs=8 (repeatable).",
        ),
        _option(
            "--sim-profile",
            help="Profile of the built-in simulator when there is no --target.",
        ),
    )
