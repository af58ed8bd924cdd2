"""mpitrain across simulated nodes (tests/harness/cluster.py): network namespaces with host names of their own, joined by
rate-limited links, MPICH over TCP between them.

Ranks land on the nodes -ppn says; every sync mode trains across the links (the links' counters see at least
the bytes the run says it sent) to identical replicas; a link's rate sets how long a transfer takes; a link cut
mid-training ends the job on every node through the watchdog, and the run resumes once the link is back; a
cluster leaves nothing behind. With a slurmd in each node (tests/harness/slurm.py), `sbatch --nodes=2` trains
across the links, and the ETL on a Spark standalone cluster of one worker per node writes the dataset that
Spark's local mode writes; stopping Slurm leaves no daemon or job step behind. Root only, and Slurm's tests
need Debian's Slurm (make slurm): elsewhere these tests skip, under CI=true they fail.
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

from mpitrain.data.shards import read_manifest, sha256_file
from mpitrain.parallel.rollcall import verdict
from mpitrain.testing.cluster import (
    PREFIX,
    SimulatedCluster,
    cluster_names,
    missing_capability,
    namespace_pids,
    netns_etc_entries,
    owner_alive,
)
from mpitrain.testing.datasets import make_dataset, write_config
from mpitrain.testing.launch import MPITRAIN, RANK_SCRIPTS, TEST_JVM_OPTIONS, VENV_BIN, command, running
from mpitrain.testing.slurm import REPO, SLURM, job_logs, start_slurm, write_mlp_config

HERE = os.path.dirname(os.path.abspath(__file__))
WHERE_AM_I = os.path.join(RANK_SCRIPTS, "where_am_i.py")
LINK_TRANSFER = os.path.join(RANK_SCRIPTS, "link_transfer.py")
MODEL = {"layers": [{"type": "dense", "units": 256, "activation": "relu"}, {"type": "dense", "units": 3}]}
WATCHDOG_S = 5
SYNCS = {"allreduce": {"mode": "allreduce"}, "averaging": {"mode": "averaging"}, "sharing": {"mode": "sharing"},
         "sharing-split": {"mode": "sharing", "exchange": "split"},
         "sharing-recursive": {"mode": "sharing", "exchange": "recursive"}}
# builds a cluster, starts a process in its first node, says the cluster's name, and waits to be killed
STALE_OWNER = """
import subprocess, time
from mpitrain.testing.cluster import SimulatedCluster
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
    sent = summary["bytes_sent_per_step"] * summary["steps_per_epoch"] * summary["epochs"]  # ranks' mean, by mpitrain
    assert sent > 10_000, summary  # a floor worth checking (MPI's start-up alone moves some 100 KB a node)
    assert moved[cluster.nodes[0]]["tx"] >= sent, moved  # rank 0's part of every exchange left its node
    if not mode.startswith("sharing"):  # dense exchanges: every rank sends as much as rank 0, and gets as much back
        assert all(way >= sent for node in moved.values() for way in node.values()), (sent, moved)


@pytest.mark.alone
def test_the_links_count_the_training_steps_apart_from_the_rest_of_a_run(cluster, tmp_path):
    """benchmarks/cluster.py's wire bytes: the links' counters sampled while `allreduce` trains, read between the
    first and the last metrics window. Per step that is at least the gradient each rank sends (MPI's algorithm on
    N ranks may send more: 2 (N-1)/N of it twice), and less than the whole run's bytes per step, whose start-up
    broadcast, evaluation and summary the windows leave out."""
    make_dataset(tmp_path / "data", n_train=2000)  # 31 steps on 4 nodes: a sample's error is a small part of them
    config = write_config(tmp_path / "config.yaml", tmp_path / "data", model=MODEL, sync={"mode": "allreduce"},
                          train={"epochs": 1, "log_every": 2})
    with cluster.link_samples(every_s=0.002) as links:  # steps take a few ms here
        before = cluster.bytes_on_links()
        result = cluster.mpiexec(len(cluster.nodes), MPITRAIN, "train", config, timeout=90)
        after = cluster.bytes_on_links()
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    windows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    windows = [w for w in windows if w["kind"] == "window"]
    assert len(windows) >= 3 and links.times[0] < windows[0]["time"] < windows[-1]["time"] < links.times[-1]
    per_step = links.per_training_step(windows)
    run = sum(after[node]["tx"] - before[node]["tx"] for node in cluster.nodes) / len(cluster.nodes) / (
        summary["steps_per_epoch"] * summary["epochs"])
    gradient = 4 * summary["n_params"]
    assert 0.95 * gradient <= per_step <= 2.5 * gradient and per_step < run, (per_step, run, gradient)
    with pytest.raises(ValueError, match="no training steps between them"):
        links.per_training_step(windows[:1])
    with pytest.raises(ValueError, match="not inside the samples' span"):
        links.sent(links.times[0] - 1, links.times[-1])


