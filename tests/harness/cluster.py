"""A simulated cluster on this machine: nodes as network namespaces, real MPI over TCP between them.

    with SimulatedCluster(nodes=2, link_gbps=1) as cluster:
        result = cluster.mpiexec(2, sys.executable, "script.py", ppn=1, timeout=60)
        cluster.bytes_on_links()            # {node: {"rx": ..., "tx": ...}}, counted by the node's link
        with cluster.link_samples() as links:     # the links' counters read every 10 ms while a job runs
            cluster.mpiexec(...)
        links.sent(t0, t1)                  # {node: bytes it sent between two time.time()s}
        links.per_training_step(windows)    # per step and node, between a run's first and last metrics window
        cluster.set_link(cluster.nodes[1], up=False)

Each node is a network namespace with a veth link into a bridge in the root namespace, an
address of a /24 of 10.231.0.0/16 that only this cluster uses (no default route, no NAT:
nothing leaves the machine), and that link shaped to `link_gbps` in each direction by a
token bucket (`tc ... tbf`). This kernel has no netem, so a link is slow but adds no delay.
MPICH's Hydra starts one proxy per node through `cluster-launcher.sh`, which enters the
node's namespace and a UTS namespace of its own (the node's host name), and the ranks talk
UCX over TCP through the links. Inside the nodes every node's name resolves to its address:
`ip netns exec` bind-mounts /etc/netns/NODE/hosts (the machine's /etc/hosts and the nodes)
over /etc/hosts, in a mount namespace of the process's own; the machine's file is untouched.
`node_command` runs any command in a node that way (tests/harness/slurm.py starts slurmd so).

Every name of a cluster starts with `mtc<N>` (N is also its subnet's third number), which
the bridge claims when it is created, so clusters side by side never collide. The bridge
records its owner process; a cluster whose owner is gone is removed when the next one
starts. Closing kills every process in the nodes and removes links, namespaces, hosts files
and bridge, also when the block raised or an MPI job timed out. Needs root, `ip`, `tc` and
`unshare`.
"""
from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from contextlib import contextmanager

import numpy as np

from mpitrain.testing.launch import MPIEXEC  # the venv's MPICH (Hydra)

PREFIX = "mtc"
SUBNET = "10.231"  # 10.231.N.0/24 for cluster mtcN; .254 is the bridge, .1 to .K the nodes
LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster-launcher.sh")
NODE_IF = "eth0"  # the link's name inside every node
NETNS_ETC = "/etc/netns"  # `ip netns exec NODE` bind-mounts NETNS_ETC/NODE/hosts over /etc/hosts
TOOLS = ("ip", "tc", "unshare", "taskset")
LOCK = "/tmp/mpitrain-simulated-clusters.lock"
log = logging.getLogger(__name__)


def missing_capability() -> str | None:
    """Why no cluster can be built here (not root, a missing tool), or None."""
    if os.geteuid() != 0:
        return "a simulated cluster needs root (network namespaces, links, qdiscs)"
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    return f"a simulated cluster needs {', '.join(absent)} (iproute2, util-linux)" if absent else None


