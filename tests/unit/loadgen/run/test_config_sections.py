"""A load command's own flags are its section of the config
(:mod:`servemon.loadgen.run.sections`), built from flat keys in one place
(:func:`~servemon.loadgen.run.flat.config_of`): YAML as users write it still loads, a
flag of another command is refused in one line, and ``run.json`` keeps its flat keys."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from servemon.core.errors import ConfigError
from servemon.core.fields import read_yaml
from servemon.loadgen.run.config import (
    HOLDABLE,
    SECTIONS,
    ControlArgs,
    Kind,
    LoadConfig,
    Signal,
    parse_hold,
)
from servemon.loadgen.run.flat import config_of, config_text
from servemon.loadgen.run.plan import make_plan, recorded_config

KINDS: tuple[Kind, ...] = typing.get_args(Kind)

#: The keys of run.json's ``config`` before the config had sections: readers
#: (report, compare, merge, a killed control run's rebuild) rely on them.
RECORDED_KEYS = {
    "abort_error_rate",
    "abort_waiting",
    "api",
    "arrival",
    "blind_timeout",
    "cancel_after",
    "cancel_after_tokens",
    "cancel_fraction",
    "control_interval",
    "cpu_dma_latency",
    "drain",
    "duration",
    "energy",
    "extra_body",
    "fleet_listen",
    "fleet_token_file",
    "fleet_wait",
    "fleet_workers",
    "gpu_hour_cost",
    "grace",
    "header",
    "header_file",
    "hold",
    "ignore_eos",
    "late",
    "late_tolerance",
    "loops",
    "max_connections",
    "max_duration",
    "max_inflight",
    "max_requests",
    "metrics_host",
    "metrics_port",
    "model",
    "node_hour_cost",
    "number",
    "on_worker_loss",
    "out",
    "over_context",
    "pace",
    "parallel",
    "precision",
    "prometheus",
    "prometheus_auth_file",
    "rate_scale",
    "repeats",
    "rps_end",
    "rps_max",
    "rps_min",
    "rps_start",
    "rps_step",
    "sample_interval",
    "scrape_interval",
    "seed",
    "select",
    "settle",
    "shard",
    "signal_window",
    "sim_args",
    "sim_profile",
    "slo",
    "stages",
    "start_at",
    "step_seconds",
    "stream",
    "target",
    "target_name",
    "time_scale",
    "timeout",
    "tokenizer",
    "trace_from",
    "trace_to",
    "warmup",
    "web_config_file",
    "workers",
    "workload",
}


def _yaml(tmp_path: Path, text: str) -> tuple[str, dict[str, typing.Any]]:
    path = tmp_path / "servemon.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path), read_yaml(path)


@pytest.mark.parametrize(
    ("kind", "text"),
    [
        # docs/loadgen.md, --config
        ("ramp", 'stages: "2:30,4:30"\n'),
        ("sweep", "parallel: [1, 2, 4]\n"),
        # docs/capacity.md, SLO tiers
        (
            "capacity",
            "slo:\n  interactive: ttft_p95<=0.3,itl_p95<=0.05\n"
            "  batch: e2e_p95<=30\nrps_min: 1\n",
        ),
        # servemon control, flat as its flags
        ("control", "hold: waiting=8\nrps_min: 1\nduration: 60\npace: false\n"),
    ],
)
def test_the_documented_yaml_loads_as_users_write_it(
    tmp_path: Path, kind: Kind, text: str
) -> None:
    config = config_of(kind, _yaml(tmp_path, text))
    make_plan(kind, config)
    if kind == "control":
        assert config.control is not None
        assert (config.control.hold.signal, config.control.rps_min) == ("waiting", 1.0)
        assert (config.control.duration, config.control.pace) == (60.0, False)
    else:
        assert config.control is None


def test_flags_win_over_the_file_in_a_section_too(tmp_path: Path) -> None:
    config = config_of(
        "control",
        _yaml(tmp_path, "hold: waiting=8\nduration: 60\n"),
        ("command line", {"hold": "ttft_p95=0.4", "rps_start": 2.0}),
    )
    assert config.control is not None
    assert str(config.control.hold) == "ttft_p95=0.4"
    assert (config.control.duration, config.control.rps_start) == (60.0, 2.0)


@pytest.mark.parametrize(
    ("kind", "key", "value"),
    [
        ("ramp", "hold", "waiting=8"),
        ("capacity", "pace", True),
        ("sweep", "duration", 60),
        ("replay", "control_interval", 2),
        ("ramp", "blind_timeout", 5),
    ],
)
def test_a_flag_of_another_command_is_refused_in_one_line(
    tmp_path: Path, kind: Kind, key: str, value: object
) -> None:
    source, data = _yaml(tmp_path, f"{key}: {value}\n")
    with pytest.raises(ConfigError) as caught:
        config_of(kind, (source, data))
    flag = key.replace("_", "-")
    assert str(caught.value) == (
        f"{source}: --{flag}: only servemon control takes it, not {kind}"
    )
    # A config built otherwise is refused by the plan, in the same words.
    section = ControlArgs(hold=parse_hold("waiting=8"))
    with pytest.raises(ConfigError, match=f"^--hold: only servemon control .* {kind}$"):
        make_plan(kind, LoadConfig(control=section))


def test_a_section_needs_its_required_flag_and_checks_its_own_fields(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match=r"^--hold: control needs SIGNAL=SETPOINT"):
        config_of("control", ("command line", {"duration": 60.0}))
    with pytest.raises(ConfigError, match=r"^--hold: control needs SIGNAL=SETPOINT"):
        make_plan("control", LoadConfig())
    with pytest.raises(ConfigError, match=r"servemon.yaml: duration: .*greater than 0"):
        config_of("control", _yaml(tmp_path, "hold: waiting=8\nduration: -1\n"))
    with pytest.raises(ConfigError, match="--pace: paces the sends of --hold"):
        config_of("control", ("flags", {"hold": "burn_rate=1", "pace": True}))
    with pytest.raises(ConfigError, match="control: unknown field"):
        config_of("control", ("flags", {"control": {"hold": "waiting=8"}}))


def test_hold_signal_is_a_literal_of_what_control_holds() -> None:
    assert typing.get_args(Signal) == HOLDABLE
    assert {parse_hold(f"{s}=0.5").signal for s in HOLDABLE} == set(HOLDABLE)
    with pytest.raises(ConfigError, match="SIGNAL one of waiting, kv_cache_usage"):
        parse_hold("queue=8")


@pytest.mark.parametrize("kind", KINDS)
def test_run_json_keeps_its_flat_keys(kind: Kind) -> None:
    hold = {"hold": "waiting=8"} if kind == "control" else {}
    config = config_of(kind, ("flags", hold))
    assert set(recorded_config(config)) == RECORDED_KEYS
    # ... and reads back as the same config.
    assert config_of(kind, ("run.json", config_text(config))) == config


def test_a_control_run_records_its_section_flat() -> None:
    flags = {"hold": "waiting=8", "rps_min": 2.0, "pace": True, "duration": 30.0}
    data = config_text(config_of("control", ("flags", flags)))
    assert data["hold"] == "waiting=8"
    assert (data["rps_min"], data["pace"], data["duration"]) == (2.0, True, 30.0)
    assert "control" not in data
    ramp = config_text(config_of("ramp", ("flags", {})))
    # Another command's flags are None: control's here, capacity's rps_min too.
    assert (ramp["hold"], ramp["duration"], ramp["rps_min"]) == (None, None, None)


@pytest.mark.parametrize(
    ("kind", "key", "value", "owners"),
    [
        ("sweep", "stages", "2:5", "ramp"),
        ("ramp", "parallel", "[1, 2]", "sweep"),
        ("control", "settle", 1, "capacity"),
        ("ramp", "time_scale", 2, "replay"),
        ("capacity", "shard", "0/2", "ramp and replay"),
        ("sweep", "rps_start", 2, "ramp and control"),
        ("ramp", "rps_min", 2, "capacity and control"),
    ],
)
def test_every_commands_section_refuses_the_others_flags(
    tmp_path: Path, kind: Kind, key: str, value: object, owners: str
) -> None:
    source, data = _yaml(tmp_path, f"{key}: {value}\n")
    with pytest.raises(ConfigError) as caught:
        config_of(kind, (source, data))
    takes = "takes" if " and " not in owners else "take"
    flag = key.replace("_", "-")
    assert str(caught.value) == (
        f"{source}: --{flag}: only servemon {owners} {takes} it, not {kind}"
    )


def test_each_command_gets_its_own_section_and_only_it() -> None:
    for kind in KINDS:
        hold = {"hold": "waiting=8"} if kind == "control" else {}
        config = config_of(kind, ("flags", hold))
        given = {name for name in SECTIONS if getattr(config, name) is not None}
        assert given == {kind}
        assert isinstance(config.section(kind), SECTIONS[kind])


def test_energy_and_model_are_parsed_once_where_the_config_is_built() -> None:
    config = config_of(
        "ramp",
        ("flags", {"energy": "http://127.0.0.1:9/metrics", "model": "a=3,b=1"}),
    )
    assert (config.energy.source, config.energy.url) == (
        "exporter",
        "http://127.0.0.1:9/metrics",
    )
    assert config.model is not None
    assert config.model.mix is not None
    assert config.model.mix.names == ("a", "b")
    data = config_text(config)
    assert (data["energy"], data["model"]) == ("http://127.0.0.1:9/metrics", "a=3,b=1")
    assert str(config_of("ramp", ("flags", {})).energy) == "auto"
    with pytest.raises(ConfigError, match=r"^--energy 'ftp://x': expected auto"):
        config_of("ramp", ("flags", {"energy": "ftp://x"}))
