"""Multi-node: a sweep joins a two-node Ray cluster through `--address` (README, "Scaling out").

The cluster is built on this machine with the commands a user runs on two hosts, `ray start
--head` and `ray start --address=HEAD`: one CPU per node, each node with its own temp dir (its
sockets, session and logs). Each `ray start` runs with `--block` in a session of its own (its
node's processes stay in that session), so the test stops exactly these two nodes (SIGTERM to each
`ray start`, which drains its node and ends its processes; then SIGKILL for anything left in those
sessions) and never another Ray on the machine, as `ray stop` would. The cluster gets its own
random auth token (Ray's token auth), so nothing is read from or written to ~/.ray.

The sweep is the real command line, `python sweeps/fedselect_grid.py ... --address HEAD`, in a
subprocess: pytest's own session cluster (conftest `ray_cluster`) is neither used nor disturbed.

Where each trial ran: Tune's per-trial result log (`tune/<trial>/result.json`) records the pid of
the process that ran the trial; the cluster's actor table (GCS) gives that process's node, and
that node's own log folder holds the process's log file. The trials' own `node_id` column
(PROVENANCE in sweeps/trainable.py) must agree.

Why 16 rounds and not 2: the launcher reuses trial actors
(`reuse_actors=True`). A trial that ends before the other node's trial process is up (a fresh
process imports torch, Ray Tune and the trainable: a few seconds) hands its process the next
trial, and sub-second trials then all run on whichever node was ready first. The two FedSelect
trials (about 0.3 s a round) are first in grid order, so they start first, one per node, and
last several times longer than a trial process takes to start; the two anchors are quicker.
"""
from __future__ import annotations

import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from sweeps.parquet_sink import read_rounds

from conftest import REPO
from sweep_helpers import direct_final_rows, final_rows, mlflow_runs, sweep_args

ROUNDS = 16
CLIENTS = 3                      # TINY_SWEEP's --num-clients
NODE_START_S = 120               # a node up (both share 2 cores with whatever else runs)
SWEEP_S = 420                    # the whole sweep, driver start to tables
NODE_STOP_S = 45                 # Ray drains a node for up to 30 s on SIGTERM

# Run inside the cluster by a short-lived driver: the alive nodes (waiting until `want` of them
# have joined) and the actor table. The table comes from the GCS through ray._private.state:
# ray.util.state would need the dashboard (ray[default]), which this project does not install.
PROBE = r"""
import json, sys, time
import ray
from ray._private import state

address, want = sys.argv[1], int(sys.argv[2])
ray.init(address=address, logging_level="ERROR", log_to_driver=False)
deadline = time.monotonic() + 60
while True:
    nodes = [n for n in ray.nodes() if n["Alive"]]
    if len(nodes) >= want or time.monotonic() > deadline:
        break
    time.sleep(0.2)
actors = [{"class": a["ActorClassName"], "pid": a["Pid"], "node_id": a["Address"]["NodeID"], "state": a["State"]}
          for a in state.actors().values()]
print(json.dumps({"nodes": [{"node_id": n["NodeID"], "raylet_socket": n["RayletSocketName"],
                             "cpus": n["Resources"].get("CPU", 0.0)} for n in nodes], "actors": actors}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _session_members(sessions: set[int]) -> list[int]:
    """Live (not zombie) processes in one of these sessions, read from /proc. (A session, not a
    process group: Ray puts each worker process in a group of its own, within the session.)"""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        state, _ppid, _pgrp, session = stat[stat.rindex(")") + 2:].split()[:4]
        if int(session) in sessions and state != "Z":
            members.append(int(entry.name))
    return members


def _end_with_pytest() -> None:
    """preexec_fn of every process the test starts: SIGTERM to it when pytest dies, however
    pytest dies (Linux PR_SET_PDEATHSIG); a `ray start --block` then stops its node."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return f"({path} unreadable)"