class SimulatedCluster:
    """K nodes on one machine, linked through a bridge at `link_gbps` each way, with MPI launched across them."""

    def __init__(self, nodes: int = 2, link_gbps: float = 1.0):
        self.size, self.link_gbps = nodes, link_gbps
        self.name = None
        self.processes: list[subprocess.Popen] = []

    def __enter__(self) -> SimulatedCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the parts' names, all derived from the cluster's name --

    @property
    def bridge(self) -> str:
        return f"{self.name}b"

    @property
    def nodes(self) -> list[str]:
        """The nodes' names: their network namespaces and host names; rank r runs on nodes[r // ppn]."""
        return [f"{self.name}n{i}" for i in range(1, self.size + 1)]

    @property
    def hosts(self) -> list[str]:
        """The nodes' addresses, in the order of `nodes`."""
        return [f"{self.subnet}.{i}" for i in range(1, self.size + 1)]

    @property
    def subnet(self) -> str:
        return f"{SUBNET}.{self.name[len(PREFIX):]}"

    @property
    def description(self) -> str:
        return (f"simulated cluster {self.name}: {self.size} nodes ({', '.join(self.nodes)}) at {self.subnet}.1-"
                f"{self.size} on bridge {self.bridge}, each link {self.link_gbps:g} Gb/s each way (tbf); "
                "no added latency (this kernel has no netem)")

    # -- set-up and tear-down --

    def start(self) -> SimulatedCluster:
        """Remove stale clusters, claim a name, write the nodes' hosts files, build bridge and nodes; on any failure
        remove what was built."""
        reason = missing_capability()
        if reason:
            raise RuntimeError(reason)
        try:
            with _exclusive():  # no other cluster takes the stale ones for its own, or this one for stale
                remove_stale_clusters()
                self.name = claim_bridge()
                _ip("link", "set", self.bridge, "alias", owner_tag(os.getpid()))
                self._write_hosts()
            self._configure_bridge()
            for node, host in zip(self.nodes, self.hosts):
                self._add_node(node, host)
        except BaseException:
            self.close()
            raise
        log.info("%s", self.description)
        return self

    def close(self) -> None:
        """Kill the jobs this cluster launched and every process in its nodes; remove links, namespaces, bridge."""
        for process in self.processes:
            _kill_group(process)
        if self.name:
            remove_cluster(self.name)
            with _exclusive():
                _remove_empty_netns_etc()
        for process in self.processes:
            process.wait()
            for stream in (process.stdout, process.stderr):
                stream.close()
        self.processes.clear()

    def _configure_bridge(self) -> None:
        """The bridge's address, up; IPv6 off: only the subnet's IPv4 crosses the links."""
        bridge = self.bridge
        _disable_ipv6(bridge)
        _ip("addr", "add", f"{self.subnet}.254/24", "dev", bridge)
        _ip("link", "set", bridge, "up")

    def _write_hosts(self) -> None:
        """Each node's /etc/hosts: the machine's, and every node's name at its address (as a cluster's DNS would)."""
        with open("/etc/hosts") as f:
            machine = f.read()
        names = "".join(f"{host} {node}\n" for host, node in zip(self.hosts, self.nodes))
        for node in self.nodes:
            os.makedirs(os.path.join(NETNS_ETC, node))
            with open(os.path.join(NETNS_ETC, node, "hosts"), "w") as f:
                f.write(f"{machine.rstrip()}\n# {self.name}, a simulated cluster (tests/harness/cluster.py)\n{names}")

    def _add_node(self, node: str, host: str) -> None:
        """A namespace with loopback and one shaped link into the bridge, addressed `host`/24, no default route."""
        link = link_of(node)
        _ip("netns", "add", node)
        _run("ip", "netns", "exec", node, "sysctl", "-qew", "net.ipv6.conf.all.disable_ipv6=1",
             "net.ipv6.conf.default.disable_ipv6=1")
        _ip("link", "add", link, "type", "veth", "peer", "name", NODE_IF, "netns", node)
        _disable_ipv6(link)
        _ip("link", "set", link, "master", self.bridge, "up")
        _ip("-n", node, "addr", "add", f"{host}/24", "dev", NODE_IF)
        _ip("-n", node, "link", "set", "lo", "up")
        _ip("-n", node, "link", "set", NODE_IF, "up")
        self._shape(["-n", node], NODE_IF)  # what the node sends
        self._shape([], link)  # what it receives

    def _shape(self, where: list[str], device: str) -> None:
        """A token bucket at the link's rate on `device`'s egress (a 256 KB burst; 50 ms of queue)."""
        _run("tc", *where, "qdisc", "add", "dev", device, "root", "tbf", "rate", f"{round(self.link_gbps * 1000)}mbit",
             "burst", "256kb", "latency", "50ms")

    # -- running jobs on the nodes --

    @property
    def env(self) -> dict:
        """mpiexec's environment: UCX over the nodes' links only; no thread variables (each node has its cores)."""
        return self.environment(pinned=True)

    def environment(self, pinned: bool) -> dict:
        """mpiexec's environment, its nodes on a core each (`pinned`), or on all of the machine's."""
        every = ",".join(map(str, sorted(os.sched_getaffinity(0))))
        nodes = " ".join(f"{host}={node}@{self.cores(node) if pinned else every}"
                         for host, node in zip(self.hosts, self.nodes))
        return {**os.environ, "PYTHONUNBUFFERED": "1", "UCX_TLS": "tcp", "UCX_NET_DEVICES": NODE_IF,
                "SIMULATED_NODES": nodes}

    def cores(self, node: str) -> int:
        """The one core of this machine that `node` runs on (nodes take the cores in turn), as a node of a real
        cluster has cores of its own: its ranks size their thread pools for it, as they would there."""
        return sorted(os.sched_getaffinity(0))[self.nodes.index(node) % len(os.sched_getaffinity(0))]

    def mpiexec_command(self, n: int, *args, ppn: int = 1) -> list[str]:
        """`mpiexec` placing `n` ranks, `ppn` per node in the order of `nodes`, running ARGS."""
        return [MPIEXEC, "-launcher", "ssh", "-launcher-exec", LAUNCHER, "-iface", self.bridge,
                "-hosts", ",".join(self.hosts), "-n", str(n), "-ppn", str(ppn), *map(str, args)]

    def popen(self, n: int, *args, ppn: int = 1, env: dict | None = None, **kwargs) -> subprocess.Popen:
        """Start an MPI job in the background (text pipes); `close` kills it if it still runs."""
        process = subprocess.Popen(self.mpiexec_command(n, *args, ppn=ppn), env={**self.env, **(env or {})},
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True, **kwargs)
        self.processes.append(process)
        return process

    def mpiexec(self, n: int, *args, ppn: int = 1, timeout: float = 120, env: dict | None = None,
                **kwargs) -> subprocess.CompletedProcess:
        """Run an MPI job to its end. After `timeout` seconds it is killed, on every node, and TimeoutExpired raised."""
        process = self.popen(n, *args, ppn=ppn, env=env, **kwargs)
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop(process)
            out, err = process.communicate()
            raise subprocess.TimeoutExpired(process.args, timeout, out, err) from None
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def stop(self, process: subprocess.Popen) -> None:
        """Kill a job: mpiexec with its launchers, and every process in the nodes (the ranks and proxies)."""
        _kill_group(process)
        for node in self.nodes:
            kill_namespace_processes(node)

    def node_command(self, node: str, *args) -> list[str]:
        """ARGS as a command that runs inside `node`: its network namespace and hosts file, its host name (a UTS
        namespace of its own) and on its core, as cluster-launcher.sh runs Hydra's proxies; the command replaces
        the shell."""
        return ["ip", "netns", "exec", node, "unshare", "--uts", "taskset", "-c", str(self.cores(node)), "sh", "-c",
                'hostname "$0" && exec "$@"', node, *map(str, args)]

    def pids(self) -> dict[str, list[int]]:
        """The processes running in each node."""
        return {node: namespace_pids(node) for node in self.nodes}

    # -- the links --

    def bytes_on_links(self) -> dict[str, dict[str, int]]:
        """Bytes each node received ("rx") and sent ("tx") over its link so far (counters of its veth)."""
        def counter(node: str, name: str) -> int:
            with open(f"/sys/class/net/{link_of(node)}/statistics/{name}_bytes") as f:
                return int(f.read())
        # the root end's tx is what reached the node, its rx what the node sent
        return {node: {"rx": counter(node, "tx"), "tx": counter(node, "rx")} for node in self.nodes}

    @contextmanager
    def link_samples(self, every_s: float = 0.01):
        """`LinkSamples` of the nodes' link counters, read every `every_s` seconds by a thread while the block
        runs (once more when it ends)."""
        samples = LinkSamples(self.nodes)
        done = threading.Event()

        def read() -> None:
            while True:
                samples.add(time.time(), self.bytes_on_links())
                if done.wait(every_s):
                    samples.add(time.time(), self.bytes_on_links())
                    return

        reader = threading.Thread(target=read, name="link samples", daemon=True)
        reader.start()
        try:
            yield samples
        finally:
            done.set()
            reader.join()

    def set_link(self, node: str, up: bool) -> None:
        """Cut `node`'s link (its cable at the switch) or repair it; a repair also forgets failed address lookups."""
        _ip("link", "set", link_of(node), "up" if up else "down")
        if up:
            _ip("neigh", "flush", "dev", self.bridge)
            for each in self.nodes:
                _ip("-n", each, "neigh", "flush", "dev", NODE_IF)


