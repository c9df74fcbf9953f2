"""Machines on one host: network namespaces on a bridge, and processes in them.

:func:`network` makes a bridge in the root namespace with an address of its own
(``10.231.S.1/24``, ``S`` a subnet no route here uses yet), so that the test can
reach every namespace; :meth:`Network.add` makes a namespace joined to the bridge by
a veth pair (``eth0`` inside, with the next address). Processes start inside with
``ip netns exec`` (which execs, so the process is the one started), each in a
session of its own with its output in files. At the end, also on failure, every
process started is stopped (its process group killed), then whatever still runs in
a namespace made here (``ip netns pids``), then the namespaces and the bridge go.

Names carry this process's id, so that two runs on one host (pytest-xdist
workers) never meet. Nothing is sent outside the namespaces made here.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

__all__ = ["IP", "Namespace", "Network", "Process", "network"]

IP = shutil.which("ip")
#: The private range the namespaces' subnets are taken from (10.231.S.0/24).
RANGE = ipaddress.IPv4Network("10.231.0.0/16")
#: Seconds one ``ip`` command may take.
IP_TIMEOUT_S = 10


class NamespaceError(Exception):
    """An ``ip`` command failed."""


def ip(*args: str) -> str:
    """Run ``ip ARGS``; its output, or :class:`NamespaceError` with its stderr."""
    assert IP is not None
    done = subprocess.run(
        [IP, *args],
        capture_output=True,
        text=True,
        timeout=IP_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        said = done.stderr.strip().splitlines() or [f"status {done.returncode}"]
        raise NamespaceError(f"ip {' '.join(args)}: {said[-1]}")
    return done.stdout


class Process:
    """One process started in a namespace; stdout and stderr go to files."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        folder: Path,
        env: Mapping[str, str],
    ) -> None:
        self.name = name
        self.stdout_path = folder / f"{name}.stdout"
        self.stderr_path = folder / f"{name}.stderr"
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                cwd=folder,
                env=dict(env),
                start_new_session=True,
            )

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(encoding="utf-8", errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def tail(self, chars: int = 2000) -> str:
        return (
            f"--- {self.name} (exit {self.proc.returncode}) ---\n"
            f"{self.stdout[-chars:]}\n{self.stderr[-chars:]}"
        )

    def alive(self) -> None:
        """Fail the test if it has exited."""
        if self.proc.poll() is not None:
            pytest.fail(f"{self.name} exited early\n{self.tail()}")

    def wait(self, timeout_s: float) -> int:
        """Its exit status; fails the test if it runs past ``timeout_s``."""
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} still running after {timeout_s} s\n{self.tail()}")

    def stop(self, timeout_s: float = 5) -> None:
        """SIGTERM, a wait, then SIGKILL to its process group (nginx's workers go
        with it)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout_s)


@dataclass(frozen=True, slots=True)
class Namespace:
    """A network namespace on the bridge, at ``address``."""

    name: str
    address: str
    network: Network

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        preload: Mapping[str, str] | None = None,
    ) -> Process:
        """Start ``argv`` in this namespace, stopped when the network goes;
        ``env`` is added to this process's environment, ``preload`` only to the
        command's (not to ``ip``'s: libfaketime)."""
        assert IP is not None
        wrapped = [IP, "netns", "exec", self.name]
        if preload:
            wrapped += ["env", *(f"{k}={v}" for k, v in preload.items())]
        return self.network.track(
            Process(
                name,
                [*wrapped, *argv],
                self.network.folder,
                {**os.environ, **(env or {})},
            )
        )


@dataclass
class Network:
    """A bridge in the root namespace and the namespaces on it (see the module
    docstring)."""

    tag: str
    subnet: ipaddress.IPv4Network
    folder: Path
    bridge: str = ""
    #: Namespaces made so far (their veths and addresses are never reused).
    made: int = 0
    namespaces: list[Namespace] = field(default_factory=list)
    processes: list[Process] = field(default_factory=list)

    @property
    def gateway(self) -> str:
        """The bridge's own address (the root namespace's, where the test runs)."""
        return str(self.subnet[1])

    def track(self, process: Process) -> Process:
        self.processes.append(process)
        return process

    def add(self, role: str) -> Namespace:
        """A new namespace ``{tag}-{role}`` with the next address of the subnet."""
        index = self.made
        self.made += 1
        name = f"{self.tag}-{role}"
        address = str(self.subnet[10 + index])
        veth = f"{self.tag}v{index}"
        ip("netns", "add", name)
        namespace = Namespace(name, address, self)
        self.namespaces.append(namespace)
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
        ip("link", "set", veth, "master", self.bridge, "up")
        for args in (
            ("link", "set", "lo", "up"),
            ("addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0"),
            ("link", "set", "eth0", "up"),
        ):
            ip("-n", name, *args)
        return namespace

    def close(self) -> None:
        """Stop every process, then remove the namespaces and the bridge."""
        for process in reversed(self.processes):
            process.stop()
        for namespace in self.namespaces:
            with contextlib.suppress(NamespaceError, subprocess.TimeoutExpired):
                for pid in ip("netns", "pids", namespace.name).split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
        for namespace in reversed(self.namespaces):
            with contextlib.suppress(NamespaceError, subprocess.TimeoutExpired):
                ip("netns", "del", namespace.name)
        if self.bridge:
            with contextlib.suppress(NamespaceError, subprocess.TimeoutExpired):
                ip("link", "del", self.bridge)


def free_subnet(seed: int) -> ipaddress.IPv4Network:
    """A /24 of :data:`RANGE` (from the one ``seed`` picks on) that no route of the
    root namespace covers."""
    routes = ip("-4", "route", "show", "table", "all")
    used = [
        ipaddress.IPv4Network(word, strict=False)
        for line in routes.splitlines()
        for word in line.split()[:2]
        if word[:1].isdigit()
    ]
    subnets = list(RANGE.subnets(new_prefix=24))[16:240]
    for n in range(len(subnets)):
        subnet = subnets[(seed + n) % len(subnets)]
        if not any(subnet.overlaps(other) for other in used):
            return subnet
    raise NamespaceError(f"no free /24 in {RANGE}")


@contextlib.contextmanager
def network(folder: Path) -> Iterator[Network]:
    """A bridge and room for namespaces on it, removed at the end (also on
    failure). Skips the test, with one line, where namespaces cannot be made."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if IP is None:
        pytest.skip("network namespaces need iproute2's ip")
    tag = f"sm{os.getpid() % 100000}"
    made = Network(tag=tag, subnet=RANGE, folder=folder)
    try:
        try:
            made.subnet = free_subnet(os.getpid())
            ip("link", "add", f"{tag}br", "type", "bridge")
            made.bridge = f"{tag}br"
            ip("addr", "add", f"{made.gateway}/24", "dev", made.bridge)
            ip("link", "set", made.bridge, "up")
            probe = made.add("probe")
        except (NamespaceError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"cannot make network namespaces: {exc}")
        ip("netns", "del", probe.name)
        made.namespaces.remove(probe)
        yield made
    finally:
        made.close()