class TwoNodeCluster:
    """A head and a worker node on this machine, and every process this test starts.

    Each process this test starts (the two `ray start --block`, the probes, the sweep driver)
    leads a new session, whose id is its pid; Ray's own processes (GCS, raylet, agents, trial
    workers) stay in it. `stop()` ends all of them and only them.
    """

    def __init__(self):
        # Short on purpose: Ray's unix sockets live under the temp dir (limit ~107 characters).
        self.root = Path(tempfile.mkdtemp(prefix="rmn-", dir="/tmp"))
        self.env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_TMPDIR")} | {
            "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16),  # this cluster's own token
            "RAY_USAGE_STATS_ENABLED": "0", "RAY_AIR_NEW_OUTPUT": "0", "PYTHONUNBUFFERED": "1"}
        self.nodes: dict[str, subprocess.Popen] = {}
        self.sessions: set[int] = set()
        self.address = ""

    def _spawn(self, argv: list[str], log: Path, cwd: Path) -> subprocess.Popen:
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, cwd=cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_end_with_pytest)
        self.sessions.add(proc.pid)
        return proc

    def _start_node(self, role: str, *flags: str) -> str:
        """`ray start --block` for one node; returns the cluster address it wrote once up."""
        temp = self.root / role
        proc = self._spawn([sys.executable, "-m", "ray.scripts.scripts", "start", "--block", f"--temp-dir={temp}",
                            "--num-cpus=1", "--num-gpus=0", "--object-store-memory=100000000",
                            f"--dashboard-agent-listen-port={_free_port()}", "--disable-usage-stats", *flags],
                           self.root / f"{role}.log", self.root)
        self.nodes[role] = proc
        written = temp / "ray_current_cluster"   # `ray start` writes it when its node is running
        deadline = time.monotonic() + NODE_START_S
        while not (written.exists() and written.read_text().strip()):
            if proc.poll() is not None:
                raise AssertionError(f"ray start ({role}) exited with {proc.returncode}:\n"
                                     f"{_tail(self.root / f'{role}.log')}")
            if time.monotonic() > deadline:
                raise AssertionError(f"ray start ({role}) not up after {NODE_START_S} s:\n"
                                     f"{_tail(self.root / f'{role}.log')}")
            time.sleep(0.2)
        return written.read_text().strip()

    def start(self) -> None:
        self.address = self._start_node("head", "--head", f"--port={_free_port()}", "--include-dashboard=false",
                                        f"--dashboard-port={_free_port()}")
        self._start_node("worker", f"--address={self.address}")

    def role_of(self, node: dict) -> str:
        """`head` or `worker`: whose temp dir the node's raylet socket is in."""
        for role in self.nodes:
            if Path(node["raylet_socket"]).is_relative_to(self.root / role):
                return role
        raise AssertionError(f"node {node['node_id']} is not one of this test's nodes: {node['raylet_socket']}")

    def probe(self, want: int = 2) -> dict:
        """Alive nodes (after waiting for `want` of them) and the actor table, from a driver."""
        log = self.root / "probe.log"
        proc = self._spawn([sys.executable, "-c", PROBE, self.address, str(want)], log, self.root)
        self._wait(proc, 120, "probe", log)
        assert proc.returncode == 0, f"probe failed:\n{_tail(log)}"
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("{")]
        assert lines, f"probe printed no JSON:\n{_tail(log)}"
        return json.loads(lines[-1])

    def sweep(self, argv: list[str], log: Path) -> int:
        """The study's command line, as a user types it on the head node; its exit status."""
        proc = self._spawn([sys.executable, "sweeps/fedselect_grid.py", *argv], log, REPO)
        self._wait(proc, SWEEP_S, "sweep", log)
        return proc.returncode

    def _wait(self, proc: subprocess.Popen, timeout: float, what: str, log: Path) -> None:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill_session(proc.pid)
            proc.wait()
            raise AssertionError(f"{what} still running after {timeout:.0f} s; killed. Its output:\n{_tail(log)}")

    def _kill_session(self, session: int) -> None:
        for pid in _session_members({session}):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop(self) -> list[int]:
        """Stop both nodes (worker first), then kill whatever of ours is left; returns the pids
        that had to be killed. Idempotent."""
        for role in ("worker", "head"):
            proc = self.nodes.get(role)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=NODE_STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # Ray's processes end on their own once their `ray start` has gone (kernel fate-sharing);
        # give them a moment, then kill what remains of our sessions.
        deadline = time.monotonic() + 15
        while _session_members(self.sessions) and time.monotonic() < deadline:
            time.sleep(0.2)
        leftovers = _session_members(self.sessions)
        for session in self.sessions:
            self._kill_session(session)
        return leftovers

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def two_nodes():
    cluster = TwoNodeCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        deadline = time.monotonic() + 10
        while _session_members(cluster.sessions) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _session_members(cluster.sessions)
        cluster.remove()
        assert not left, f"processes of the test cluster survived SIGKILL: {left}"


def _trial_pids(folder: Path) -> dict[str, int]:
    """trial_id -> pid of the process that ran the trial's last round, from Tune's per-trial
    result log (one JSON line per report, with the reporting process's pid)."""
    pids = {}
    for result in sorted((folder / "tune").glob("*/result.json")):
        last = json.loads(result.read_text().splitlines()[-1])
        pids[last["trial_id"]] = last["pid"]
    return pids