def test_overlapped_allreduce_equals_blocking_across_the_nodes(cluster):
    """tests/mpi/ranks/overlap_checks.py with one rank per node: buckets posted during backward over TCP between nodes give
    the blocking Allreduce's parameters (bit for bit on 2 nodes), replicas identical, for every bucket cut."""
    result = cluster.mpiexec(len(cluster.nodes), sys.executable, os.path.join(RANK_SCRIPTS, "overlap_checks.py"),
                             timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    passed = [line for line in result.stdout.splitlines() if line.startswith("OK ")]
    assert len(passed) == 21 and all(line.endswith(f" {len(cluster.nodes)}") for line in passed), result.stdout
    assert sum("overlapped equals blocking" in line for line in passed) == 6


@pytest.mark.alone
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


@pytest.mark.alone
def test_a_link_cut_mid_training_ends_the_job_on_every_node_and_it_resumes_once_repaired(tmp_path):
    """Node 2's link goes down once the run has written a checkpoint (a metrics record, written just before the
    checkpoint's collectives, let the cut land between them on a fast machine, leaving nothing to resume). Both
    ranks stop progressing: each one's watchdog aborts it (rank 1's message stays on node 2, its stderr file), so no
    process is left on either node within watchdog_s and a margin. With the link back up, --resume finishes the run from its last checkpoint."""
    require_cluster()
    make_dataset(tmp_path / "data")
    config = write_config(tmp_path / "config.yaml", tmp_path / "data", model=MODEL,
                          train={"epochs": 50, "log_every": 5, "watchdog_s": WATCHDOG_S},
                          checkpoint={"every": 5, "unit": "step"})
    run_dir, errors = tmp_path / "run", tmp_path / "stderr-of-rank"
    with SimulatedCluster(nodes=2) as cluster:
        job = cluster.popen(2, "bash", "-c", 'exec "$@" 2>"$0.$PMI_RANK"', errors, MPITRAIN, "train", config)
        _wait_for(lambda: glob.glob(f"{run_dir}/checkpoints/ckpt-*.h5"), job)
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
        # the roll-call across the two nodes: each rank that answered is in a collective the cut stopped (the
        # gradients' exchange, or a metrics window's gather, a step apart as the cut lands), and rank 0's line is
        # the verdict of the states in the folder it names
        forensics = run_dir / "forensics"
        states = [json.loads(path.read_text()) for path in sorted(forensics.glob("rank-*.json"))]
        assert states and all(state["collective"] is not None for state in states), states
        assert f": {verdict(states, 2)}; each rank's collectives and stacks: {forensics}" in \
            (tmp_path / "stderr-of-rank.0").read_text()
        newest = sorted(glob.glob(f"{run_dir}/checkpoints/ckpt-*.h5"))[-1]
        epoch = int(re.search(r"ckpt-(\d+)-", newest).group(1))  # how far it got depends on the machine's speed
        assert epoch < 50, newest

        cluster.set_link(cluster.nodes[1], up=True)
        resumed = cluster.mpiexec(2, MPITRAIN, "train", config, "--resume", "--set", f"train.epochs={epoch + 2}",
                                  timeout=90)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resuming from {newest}" in resumed.stderr + resumed.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == epoch + 2 and len(set(summary["replica_hashes"])) == 1, summary


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


# -- Slurm across the nodes: a slurmd in each, slurmctld and munged in the root namespace --

# What a job's ranks use between nodes, by launcher: Hydra's ranks, UCX over TCP; srun's, MPICH's OFI netmod,
# which train.sbatch picks since srun --mpi=pmi2 cannot start MPICH's UCX netmod on several nodes (docs/slurm.md).
NETWORK = {"mpiexec": {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "eth0"}, "srun": {}}


@pytest.fixture(scope="module")
def slurm_nodes():
    """2 nodes on 1 Gb/s links, each with a slurmd, and Slurm's controller: (cluster, slurm) for the module."""
    require_cluster()
    with SimulatedCluster(nodes=2, link_gbps=1) as cluster, start_slurm(cluster) as slurm:
        yield cluster, slurm


@pytest.mark.parametrize("launcher", ["srun", "mpiexec"])
def test_sbatch_on_two_nodes_trains_across_the_links_to_identical_replicas(slurm_nodes, launcher, tmp_path):
    """sbatch --nodes=2 slurm/train.sbatch: Slurm gives the job both nodes, 2 ranks on each; every node's link
    carries at least the gradients a rank sends (so ranks on both nodes exchanged them); the replicas agree.
    srun (the default) starts the ranks itself (--mpi=pmi2), over MPICH's OFI netmod; mpiexec is the venv's
    Hydra inside the allocation (its proxies started with srun), over UCX."""
    cluster, slurm = slurm_nodes
    make_dataset(tmp_path / "data", n_train=2000, n_test=200, shards=2, num_classes=10, shape=(1, 8, 8))
    write_mlp_config(tmp_path / "tiny.yaml", "data", epochs=3)
    before = cluster.bytes_on_links()
    submitted = slurm.run("sbatch", "--parsable", "--nodes=2", f"{SLURM}/train.sbatch", "tiny.yaml", cwd=tmp_path,
                          env={"MPITRAIN_LAUNCHER": launcher, **NETWORK[launcher]})
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    assert slurm.wait(job, 120, tmp_path) == "COMPLETED", job_logs(tmp_path)
    after = cluster.bytes_on_links()

    nodes = f"{cluster.name}n[1-2]"
    log = (tmp_path / f"slurm-mpitrain-train-{job}.out").read_text()
    assert slurm.job_field(job, "NodeList") == nodes and f"[slurm] job {job} on {nodes}" in log, log
    assert ("[slurm] MPICH_CH4_NETMOD=ofi" in log) == (launcher == "srun"), log
    summary = json.loads((tmp_path / "runs" / "tiny" / "summary.json").read_text())
    assert summary["ranks"] == 4 and len(set(summary["replica_hashes"])) == 1, summary
    sent = summary["bytes_sent_per_step"] * summary["steps_per_epoch"] * summary["epochs"]  # the gradients' bytes
    assert sent > 500_000, summary  # well above what MPI's start-up and Slurm's messages move
    moved = {node: {way: after[node][way] - before[node][way] for way in ("rx", "tx")} for node in cluster.nodes}
    assert all(way >= sent for node in moved.values() for way in node.values()), (sent, moved)


def test_sbatch_etl_on_a_spark_standalone_cluster_of_two_nodes_writes_the_local_mode_dataset(slurm_nodes, tmp_path):
    """sbatch --nodes=2 slurm/etl.sbatch with MPITRAIN_SPARK=standalone: the master on the first node, a worker
    on each, an executor on each node runs tasks; the shards are those of Spark's local mode, byte for byte."""
    cluster, slurm = slurm_nodes
    # Tiny tasks end within Spark's locality wait (3 s), which would keep them on the executor holding the
    # previous stage's output: without it, both nodes' executors take tasks. No driver web UI.
    (tmp_path / "spark-conf").mkdir()
    (tmp_path / "spark-conf" / "spark-defaults.conf").write_text("spark.locality.wait 0\nspark.ui.enabled false\n")
    # Seven JVMs share the 2 cores (the local run's, the master, a worker and an executor per node, the driver):
    # all of them with the tests' JVM options, the daemons and executors too.
    env = {"SPARK_CONF_DIR": str(tmp_path / "spark-conf"), "JAVA_TOOL_OPTIONS": TEST_JVM_OPTIONS}
    etl = ["--source", "digits:", "--shards", 2, "--out"]
    submitted = slurm.run("sbatch", "--parsable", "--nodes=2", f"{SLURM}/etl.sbatch", *etl, "data/standalone",
                          cwd=tmp_path, env={"MPITRAIN_SPARK": "standalone", **env})
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    local = command(os.path.join(VENV_BIN, "spark-submit"), "--master", "local[2]",
                    os.path.join(REPO, "etl", "prepare.py"), *etl, tmp_path / "data" / "local", env=env,
                    timeout=180)
    assert local.returncode == 0, local.stderr[-3000:]
    assert slurm.wait(job, 180, tmp_path) == "COMPLETED", job_logs(tmp_path)

    log = (tmp_path / f"slurm-mpitrain-etl-{job}.out").read_text()
    assert f"[slurm] Spark master spark://{cluster.nodes[0]}:" in log and "2 worker(s) of 2 cores" in log, log
    spark = tmp_path / f"spark-{job}"
    for index, host in enumerate(cluster.hosts):
        worker = (spark / f"worker-{index}.log").read_text()
        assert f"Starting Spark worker {host}:" in worker and "Successfully registered with master" in worker
    assert _nodes_that_ran_spark_tasks(spark) == set(cluster.nodes)
    standalone = _shard_digests(tmp_path / "data" / "standalone")
    assert standalone == _shard_digests(tmp_path / "data" / "local") and len(standalone) == 4, standalone


def _nodes_that_ran_spark_tasks(spark_logs) -> set[str]:
    """The host names of the executors (spark-JOB/work/APP/EXECUTOR/stderr) that ran at least one task."""
    nodes = set()
    for path in glob.glob(f"{spark_logs}/work/*/*/stderr"):
        text = open(path).read()
        if "Running task" in text:
            nodes.add(re.search(r"Started daemon with process name: \d+@(\S+)", text).group(1))
    return nodes


def _shard_digests(dataset) -> dict[str, str]:
    """The sha256 of every shard file on disk, by path in the dataset, after checking them against the manifest."""
    manifest = read_manifest(str(dataset))
    listed = {shard.path: shard.sha256 for shards in manifest.splits.values() for shard in shards}
    on_disk = {os.path.relpath(path, dataset): sha256_file(path)
               for path in glob.glob(f"{dataset}/**/*.h5", recursive=True)}
    assert on_disk == listed, (on_disk, listed)
    return on_disk


def test_stopping_slurm_on_the_nodes_leaves_nothing_behind_also_after_an_exception(tmp_path):
    """An exception while a job's tasks run on both nodes: afterwards no daemon (munged, slurmctld, slurmd),
    slurmstepd or task runs, and no namespace, link, bridge or hosts file of the cluster is left."""
    require_cluster()
    with pytest.raises(RuntimeError, match="inside the block"):
        with SimulatedCluster(nodes=2) as cluster, start_slurm(cluster) as slurm:
            job = slurm.run("sbatch", "--parsable", "--nodes=2", "--output=/dev/null", "--wrap", "srun sleep 300",
                            cwd=tmp_path)
            assert job.returncode == 0, job.stderr
            _wait_for(lambda: all("sleep" in _commands(pids) for pids in cluster.pids().values()),
                      slurm.daemons[-1])
            assert all("slurmstepd" in _commands(pids) for pids in cluster.pids().values())
            pids = [pid for node in cluster.pids().values() for pid in node] + [d.pid for d in slurm.daemons]
            raise RuntimeError("an error inside the block")
    _assert_gone(cluster.name, pids)


def _commands(pids: list[int]) -> list[str]:
    """The command names of processes `pids` (those that still run)."""
    names = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:
            pass
    return names


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
    still = [pid for pid in pids if running(pid)]
    assert not still, f"processes of the nodes still run: {still}"


AUTO_MODEL = {"layers": [  # convolutions' compute dwarfs the Allreduce of 21k parameters at 10 Gb/s, not at 0.01
    {"type": "conv2d", "filters": 16, "kernel": 3, "padding": "same", "activation": "relu"},
    {"type": "conv2d", "filters": 16, "kernel": 3, "padding": "same", "activation": "relu"},
    {"type": "maxpool2d", "pool": 2}, {"type": "dense", "units": 32, "activation": "relu"}, {"type": "dense", "units": 3}]}


@pytest.mark.alone  # it chooses by the steps it times: the other layer's ranks beside it would slow them
def test_auto_keeps_dense_gradients_on_a_fast_link_and_compresses_on_a_slow_one(tmp_path):
    """`sync.mode: auto` on 2 nodes: at 10 Gb/s the Allreduce of a small conv net's gradients hides in its step (as
    measured in the first epoch, which runs dense: its time inside MPI a few percent of its step, where auto keeps
    dense below about 9%), so the second epoch runs dense too; at 0.01 Gb/s it cannot, and the second epoch runs a lossier candidate. summary.json records each epoch's choice with its prediction beside
    the measured communication."""
    require_cluster()
    make_dataset(tmp_path / "data", n_train=4096, shape=(1, 12, 12))  # 8 steps an epoch
    chosen, seen = {}, {}
    for gbps in (10.0, 0.01):
        config = write_config(tmp_path / f"{gbps}.yaml", tmp_path / "data", model=AUTO_MODEL, sync={"mode": "auto"},
                              run_dir=str(tmp_path / f"run-{gbps}"), train={"epochs": 2, "batch_size": 256})
        with SimulatedCluster(nodes=2, link_gbps=gbps) as cluster:
            result = cluster.mpiexec(2, MPITRAIN, "train", config, timeout=180)
        assert result.returncode == 0, result.stderr[-3000:]
        records = json.loads((tmp_path / f"run-{gbps}" / "summary.json").read_text())["sync_auto"]
        assert [r["ran"] for r in records][0] == "dense" and len(records) == 2, records
        assert all(r["comm_ms_measured"] > 0 and r["comm_ms_predicted"] >= 0 for r in records), records
        chosen[gbps], seen[gbps] = records[1]["ran"], records[0]
        assert "sync auto: dense ran this epoch" in result.stderr + result.stdout
    assert chosen[10.0] == "dense" and chosen[0.01] not in ("dense", "bf16"), (chosen, seen)