class LinkSamples:
    """The bytes each node sent over its link, read at times (time.time()): what a job's phases sent, apart from
    one another (benchmarks/cluster.py: the training steps apart from start-up, epoch ends and evaluation)."""

    def __init__(self, nodes: list[str]):
        self.nodes, self.times, self.tx = nodes, [], {node: [] for node in nodes}

    def add(self, at: float, counters: dict) -> None:
        self.times.append(at)
        for node in self.nodes:
            self.tx[node].append(counters[node]["tx"])

    def sent(self, start: float, end: float) -> dict[str, float]:
        """Bytes each node sent between `start` and `end`, read off the samples around them (linear between two)."""
        if not self.times or not self.times[0] <= start <= end <= self.times[-1]:
            raise ValueError(f"{start:.3f} to {end:.3f} is not inside the samples' span"
                             + (f" ({self.times[0]:.3f} to {self.times[-1]:.3f})" if self.times else " (none)"))
        return {node: float(np.interp(end, self.times, counts) - np.interp(start, self.times, counts))
                for node, counts in self.tx.items()}

    def per_training_step(self, windows: list[dict]) -> float:
        """Bytes per training step and node sent between the first and the last of a run's metrics `windows` (its
        window records, in order): the steps after the first window, with their windows' gathers, and nothing of
        start-up, epoch ends, evaluation or the summary, when the windows are one epoch's. A window's `time` is
        when rank 0 wrote it, after every rank had finished its steps."""
        first, last = windows[0], windows[-1]
        steps = last["global_step"] - first["global_step"]
        if steps <= 0:
            raise ValueError(f"windows from step {first['global_step']} to {last['global_step']}: no training steps "
                             "between them to count; log windows more often (train.log_every)")
        return sum(self.sent(first["time"], last["time"]).values()) / len(self.nodes) / steps


