"""Ports a rank's rendezvous and its tools listen on (also what the local launcher picks for MASTER_PORT)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Below the kernel's ephemeral ports (Linux's ip_local_port_range starts at 32768 by default), from here up.
FIRST = 20000


def ephemeral_ports() -> tuple[int, int]:
    """The range the kernel hands out to a bind to port 0 and to outgoing connections' source ports."""
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port(host: str = "") -> int:
    """A TCP port on `host` (every interface by default, as a store listens) that nothing holds now, below the ephemeral
    range: a port the kernel hands out can be taken between this look and the rendezvous listening on it
    (by an MPI transport's listener, mpirun's control port, any outgoing connection), and the ranks then
    wait on someone else's socket. Where the range leaves no room below it, a port the kernel picks."""
    low = ephemeral_ports()[0]
    for port in random.sample(range(FIRST, low), min(64, max(0, low - FIRST))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
