"""A sweep that starts its own Ray listens on loopback only: every listening TCP socket of the sweep's
process tree (driver, GCS, raylet, workers), listed from /proc while a trial runs, is on 127.0.0.1
or ::1. Joining a cluster (`--address`) is Ray's own business and not tested here."""
from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from sweep_helpers import sweep_args

slow = pytest.mark.slow
LISTEN = "0A"  # TCP state in /proc/net/tcp


def tcp_address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The address of a /proc/net/tcp{,6} entry: 4-byte words in host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    swapped = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return ipaddress.ip_address(socket.inet_ntop(family, swapped))


def is_loopback(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def process_tree(root: int) -> set[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return tree


def listening(pids: set[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket the processes hold."""
    inodes = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:  # a process that ended meanwhile
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN and fields[9] in inodes:
                host, port = fields[1].split(":")
                found.append((inodes[fields[9]], str(tcp_address(host)), int(port, 16)))
    return found


def test_proc_addresses_decode_as_ss_prints_them():
    assert str(tcp_address("0100007F")) == "127.0.0.1"
    assert str(tcp_address("00000000")) == "0.0.0.0"
    assert tcp_address("0000000000000000FFFF00000100007F").ipv4_mapped == ipaddress.IPv4Address("127.0.0.1")
    assert is_loopback(tcp_address("0000000000000000FFFF00000100007F"))
    assert is_loopback(tcp_address("00000000000000000000000001000000"))  # ::1
    assert not is_loopback(tcp_address("00000000000000000000000000000000"))  # :: (every interface)
    assert not is_loopback(tcp_address("020200C0"))  # 192.0.2.2


@slow
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc")
def test_a_local_sweep_listens_on_loopback_only(tmp_path, tmp_path_factory):
    env = os.environ | {"RAY_TMPDIR": str(tmp_path_factory.mktemp("rayloop"))}  # short: Ray's socket paths
    log = tmp_path / "sweep.log"  # a file, not a pipe: nobody reads while it runs, a full pipe would stall it
    with open(log, "w") as out:
        sweep = subprocess.Popen(
            [sys.executable, "sweeps/fedselect_grid.py", *sweep_args(tmp_path, "loopback", rounds=500),
             "--algorithms", "fedselect", "--anchors", "--pers-rate", "0.25"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 240
        while not list((tmp_path / "loopback").glob("rounds/*.parquet")):  # a trial has reported a round
            assert sweep.poll() is None, log.read_text()[-3000:]
            assert time.time() < deadline, "no trial reported a round within 4 minutes"
            time.sleep(0.5)
        sockets = listening(process_tree(sweep.pid))
        names = {pid: (Path(f"/proc/{pid}/comm").read_text().strip() if Path(f"/proc/{pid}/comm").exists() else "?")
                 for pid, _, _ in sockets}
    finally:
        os.killpg(sweep.pid, signal.SIGTERM)
        sweep.wait(timeout=120)
    assert len(sockets) >= 3  # GCS, raylet, workers at least: the listing saw Ray's processes
    exposed = [(names[pid], address, port) for pid, address, port in sockets
               if not is_loopback(ipaddress.ip_address(address))]
    assert not exposed, f"listening beyond this machine: {exposed}"
