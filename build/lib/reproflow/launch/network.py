"""An emulated network for local runs: every emulated host in its own network namespace, the hosts
joined by a bridge, each host's link shaped to a bandwidth in both directions (tc's token bucket).

On one machine, ranks of different emulated hosts otherwise talk over loopback, where a transfer is
a memory copy and the CPU is the bottleneck; a cluster's transfers are bound by each host's link. A
claim whose mechanism is bandwidth (one sender feeding many receivers) needs the cluster's
bottleneck. Ranks of one host share its namespace and talk over its own loopback, unshaped, as GPUs of
one node do over NVLink. Needs root, iproute2 (`ip`, `tc`) and the kernel's network namespaces, veth,
bridge and tbf; where any is missing, `EmulatedNetwork.unavailable` says which and the run goes
unshaped. Latency is not shaped: that needs the kernel's netem, which is not always built.

The test cluster's nodes (tests/slurm/start.sh) are hosts of such a network too, one that outlives the
process that built it: `python -m reproflow.launch.network up slurm --hosts 2 --rate 1gbit` builds
it under a name (its devices rfslurmbr, rfslurmh<host>, never swept as a dead run's) and prints its
addresses as shell assignments; `down slurm` removes it.
"""

from __future__ import annotations

import argparse
import fcntl
import ipaddress
import os
import re
import shutil
import subprocess
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from reproflow.spec.errors import ReproflowError

UNSHAPED = "loopback, unshaped"
# Emulated hosts' addresses: a /24 of PREFIX.0.0/16 that no route of the machine overlaps.
PREFIX, PREFIX_ENV = "10.213", "REPROFLOW_NETWORK_PREFIX"
# One file per live network, locked while its run lives (/run is emptied at boot, as the links are).
OWNERS = Path("/run/reproflow/networks")
# Bits only, as tc writes them (its "mbps" means megabytes): 200, 200mbit, 1gbit, 100 Mbit/s.
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:(k|m|g)?bit(?:/s)?)?\s*$", re.I)


def parse_rate(text: str) -> float:
    """'1gbit', '200mbit', '200' (Mbit/s) -> Mbit/s per host and direction."""
    match = _RATE.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ReproflowError(f"launch.network (or --network) = {text!r} is not a bandwidth. Give each host's link "
                             "rate, each way, e.g. '200mbit' or '1gbit', or '' for loopback.")
    scale = {"k": 1e-3, "m": 1.0, "g": 1e3, None: 1.0}[(match.group(2) or "").lower() or None]
    return float(match.group(1)) * scale