@pytest.mark.slow
def test_sweep_through_address_runs_trials_on_both_nodes_with_complete_results(two_nodes, tmp_path):
    before = two_nodes.probe(want=2)["nodes"]
    assert sorted(two_nodes.role_of(n) for n in before) == ["head", "worker"], before
    assert all(n["cpus"] == 1 for n in before), before
    node_ids = {two_nodes.role_of(n): n["node_id"] for n in before}

    # 2 FedSelect trials (several seconds each) and 2 anchors, one CPU each: more trials than the
    # cluster has CPUs, so they queue, and the two nodes run them side by side.
    argv = sweep_args(tmp_path, "multinode", "--pers-rate", "0.1", "0.25", "--anchors", "fedavg", "local",
                      "--cpus-per-trial", "1", "--gpus-per-trial", "0", "--address", two_nodes.address,
                      rounds=ROUNDS)
    log = tmp_path / "sweep.log"
    started = time.monotonic()
    assert two_nodes.sweep(argv, log) == 0, _tail(log)
    elapsed = time.monotonic() - started
    folder = tmp_path / "multinode"

    # ---- where each trial ran
    trials = pd.read_parquet(folder / "trials.parquet")
    pids = _trial_pids(folder)
    assert sorted(pids) == sorted(trials.trial_id), (sorted(pids), trials.trial_id.tolist())
    after = two_nodes.probe(want=2)
    trial_actors = [a for a in after["actors"] if a["class"] == "ImplicitFunc"]  # Tune's function trainables
    where = {}
    for trial_id, pid in pids.items():
        found = [a for a in trial_actors if a["pid"] == pid]
        assert len(found) == 1, f"trial {trial_id}: pid {pid} matches actors {found} (all: {trial_actors})"
        role = next((r for r, node_id in node_ids.items() if node_id == found[0]["node_id"]), None)
        assert role is not None, f"trial {trial_id} ran on node {found[0]['node_id']}, not one of {node_ids}"
        # ... and that node's own log folder (its temp dir) holds the trial process's log
        assert list((two_nodes.root / role).glob(f"session_*/logs/python-core-worker-*_{pid}.log")), (trial_id, role)
        where[trial_id] = role
    timeline = trials.set_index("trial_id")[["algorithm", "started_at", "reported_at"]].assign(node=pd.Series(where))
    timeline[["started_at", "reported_at"]] -= trials.started_at.min()  # seconds since the first trial started
    assert set(where.values()) == {"head", "worker"}, f"all trials ran on one node:\n{timeline}\nsweep: {elapsed:.0f} s"
    # ... and trials.parquet says the same: each trial's recorded node is the one its process ran on
    assert trials.set_index("trial_id").node_id.to_dict() == {t: node_ids[r] for t, r in where.items()}

    # ---- Parquet: every trial's rows, every round and client, once
    assert len(trials) == 4 and (trials.status == "COMPLETED").all(), trials[["trial_id", "status"]]
    assert sorted(trials.algorithm) == ["fedavg", "fedselect", "fedselect", "local"]
    assert (trials.rounds_done == ROUNDS).all() and trials.config_hash.is_unique and trials.trial_id.is_unique
    assert trials.data_from_driver.all()  # the worker node's trials got the data from the driver's object store
    assert (trials.device == "cpu").all() and (trials.threads == 1).all()
    rounds = read_rounds(folder)
    assert len(rounds) == 4 * ROUNDS * CLIENTS
    assert not rounds.duplicated(["config_hash", "round", "client"]).any()
    expected = {(r, c) for r in range(1, ROUNDS + 1) for c in range(CLIENTS)}
    for key, rows in rounds.groupby("config_hash"):
        assert set(zip(rows["round"], rows["client"])) == expected, key
    assert set(rounds.config_hash) == set(trials.config_hash)
    assert sorted(p.name for p in (folder / "rounds").iterdir()) == sorted(f"{h}.parquet" for h in trials.config_hash)
    assert rounds.groupby("config_hash")["trial_id"].nunique().eq(1).all()
    assert set(rounds.trial_id) == set(trials.trial_id)
    # a trial of the worker node (the quickest) has exactly the numbers fl_core computes alone
    remote = trials[trials.trial_id.map(where) == "worker"].sort_values("wall_seconds").head(1)
    pd.testing.assert_frame_equal(final_rows(rounds[rounds.config_hash.isin(remote.config_hash)]),
                                  direct_final_rows(remote))

    # ---- MLflow: the sweep's parent run and one finished child run per trial, every round logged
    client, parents, children = mlflow_runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 4
    assert sorted(c.data.tags["config_hash"] for c in children) == sorted(trials.config_hash)
    by_hash = trials.set_index("config_hash")
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.tags["parent_run"] == parents[0].info.run_id and child.data.tags["sweep"] == "multinode"
        history = client.get_metric_history(child.info.run_id, "acc_mean")
        assert sorted(m.step for m in history) == list(range(1, ROUNDS + 1))
        final = max(history, key=lambda m: m.step)
        assert final.value == pytest.approx(by_hash.loc[child.data.tags["config_hash"], "acc_mean"])

    # ---- and the nodes go away with nothing left behind
    assert two_nodes.stop() == []  # no process needed SIGKILL: SIGTERM to each `ray start` ended its node
