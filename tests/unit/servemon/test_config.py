"""Config validation and layering (defaults, then ``--config``, then flags) for every
config dataclass, SimConfig and Faults, profiles: one line naming source and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servemon.core.errors import ConfigError
from servemon.core.fields import layer_config, load, read_yaml
from servemon.loadgen.run.config import LoadConfig
from servemon.monitor.config import ExporterConfig, TargetConfig
from servemon.simulator.config import DIALECTS, Faults, SimConfig, merge
from servemon.simulator.profiles import BUILTIN_PROFILES, load_profile


def config_error(data: dict[str, Any], source: str = "sim.yaml") -> str:
    with pytest.raises(ConfigError) as info:
        load(SimConfig, data, source)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{source}: ")
    return message


def test_defaults_load_and_faults_are_off() -> None:
    config = load(SimConfig, {}, "sim.yaml")
    assert config == SimConfig()
    faults = config.faults
    assert faults == Faults()
    assert faults.http_500_fraction == faults.http_503_fraction == 0.0
    assert faults.cut_stream_fraction == faults.malformed_sse_fraction == 0.0
    assert faults.first_token_stall_s == faults.slow_headers_s == 0.0
    assert faults.metrics == "ok"
    assert faults.role_chunk is True
    assert faults.role_chunk_delay_s is None  # with the first token, as vLLM


def test_a_full_mapping_loads_into_frozen_dataclasses() -> None:
    config = load(
        SimConfig,
        {
            "port": 0,
            "profile": "tiny",
            "max_num_seqs": 4,
            "metrics_dialect": "sglang",
            "faults": {"http_503_fraction": 0.25, "metrics": "hang"},
        },
        "sim.yaml",
    )
    assert config.max_num_seqs == 4
    assert config.metrics_dialect == "sglang"
    assert config.faults.http_503_fraction == 0.25
    assert config.faults.metrics == "hang"
    assert isinstance(config.faults, Faults)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"faults": {"http_500_fraction": 1.5}}, "faults.http_500_fraction"),
        ({"faults": {"http_503_fraction": -0.1}}, "faults.http_503_fraction"),
        ({"faults": {"cut_stream_fraction": "often"}}, "faults.cut_stream_fraction"),
        ({"faults": {"first_token_stall_s": -1}}, "faults.first_token_stall_s"),
        ({"faults": {"metrics": "broken"}}, "faults.metrics"),
        ({"faults": {"role_chunk": "maybe"}}, "faults.role_chunk"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"port": 70000}, "port"),
        ({"speed": 0}, "speed"),
        ({"eos_probability": 2}, "eos_probability"),
        ({"metrics_dialect": "tgi"}, "metrics_dialect"),
        ({"max_model_len": 1}, "max_model_len"),
    ],
)
def test_a_bad_value_names_its_field(data: dict[str, Any], field: str) -> None:
    assert f"sim.yaml: {field}: " in config_error(data)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"max_num_seq": 4}, "max_num_seq"),
        ({"faults": {"http_501": 1}}, "faults.http_501"),
    ],
)
def test_unknown_fields_are_rejected(data: dict[str, Any], field: str) -> None:
    assert config_error(data).startswith(f"sim.yaml: {field}: ")


def test_merge_applies_flags_over_a_config() -> None:
    base = SimConfig(profile="tiny", faults=Faults(http_500_fraction=0.5))
    merged = merge(
        base,
        {
            "max_num_seqs": 8,
            "speed": None,
            "faults": {"metrics": "503", "slow_headers_s": None},
        },
        "flags",
    )
    assert merged.max_num_seqs == 8
    assert merged.speed == base.speed  # None means "not given"
    assert merged.faults.metrics == "503"
    assert merged.faults.http_500_fraction == 0.5  # other faults are kept
    assert merged.faults.slow_headers_s == 0.0
    assert base.max_num_seqs == 256  # the base is untouched


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"max_num_seq": 4}, "flags: max_num_seq: unknown field"),
        ({"faults": {"stall": 1}}, "flags: faults.stall: unknown field"),
        ({"faults": 1}, "flags: faults: expected a mapping"),
        ({"faults": {"http_500_fraction": 3}}, "flags: faults.http_500_fraction: "),
        ({"speed": -2}, "flags: speed: "),
        ({"block_size": 0}, "flags: block_size: "),
    ],
)
def test_merge_reports_one_line_naming_the_field(
    overrides: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        merge(SimConfig(), overrides, "flags")
    message = str(info.value)
    assert message.startswith(expected)
    assert "\n" not in message


def test_every_dialect_is_accepted() -> None:
    for dialect in DIALECTS:
        assert merge(
            SimConfig(), {"metrics_dialect": dialect}, "t"
        ).metrics_dialect == (dialect)


def test_merge_with_skip_none_off_sets_none() -> None:
    base = SimConfig(faults=Faults(role_chunk_delay_s=0.5))
    merged = merge(
        base, {"faults": {"role_chunk_delay_s": None}}, "PUT", skip_none=False
    )
    assert merged.faults.role_chunk_delay_s is None


# -- layering: defaults, then --config, then flags -------------------------------


def test_layers_are_defaults_then_yaml_then_flags(tmp_path: Path) -> None:
    yaml_file = write(
        tmp_path / "sim.yaml", "speed: 2\nport: 1\nfaults:\n  metrics: hang\n"
    )
    flags = {"port": 9, "speed": None, "faults": {"metrics": None, "role_chunk": False}}
    config = layer_config(SimConfig, Path(yaml_file), flags)
    assert config.port == 9  # the flag wins
    assert config.speed == 2  # the file, where no flag is given
    assert config.faults.metrics == "hang"
    assert config.faults.role_chunk is False
    assert config.max_num_seqs == SimConfig().max_num_seqs  # the default


@pytest.mark.parametrize(
    ("cls", "yaml_text", "flags", "check"),
    [
        (
            LoadConfig,
            "seed: 3\nheader: ['X: 1']\nsim_args: ['--a']\n",
            {"seed": None, "header": (), "sim_args": ("--b",)},
            lambda c: (c.seed, c.header, c.sim_args) == (3, ("X: 1",), ("--b",)),
        ),
        (
            ExporterConfig,
            "targets: [{url: 'http://a:1', name: a}]\ngpu: false\n",
            {"targets": (), "gpu": None, "listen": "0.0.0.0:1"},
            lambda c: (
                c.targets == (TargetConfig(url="http://a:1", name="a"),)
                and c.gpu is False
                and c.listen == "0.0.0.0:1"
            ),
        ),
    ],
    ids=["load", "exporter"],
)
def test_one_layering_serves_every_config(
    tmp_path: Path, cls: type[Any], yaml_text: str, flags: dict[str, Any], check: Any
) -> None:
    # A repeatable flag not given is (): it leaves the file's value.
    config = layer_config(cls, Path(write(tmp_path / "c.yaml", yaml_text)), flags)
    assert check(config), config


def test_layering_errors_name_the_file_or_the_command_line(tmp_path: Path) -> None:
    bad_file = Path(write(tmp_path / "c.yaml", "late: maybe\n"))
    with pytest.raises(ConfigError, match=r"c\.yaml: late: "):
        layer_config(LoadConfig, bad_file, {})
    with pytest.raises(ConfigError, match=r"^command line: grace: "):
        layer_config(LoadConfig, None, {"grace": -1.0})
    with pytest.raises(ConfigError, match=r"^command line: nope: unknown field$"):
        layer_config(ExporterConfig, None, {"nope": 1})


# -- profiles --------------------------------------------------------------------


def test_builtin_profiles_load() -> None:
    for name in BUILTIN_PROFILES:
        profile = load_profile(name)
        assert profile.name == name
    assert load_profile("tiny").model == "sim-tiny"


def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


GOOD_PROFILE = """\
params: 1.0e8
kv_bytes_per_token: 1000
memory_bandwidth: 1.0e12
compute_flops: 1.0e13
step_overhead_s: 0.001
num_gpu_blocks: 64
"""


def test_a_profile_file_loads_and_is_named_after_the_file(tmp_path: Path) -> None:
    profile = load_profile(write(tmp_path / "mine.yaml", GOOD_PROFILE))
    assert profile.name == "mine"
    assert profile.num_gpu_blocks == 64
    assert profile.block_size == 16


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (GOOD_PROFILE.replace("params: 1.0e8", "params: -5"), "params"),
        (
            GOOD_PROFILE.replace("num_gpu_blocks: 64", "num_gpu_blocks: 0"),
            "num_gpu_blocks",
        ),
        (GOOD_PROFILE.replace("params: 1.0e8\n", ""), "params"),
        (GOOD_PROFILE + "eos_probability: 1.5\n", "eos_probability"),
        (GOOD_PROFILE + "warp_speed: 9\n", "warp_speed"),
    ],
)
def test_a_bad_profile_names_the_file_and_field(
    tmp_path: Path, text: str, field: str
) -> None:
    path = write(tmp_path / "bad.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_profile(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {field}: ")
    assert "\n" not in message


def test_unparsable_yaml_names_the_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "broken.yaml", "params: 1\nblock_size: [16\n")
    with pytest.raises(ConfigError) as info:
        load_profile(path)
    message = str(info.value)
    assert message.startswith(f"{path}: line ")
    assert "\n" not in message


def test_a_yaml_list_is_not_a_profile(tmp_path: Path) -> None:
    path = write(tmp_path / "list.yaml", "- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping at the top level"):
        load_profile(path)


def test_an_unknown_profile_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="'nonexistent' is neither a built-in"):
        load_profile("nonexistent")


def test_read_yaml_of_an_empty_file_is_empty(tmp_path: Path) -> None:
    assert read_yaml(Path(write(tmp_path / "empty.yaml", ""))) == {}


def test_web_config_file_flows_from_yaml_and_flags(tmp_path: Path) -> None:
    from servemon.commands.exporter import exporter_config
    from servemon.commands.load import load_config

    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("web_config_file: from-yaml.yml\n")
    target = ("http://127.0.0.1:8000",)
    assert exporter_config(yaml_file, target, {}).web_config_file == "from-yaml.yml"
    flags = {"web_config_file": "flag.yml"}
    assert exporter_config(yaml_file, target, flags).web_config_file == "flag.yml"
    assert load_config("ramp", yaml_file, {}).web_config_file == "from-yaml.yml"
    assert load_config("ramp", yaml_file, flags).web_config_file == "flag.yml"


def test_a_bad_web_config_file_fails_the_load_command_before_it_starts(
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner

    from servemon.cli import cli

    web = tmp_path / "web.yml"
    web.write_text("tls_server_config:\n  cert_file: absent.crt\n  key_file: k\n")
    for command in ("ramp", "sweep", "capacity"):
        # No --target: a good config would start the built-in simulator first.
        result = CliRunner().invoke(
            cli, [command, "--web-config-file", str(web), "--slo", "ttft_p95<=1"]
        )
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1
        assert "tls_server_config.cert_file" in lines[0]
        assert "no such file" in lines[0]
    result = CliRunner().invoke(
        cli,
        ["exporter", "--target", "http://127.0.0.1:9", "--web-config-file", str(web)],
    )
    assert result.exit_code == 2, result.output
    assert "tls_server_config.cert_file" in result.output.strip()


def test_every_server_binds_loopback_by_default() -> None:
    """The exporter, the live client metrics and the simulator listen on 127.0.0.1
    unless told otherwise; the demo's children are started on 127.0.0.1."""
    import inspect

    from servemon import embedded
    from servemon.commands.exporter import exporter_config

    target = ("http://10.0.0.5:8000",)
    assert exporter_config(None, target, {}).listen.startswith("127.0.0.1:")
    assert LoadConfig().metrics_host == "127.0.0.1"
    assert SimConfig().host == "127.0.0.1"
    source = inspect.getsource(embedded)
    assert "0.0.0.0" not in source
    for what in ('"--host", "127.0.0.1"', '"127.0.0.1:0"', "listen-address=127.0.0.1"):
        assert what in source
