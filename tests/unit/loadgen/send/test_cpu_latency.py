"""``--cpu-dma-latency`` and ``--sample-interval``, the client-side measurement
flags: the PM QoS request is checked before anything starts,
held while the run sends, and dropped after; a bad value or a device that cannot be
written is one line naming the flag."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from servemon.cli import cli
from servemon.core.errors import ConfigError
from servemon.loadgen.send.cpulatency import (
    PM_QOS_PATH,
    check_cpu_latency,
    hold_cpu_latency,
)


def _current() -> int:
    """The kernel's aggregate bound, in microseconds."""
    fd = os.open(PM_QOS_PATH, os.O_RDONLY)
    try:
        return int(struct.unpack("=i", os.read(fd, 4))[0])
    finally:
        os.close(fd)


def test_the_request_is_written_and_held_only_inside(tmp_path: Path) -> None:
    device = tmp_path / "cpu_dma_latency"  # a plain file stands in for the device
    device.write_bytes(b"")
    with hold_cpu_latency(25, device):
        assert device.read_bytes() == struct.pack("=i", 25)
    with hold_cpu_latency(None, tmp_path / "absent"):  # nothing asked: nothing done
        pass


def test_a_missing_device_is_one_line_naming_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        check_cpu_latency(0, tmp_path / "absent")
    message = str(info.value)
    assert message.startswith("--cpu-dma-latency: ")
    assert "does not exist" in message
    assert "\n" not in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write any file")
def test_an_unwritable_device_is_one_line_naming_the_flag(tmp_path: Path) -> None:
    device = tmp_path / "cpu_dma_latency"
    device.write_bytes(b"")
    device.chmod(0o400)
    with pytest.raises(ConfigError, match=r"^--cpu-dma-latency: cannot write"):
        check_cpu_latency(0, device)


def test_a_negative_bound_fails_the_command_before_it_starts() -> None:
    # No --target: a good config would start the built-in simulator first.
    result = CliRunner().invoke(cli, ["ramp", "--cpu-dma-latency", "-1"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert "cpu_dma_latency" in lines[0]


@pytest.mark.skipif(
    not (PM_QOS_PATH.exists() and os.access(PM_QOS_PATH, os.W_OK)),
    reason="this machine's PM QoS device cannot be written here",
)
def test_the_kernel_holds_the_bound_while_asked_and_drops_it_after() -> None:
    before = _current()
    bound = 7 if before > 7 else 0  # tighter than any other holder's, if one can be
    with hold_cpu_latency(bound):
        assert _current() == bound
    assert _current() == before


def test_the_sample_interval_is_a_flag_of_every_load_command() -> None:
    for command in (["ramp"], ["sweep"], ["capacity"], ["control"], ["replay", "t"]):
        result = CliRunner().invoke(cli, [*command, "--sample-interval", "0"])
        assert result.exit_code == 2, (command, result.output)
        assert "sample_interval" in result.output.strip().splitlines()[-1]