# -- clusters by name: what exists in the root namespace, whose it is, removing it --

def link_of(node: str) -> str:
    """The root namespace's end of `node`'s link: mtcNvI for node mtcNnI (its other end is NODE_IF in the node)."""
    return re.sub(r"n(\d+)$", r"v\1", node)


def claim_bridge() -> str:
    """Create the bridge of the first free name (mtcN with 10.231.N.0/24 unrouted here) and return the name.

    Creating a link that exists fails, so of two processes only one gets a name. The bridge's
    address is fixed: by default a bridge takes its ports' lowest, which changes as links go down.
    """
    for number in range(1, 254):
        name = f"{PREFIX}{number}"
        if _routed(f"{SUBNET}.{number}.0/24"):
            continue
        created = subprocess.run(["ip", "link", "add", f"{name}b", "address", f"02:31:00:00:{number:02x}:fe",
                                  "type", "bridge"], capture_output=True, text=True)
        if created.returncode == 0:
            return name
        if "exists" not in created.stderr:
            raise RuntimeError(f"ip link add {name}b: {created.stderr.strip()}")
    raise RuntimeError(f"no free simulated cluster name: {PREFIX}1 to {PREFIX}253 are all taken")


def _routed(prefix: str) -> bool:
    """Whether the root namespace routes any address of `prefix` (inside it or around it, the default route aside)."""
    routes = [_run("ip", "-4", "route", "show", "table", "all", where, prefix).stdout for where in ("root", "match")]
    return any(line and not line.startswith("default") for text in routes for line in text.splitlines())


