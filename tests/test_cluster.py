"""mpitrain across simulated nodes (tests/cluster.py): network namespaces with host names of their own, joined by
rate-limited links, MPICH over TCP between them.

Ranks land on the nodes -ppn says; every sync mode trains across the links (the links' counters see at least
the bytes the run says it sent) to identical replicas; a link's rate sets how long a transfer takes; a link cut
mid-training ends the job on every node through the watchdog, and the run resumes once the link is back; a
cluster leaves nothing behind. Root only: elsewhere these tests skip, under CI=true they fail.
"""
from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import time

import pytest

from cluster import (PREFIX, SimulatedCluster, cluster_names, missing_capability, namespace_pids, netns_etc_entries,
                     owner_alive)
from conftest import MPITRAIN, make_dataset, write_config

HERE = os.path.dirname(os.path.abspath(__file__))
WHERE_AM_I = os.path.join(HERE, "mpi", "where_am_i.py")
LINK_TRANSFER = os.path.join(HERE, "mpi", "link_transfer.py")
MODEL = {"layers": [{"type": "dense", "units": 256, "activation": "relu"}, {"type": "dense", "units": 3}]}
WATCHDOG_S = 5
SYNCS = {"allreduce": {"mode": "allreduce"}, "averaging": {"mode": "averaging"}, "sharing": {"mode": "sharing"},
         "sharing-split": {"mode": "sharing", "exchange": "split"}}
# builds a cluster, starts a process in its first node, says the cluster's name, and waits to be killed
STALE_OWNER = """
import subprocess, time
from cluster import SimulatedCluster
cluster = SimulatedCluster(nodes=2).start()
subprocess.Popen(["ip", "netns", "exec", cluster.nodes[0], "sleep", "120"], stdout=subprocess.DEVNULL)
print(cluster.name, flush=True)
time.sleep(120)
"""


def require_cluster() -> None:
    """Skip where no cluster can be built (not root, no iproute2); under CI=true that is a failure."""
    reason = missing_capability()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n} nodes")
def cluster(request):
    """A cluster of 2 or 4 nodes on 1 Gb/s links, shared by the tests of the module."""
    require_cluster()
    with SimulatedCluster(nodes=request.param, link_gbps=1) as cluster:
        yield cluster


@pytest.mark.parametrize("ppn", [1, 2])
def test_ranks_run_on_the_nodes_ppn_places_them_on(cluster, ppn):
    """Each rank's host name is its node's: ranks 0..ppn-1 on the first node, and so on."""
    result = cluster.mpiexec(len(cluster.nodes) * ppn, sys.executable, WHERE_AM_I, ppn=ppn, timeout=60)
    assert result.returncode == 0, result.stderr
    ranks = json.loads(result.stdout)
    assert [host for _, host, _ in ranks] == [node for node in cluster.nodes for _ in range(ppn)]
    assert {node_size for _, _, node_size in ranks} == {ppn}  # MPI too sees ppn ranks per node


def test_in_every_node_its_host_name_is_its_own_and_every_node_name_resolves(cluster):
    """What Slurm and Spark rely on: a node's host name is its name, and in every node each node's name resolves to
    that node's address (a hosts file per node); the machine's own /etc/hosts does not know them."""
    resolve = "import socket, sys; print(socket.gethostname(), *map(socket.gethostbyname, sys.argv[1:]))"
    for node in cluster.nodes:
        seen = subprocess.run(cluster.node_command(node, sys.executable, "-c", resolve, *cluster.nodes),
                              capture_output=True, text=True, timeout=30)
        assert seen.returncode == 0, seen.stderr
        assert seen.stdout.split() == [node, *cluster.hosts]
    with open("/etc/hosts") as f:
        machine = f.read()
    assert not any(node in machine for node in cluster.nodes)


@pytest.mark.parametrize("mode", sorted(SYNCS))
def test_training_crosses_the_links_to_identical_replicas(cluster, mode, tmp_path):
    """One epoch on 1 rank per node: the links carry at least what mpitrain counts as sent; replicas agree."""
    make_dataset(tmp_path / "data")
    config = write_config(tmp_path / "config.yaml", tmp_path / "data", model=MODEL, sync=SYNCS[mode],
                          train={"epochs": 1, "log_every": 5})
    before = cluster.bytes_on_links()
    result = cluster.mpiexec(len(cluster.nodes), MPITRAIN, "train", config, timeout=90)
    after = cluster.bytes_on_links()
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["ranks"] == len(cluster.nodes) and summary["sync_mode"] == SYNCS[mode]["mode"]
    assert len(set(summary["replica_hashes"])) == 1, summary["replica_hashes"]

    moved = {node: {way: after[node][way] - before[node][way] for way in ("rx", "tx")} for node in cluster.nodes}
    sent = summary["bytes_sent_per_step"] * summary["steps_per_epoch"] * summary["epochs"]  # rank 0's, by mpitrain
    assert sent > 10_000, summary  # a floor worth checking (MPI's start-up alone moves some 100 KB a node)
    assert moved[cluster.nodes[0]]["tx"] >= sent, moved  # rank 0's part of every exchange left its node
    if not mode.startswith("sharing"):  # dense exchanges: every rank sends as much as rank 0, and gets as much back
        assert all(way >= sent for node in moved.values() for way in node.values()), (sent, moved)