@dataclass
class EmulatedNetwork:
    """`hosts` namespaces on one bridge, each link shaped to `mbit` Mbit/s each way; a context manager
    that builds them on entry and removes them on exit (also after a failed run)."""

    hosts: int
    mbit: float
    tag: str = field(default_factory=lambda: str(os.getpid()))  # names: rf<pid>br, rf<pid>v<host>, rf<pid>h<host>
    _made: list[list[str]] = field(default_factory=list)
    _owner: IO[str] | None = None
    subnet: str = ""  # the first three octets of its /24, chosen on entry (_free_subnet)

    def address(self, host: int) -> str:
        """The address of emulated host `host` (rank 0's host holds the rendezvous)."""
        return f"{self.subnet}.{host + 1}"

    @property
    def gateway(self) -> str:
        """The machine's own address on the bridge: what every host reaches the outside by."""
        return f"{self.subnet}.254"

    def namespace(self, host: int) -> str:
        return f"rf{self.tag}h{host}"

    def describe(self) -> str:
        """What every row records of the network its job ran on."""
        return f"emulated: {self.hosts} hosts, {self.mbit:g} Mbit/s per host each way (tc tbf), latency unshaped"

    def command(self, host: int, cmd: list[str]) -> list[str]:
        """`cmd` run inside emulated host `host`'s namespace."""
        return ["ip", "netns", "exec", self.namespace(host), *cmd]

    @staticmethod
    def unavailable() -> str:
        """Why this machine cannot emulate the network ('' when it can)."""
        if os.geteuid() != 0:
            return "emulating a network needs root (network namespaces and tc)"
        missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
        if missing:
            return f"emulating a network needs iproute2 ({' and '.join(missing)} not found: apt-get install iproute2)"
        return ""

    def _run(self, *args: str, undo: list[str] | None = None) -> None:
        proc = subprocess.run(list(args), capture_output=True, text=True, check=False)
        if proc.returncode:
            raise OSError(f"`{' '.join(args)}` failed: {proc.stderr.strip() or proc.returncode}")
        if undo:
            self._made.append(undo)

    def _shape(self, device: str, prefix: tuple[str, ...] = ()) -> None:
        # A bucket of 1 ms at the rate (at least 16 KiB): larger ones let short transfers pass unshaped.
        burst = max(16 * 1024, int(self.mbit * 1e6 / 8 / 1000))
        self._run(*prefix, "tc", "qdisc", "add", "dev", device, "root", "tbf", "rate", f"{self.mbit:g}mbit",
                  "burst", str(burst), "latency", "100ms")

    @staticmethod
    def _sweep() -> None:
        """Remove what killed runs left: a namespace or a bridge of theirs would hold an address of a later
        run's subnet. A run is dead when its file in OWNERS can be locked. Where there is no file, the
        network is another mount namespace's (a container or a clean room sharing this network
        namespace, whose processes may be invisible here) and is left alone."""
        found: dict[str, list[str]] = {}
        for name, tag, _ in re.findall(r"\b(rf(\d+)(br|h\d+))\b", _devices()):
            found.setdefault(tag, []).append(name)
        for tag, names in found.items():
            try:
                with open(OWNERS / tag) as owner:
                    fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    _remove(names)
                    (OWNERS / tag).unlink()
            except (FileNotFoundError, BlockingIOError):  # not this namespace's, or alive
                continue

    def _free_subnet(self) -> str:
        """A /24 under PREFIX (or REPROFLOW_NETWORK_PREFIX) that no route of this machine overlaps, but
        the default one: a live run's network, or a real route (a VPN's 10.0.0.0/8) it would shadow."""
        prefix = os.environ.get(PREFIX_ENV, PREFIX)
        try:
            ipaddress.ip_network(f"{prefix}.0.0/16")
        except ValueError:
            raise ReproflowError(f"{PREFIX_ENV}={prefix[:40]!r}: give the first two octets of a private IPv4 range "
                                 f"no route of this machine uses, e.g. {PREFIX} or 172.30.") from None
        listing = subprocess.run(["ip", "-o", "-4", "route", "show"], capture_output=True, text=True,
                                 check=False).stdout
        routes = [ipaddress.ip_network(r, strict=False) for r in re.findall(r"^(\d+\.\d+\.\d+\.\d+(?:/\d+)?)",
                                                                           listing, re.M)]
        start = (int(self.tag) if self.tag.isdigit() else zlib.crc32(self.tag.encode())) % 250
        for third in [*range(start, 250), *range(start)]:
            candidate = ipaddress.ip_network(f"{prefix}.{third}.0/24")
            if not any(candidate.overlaps(route) for route in routes):
                return f"{prefix}.{third}"
        covering = ", ".join(str(r) for r in routes if r.overlaps(ipaddress.ip_network(f"{prefix}.0.0/16")))
        raise OSError(f"every {prefix}.x.0/24 overlaps a route of this machine ({covering}); set {PREFIX_ENV} to "
                      "the first two octets of a private range no route uses, e.g. 172.30")

    def __enter__(self) -> EmulatedNetwork:
        self._sweep()
        self.subnet = self._free_subnet()
        OWNERS.mkdir(parents=True, exist_ok=True)
        self._owner = open(OWNERS / self.tag, "w")
        fcntl.flock(self._owner, fcntl.LOCK_EX)
        self._build()
        return self

    def _build(self) -> None:
        bridge = f"rf{self.tag}br"
        try:
            self._run("ip", "link", "add", bridge, "type", "bridge", undo=["ip", "link", "del", bridge])
            self._run("ip", "addr", "add", f"{self.subnet}.254/24", "dev", bridge)
            self._run("ip", "link", "set", bridge, "up")
            for host in range(self.hosts):
                ns, outside = self.namespace(host), f"rf{self.tag}v{host}"
                inside = ("ip", "netns", "exec", ns)
                self._run("ip", "netns", "add", ns, undo=["ip", "netns", "del", ns])
                self._run("ip", "link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", ns,
                          undo=["ip", "link", "del", outside])
                self._run("ip", "link", "set", outside, "master", bridge, "up")
                self._run(*inside, "ip", "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
                self._run(*inside, "ip", "link", "set", "eth0", "up")
                self._run(*inside, "ip", "link", "set", "lo", "up")
                self._shape("eth0", inside)  # the host's sending side
                self._shape(outside)  # its receiving side: what the bridge sends into its link
        except OSError:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        for undo in reversed(self._made):
            subprocess.run(undo, capture_output=True, check=False)
        self._made.clear()
        if self._owner:
            (OWNERS / self.tag).unlink(missing_ok=True)
            self._owner.close()
            self._owner = None


def _remove(names: list[str]) -> None:
    """Delete these bridges and namespaces (a namespace takes its veth pair with it)."""
    for name in names:
        subprocess.run(["ip", "link", "del", name] if name.endswith("br") else ["ip", "netns", "del", name],
                       capture_output=True, check=False)


def _devices() -> str:
    """This machine's bridges and network namespaces, as `ip` lists them."""
    return "".join(subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
                   for cmd in (["ip", "-o", "link", "show", "type", "bridge"], ["ip", "netns", "list"]))


def _named(name: str) -> list[str]:
    """The devices of the named network that exist now."""
    return sorted(set(re.findall(rf"\brf{re.escape(name)}(?:br|h\d+)\b", _devices())))


def main(argv: list[str] | None = None) -> int:
    """`up NAME --hosts N --rate R`: a network that stays until `down NAME` (what an earlier one of that
    name left is removed first); prints its addresses and description as shell assignments."""
    parser = argparse.ArgumentParser(prog="python -m reproflow.launch.network")
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("name", help="letters only: its devices are rf<name>br and rf<name>h<host>")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--rate", default="1gbit", help="each host's link, each way (e.g. 1gbit, 200mbit)")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[a-z]{1,8}", args.name):
        parser.error(f"name {args.name!r}: give 1-8 lowercase letters (digits name the networks of local runs)")
    _remove(_named(args.name))
    if args.action == "down":
        return 0
    why = EmulatedNetwork.unavailable()
    try:
        if why:
            raise OSError(why)
        net = EmulatedNetwork(args.hosts, parse_rate(args.rate), tag=args.name)
        net.subnet = net._free_subnet()
        net._build()
    except (OSError, ReproflowError) as exc:
        print(f"network {args.name}: {exc}", file=sys.stderr)
        return 1
    addresses = " ".join(net.address(h) for h in range(args.hosts))
    namespaces = " ".join(net.namespace(h) for h in range(args.hosts))
    print(f"gateway={net.gateway}\naddresses='{addresses}'\nnamespaces='{namespaces}'\n"
          f"description='{net.describe()}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