def owner_tag(pid: int) -> str:
    """What identifies a live process: its pid and start time (a pid is reused, the pair is not)."""
    with open(f"/proc/{pid}/stat") as f:
        start = f.read().rsplit(")", 1)[1].split()[19]
    return f"mpitrain simulated cluster, owner pid {pid} started {start}"


def owner_alive(name: str) -> bool:
    """Whether the process that built cluster `name` still runs (no bridge or no owner recorded: it does not)."""
    try:
        with open(f"/sys/class/net/{name}b/ifalias") as f:
            tag = f.read().strip()
        pid = int(re.search(r"owner pid (\d+)", tag).group(1))
        return owner_tag(pid) == tag
    except (OSError, AttributeError):
        return False


def cluster_names() -> set[str]:
    """The clusters that have a bridge, a link, a namespace or a hosts file in the root namespace."""
    names = os.listdir("/sys/class/net") + _run("ip", "netns", "list").stdout.split() + netns_etc_entries()
    return {match.group(1) for name in names if (match := re.fullmatch(rf"({PREFIX}\d+)(?:b|[nv]\d+)", name))}


def remove_stale_clusters() -> None:
    """Remove what clusters whose owner is gone left behind (a run killed before its tear-down)."""
    for name in sorted(cluster_names()):
        if not owner_alive(name):
            log.warning("removing stale simulated cluster %s", name)
            remove_cluster(name)


def remove_cluster(name: str) -> None:
    """Kill every process in the cluster's nodes, then delete its links, namespaces and hosts files, last its bridge."""
    nodes = [ns for ns in _run("ip", "netns", "list").stdout.split() if re.fullmatch(rf"{name}n\d+", ns)]
    for node in nodes:
        kill_namespace_processes(node)
    links = [link for link in os.listdir("/sys/class/net") if re.fullmatch(rf"{name}v\d+", link)]
    for link in links:  # deleting one end of a veth deletes both, at once (a namespace's go with it later)
        _ip("link", "del", link)
    for node in nodes:
        _ip("netns", "del", node)
    for node in netns_etc_entries():
        if re.fullmatch(rf"{name}n\d+", node):
            shutil.rmtree(os.path.join(NETNS_ETC, node))
    if os.path.exists(f"/sys/class/net/{name}b"):
        _ip("link", "del", f"{name}b")


def netns_etc_entries() -> list[str]:
    """The namespaces that have files in NETNS_ETC (none when it does not exist)."""
    return os.listdir(NETNS_ETC) if os.path.isdir(NETNS_ETC) else []


def _remove_empty_netns_etc() -> None:
    """Remove NETNS_ETC when no cluster (and nothing else) has files there: it leaves the machine as it was."""
    try:
        os.rmdir(NETNS_ETC)
    except OSError:  # not there, or not empty
        pass


def namespace_pids(node: str) -> list[int]:
    """The processes in network namespace `node` (none when it does not exist)."""
    return [int(pid) for pid in subprocess.run(["ip", "netns", "pids", node], capture_output=True,
                                               text=True).stdout.split()]


def kill_namespace_processes(node: str, timeout: float = 10) -> None:
    """SIGKILL every process in `node` until none is left (a proxy may start a rank meanwhile)."""
    deadline = time.monotonic() + timeout
    while pids := namespace_pids(node):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} in {node} survive SIGKILL")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL mpiexec and its launchers (its session), if it still runs."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@contextmanager
def _exclusive():
    """Hold a lock file, machine-wide, while clusters are looked at and claimed."""
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def _disable_ipv6(device: str) -> None:
    """No IPv6 on `device` (no router solicitations or the like on the links); a kernel without IPv6 has none."""
    path = f"/proc/sys/net/ipv6/conf/{device}/disable_ipv6"
    if os.path.exists(path):
        with open(path, "w") as f:
            f.write("1")


def _ip(*args) -> None:
    _run("ip", *args)


def _run(*args) -> subprocess.CompletedProcess:
    """Run a set-up command; a failure raises with its message."""
    result = subprocess.run(list(args), capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {result.stderr.strip() or f'exit status {result.returncode}'}")
    return result