def test_a_link_rate_sets_the_transfer_time():
    """10 MB from node to node over 100 Mb/s and over 1 Gb/s links: about 10x the time, at the shaped rate."""
    require_cluster()
    megabytes, seconds = 10, {}
    for gbps in (0.1, 1):
        with SimulatedCluster(nodes=2, link_gbps=gbps) as cluster:
            result = cluster.mpiexec(2, sys.executable, LINK_TRANSFER, megabytes, timeout=60)
            assert result.returncode == 0, result.stderr
            seconds[gbps] = json.loads(result.stdout)["seconds"]
    assert seconds[0.1] >= 3 * seconds[1], seconds
    measured_gbps = megabytes * 8e6 / seconds[0.1] / 1e9
    assert 0.7 * 0.1 <= measured_gbps <= 1.3 * 0.1, seconds


def test_a_link_cut_mid_training_ends_the_job_on_every_node_and_it_resumes_once_repaired(tmp_path):
    """Node 2's link goes down once metrics.jsonl has a record. Both ranks stop progressing: each one's watchdog
    aborts it (rank 1's message stays on node 2, its stderr file), so no process is left on either node within
    watchdog_s and a margin. With the link back up, --resume finishes the run from its last checkpoint."""
    require_cluster()
    make_dataset(tmp_path / "data")
    config = write_config(tmp_path / "config.yaml", tmp_path / "data", model=MODEL,
                          train={"epochs": 50, "log_every": 5, "watchdog_s": WATCHDOG_S},
                          checkpoint={"every": 5, "unit": "step"})
    run_dir, errors = tmp_path / "run", tmp_path / "stderr-of-rank"
    with SimulatedCluster(nodes=2) as cluster:
        job = cluster.popen(2, "bash", "-c", 'exec "$@" 2>"$0.$PMI_RANK"', errors, MPITRAIN, "train", config)
        _wait_for(lambda: (run_dir / "metrics.jsonl").exists() and (run_dir / "metrics.jsonl").read_text(), job)
        cut = time.monotonic()
        cluster.set_link(cluster.nodes[1], up=False)
        out, err = job.communicate(timeout=WATCHDOG_S + 30)
        ended = time.monotonic() - cut
        while any(cluster.pids().values()) and time.monotonic() - cut < WATCHDOG_S + 15:
            time.sleep(0.2)
        left = cluster.pids()

        assert job.returncode != 0 and not (run_dir / "summary.json").exists(), out + err
        assert ended < WATCHDOG_S + 10, (ended, err)
        assert not any(left.values()), f"left behind: {left}"
        for rank in (0, 1):
            assert f"[rank {rank}] watchdog: no progress for" in (tmp_path / f"stderr-of-rank.{rank}").read_text()
        newest = sorted(glob.glob(f"{run_dir}/checkpoints/ckpt-*.h5"))[-1]
        assert int(re.search(r"ckpt-(\d+)-", newest).group(1)) < 3, newest

        cluster.set_link(cluster.nodes[1], up=True)
        resumed = cluster.mpiexec(2, MPITRAIN, "train", config, "--resume", "--set", "train.epochs=3", timeout=90)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resuming from {newest}" in resumed.stderr + resumed.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == 3 and len(set(summary["replica_hashes"])) == 1, summary


def test_closing_leaves_nothing_behind_also_after_an_exception():
    """An exception in the block while a job runs on both nodes: no namespace, link, bridge or process is left."""
    require_cluster()
    with pytest.raises(RuntimeError, match="inside the block"):
        with SimulatedCluster(nodes=2) as cluster:
            job = cluster.popen(2, sys.executable, "-c", "import time; time.sleep(120)")
            _wait_for(lambda: all(cluster.pids().values()), job)
            pids = [pid for node in cluster.pids().values() for pid in node]
            raise RuntimeError("an error inside the block")
    assert job.returncode is not None
    _assert_gone(cluster.name, pids)


def test_a_cluster_whose_owner_was_killed_is_removed_when_the_next_one_starts():
    """A process builds a cluster, starts a process in a node, and is killed: the next cluster removes both."""
    require_cluster()
    owner = subprocess.Popen([sys.executable, "-c", STALE_OWNER], cwd=HERE, stdout=subprocess.PIPE, text=True)
    try:
        stale = owner.stdout.readline().strip()
        _wait_for(lambda: namespace_pids(f"{stale}n1"), owner)
        sleeper = namespace_pids(f"{stale}n1")[0]
    finally:
        owner.kill()
        owner.communicate()
    assert stale.startswith(PREFIX) and owner_alive(stale) is False, stale
    with SimulatedCluster(nodes=1):
        _assert_gone(stale, [sleeper], nodes=["n2"], links=["v2"])  # the new one may reuse the name, with 1 node
        assert all(owner_alive(name) for name in cluster_names())


def _wait_for(ready, process: subprocess.Popen, timeout: float = 60) -> None:
    """Poll `ready()` until it is true; fail at once if `process` ends first, or after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not ready():
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"exit status {process.returncode} before it was ready\n{out}\n{err}")
        if time.monotonic() > deadline:
            pytest.fail(f"not ready after {timeout} s")
        time.sleep(0.1)


def _assert_gone(name: str, pids: list[int], nodes=(r"n\d+",), links=(r"b", r"v\d+")) -> None:
    """No namespace or hosts file (`nodes`), link or bridge (`links`) of cluster `name` is left, and none of `pids`
    runs."""
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split()
    namespaces += netns_etc_entries()
    left = [ns for ns in namespaces if any(re.fullmatch(name + node, ns) for node in nodes)]
    left += [link for link in os.listdir("/sys/class/net") if any(re.fullmatch(name + end, link) for end in links)]
    assert not left, f"left behind: {left}"
    running = [pid for pid in pids if _running(pid)]
    assert not running, f"processes of the nodes still run: {running}"


def _running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, killed but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
