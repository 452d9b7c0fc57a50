"""Emulated hosts for tests: network namespaces joined by a bridge, one torchrun agent per host.

    def test_x(netns_hosts):
        hosts = netns_hosts(2)                       # two hosts, 10.213.77.1 and .2
        job = hosts.torchrun("examples/topology.py", nproc=2)
        job.wait(timeout=120)                        # raises with every agent's output on failure

Layout (every name lives only inside namespaces created here, so concurrent
runs and the machine's own network never see each other):

    host namespace <tag>-h<i>:  lo, eth0 = 10.213.77.<i+1>/24
    hub namespace  <tag>-hub:   bridge br0 with the peers h0, h1, ... of the hosts' eth0

Traffic between hosts is real TCP over veth and a bridge; inside a host the
ranks use shared memory (/dev/shm is not namespaced). Each host gets
HVDTORCH_HOSTNAME=host<i> (the namespaces share the UTS name) and
GLOO_SOCKET_IFNAME=eth0 (Gloo would otherwise bind to the address the machine's
host name resolves to, which does not exist inside the namespace).

Faults: `link_down(i)` cuts host i's cable (the hub side of its veth);
`impair(i, delay_ms, loss)` adds delay and loss on both directions of host
i's cable with `tc netem`. Kernels without netem (sch_netem) get the same
through tests/net_relay.py, a user-space hub between TAP devices, when the
hosts are made with impairable=True.

Bandwidth: `shape(rate)` limits every host's cable to a rate in both
directions with a token bucket (`tc tbf`, which every kernel here has), for
benchmarks/cluster.py. `Hosts(n, ..., own_hostname=True)` makes the machine's
host name resolve to each host's own address inside it (for peers that bind
to that address, as Horovod's Gloo does).

Cleanup, also when a test fails or times out: every process inside the
namespaces is SIGKILLed (torchrun starts its workers in sessions of their own,
so a process-group kill of the agent would miss them: `ip netns pids` finds
them all), then the namespaces are deleted, which deletes the bridge and the
veth pairs with them, and so are their /etc/netns files. Namespaces left by a
run that was itself SIGKILLed are swept at the next start (their names carry
the creating pid).
"""

import functools
import itertools
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUBNET = "10.213.77"
NETNS_ETC = "/etc/netns"  # per-namespace files `ip netns exec` mounts over /etc
PREFIX = "hvdt-"
_seq = itertools.count()
_probe: Optional[str] = None


def _ip(*args: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=timeout)


def unavailable_reason() -> Optional[str]:
    """Why namespaced hosts cannot run here, or None when they can (checked once)."""
    global _probe
    if _probe is None:
        _probe = ""
        if os.geteuid() != 0:
            _probe = f"network namespaces need root (tests run as uid {os.geteuid()})"
        elif shutil.which("ip") is None:
            _probe = "the `ip` tool (iproute2) is not installed"
        else:
            name = f"{PREFIX}{os.getpid()}-probe"
            r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
            if r.returncode != 0:
                _probe = f"`ip netns add` does not work here: {r.stderr.strip()}"
            else:
                _ip("netns", "del", name, check=False)
    return _probe or None


def netem_unavailable_reason() -> Optional[str]:
    """None when `tc netem` works inside a namespace, else why not."""
    if shutil.which("tc") is None:
        return "the `tc` tool (iproute2) is not installed"
    name = f"{PREFIX}{os.getpid()}-tcprobe"
    try:
        _ip("netns", "add", name)
        _ip("-n", name, "link", "add", "p0", "type", "veth", "peer", "name", "p1")
        r = subprocess.run(
            ["tc", "-n", name, "qdisc", "add", "dev", "p0", "root", "netem", "delay", "1ms"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if r.returncode != 0:
            return f"this kernel has no netem qdisc (sch_netem): `tc qdisc add ... netem` says {r.stderr.strip()!r}"
        return None
    finally:
        _ip("netns", "del", name, check=False)


def _pids_in(ns: str) -> List[int]:
    r = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in r.stdout.split()] if r.returncode == 0 else []


def _kill_all_in(ns: str, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        pids = _pids_in(ns)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    raise RuntimeError(f"processes {_pids_in(ns)} in namespace {ns} survived SIGKILL for {within} s")


def _delete(ns: str) -> None:
    _kill_all_in(ns)
    _ip("netns", "del", ns, check=False)
    shutil.rmtree(os.path.join(NETNS_ETC, ns), ignore_errors=True)  # Hosts(own_hostname=True)'s /etc/hosts


def sweep_stale() -> None:
    """Deletes namespaces (and their /etc/netns files) left by earlier runs whose creating process is gone."""
    r = _ip("netns", "list", check=False)
    names = [line.split()[0] for line in r.stdout.splitlines() if line.split()]
    names += os.listdir(NETNS_ETC) if os.path.isdir(NETNS_ETC) else []
    for ns in dict.fromkeys(names):
        if not ns.startswith(PREFIX):
            continue
        try:
            owner = int(ns[len(PREFIX) :].split("-")[0])
        except ValueError:
            continue
        if owner != os.getpid() and not os.path.exists(f"/proc/{owner}"):
            _delete(ns)


class Job:
    """Agents started by Hosts.torchrun (one per host), output in files."""

    def __init__(self, procs: List[subprocess.Popen], logs: List[str]):
        self.procs = procs
        self.logs = logs

    def outputs(self) -> List[str]:
        out = []
        for path in self.logs:
            with open(path, errors="replace") as f:
                out.append(f.read())
        return out

    def output(self) -> str:
        return "\n".join(
            f"--- agent on host{i} (exit {p.returncode}) ---\n{o[-6000:]}"
            for i, (p, o) in enumerate(zip(self.procs, self.outputs()))
        )

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def wait_for(self, text: str, timeout: float, count: int = 1) -> None:
        """Waits until `text` occurs `count` times in the agents' output (fails on deadline or exit)."""
        deadline = time.monotonic() + timeout
        while sum(o.count(text) for o in self.outputs()) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} did not appear {count}x within {timeout} s\n{self.output()}")
            if not self.running():
                raise AssertionError(f"agents exited before {text!r} appeared\n{self.output()}")
            time.sleep(0.05)

    def wait(self, timeout: float, expect_success: bool = True) -> List[str]:
        """Waits for every agent; on the deadline kills them and fails with their output."""
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"agents did not finish within {timeout} s (killed)\n{self.output()}") from None
        if expect_success and any(p.returncode != 0 for p in self.procs):
            raise AssertionError(f"agents failed\n{self.output()}")
        return self.outputs()

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


class Hosts:
    """`n` namespaced hosts on one bridge. Use as a context manager (or the netns_hosts fixture)."""

    def __init__(self, n: int, logdir: str, link: str = "veth", own_hostname: bool = False):
        """link: "veth" (a bridge; netem impairs it where the kernel has netem) or
        "relay" (TAP devices joined by tests/net_relay.py, which impairs in user space).
        own_hostname: inside each host the machine's host name resolves to
        that host's address, as on a real host (an /etc/hosts of its own,
        /etc/netns/<ns>/hosts, which `ip netns exec` mounts over /etc/hosts);
        else it resolves as on the machine (to loopback here)."""
        if not 1 <= n <= 8:
            raise ValueError(f"Hosts: 1 to 8 hosts, not {n}")
        if link not in ("veth", "relay"):
            raise ValueError(f"Hosts: link must be 'veth' or 'relay', not {link!r}")
        self.n = n
        self.link = link
        self.own_hostname = own_hostname
        self.relay: Optional[subprocess.Popen] = None
        self.logdir = logdir
        tag = f"{PREFIX}{os.getpid()}-{next(_seq)}"
        self.hub = f"{tag}-hub"
        self.names = [f"{tag}-h{i}" for i in range(n)]
        self.jobs: List[Job] = []
        self._created: List[str] = []

    def addr(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def __enter__(self) -> "Hosts":
        sweep_stale()
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _create(self) -> None:
        for ns in [self.hub, *self.names]:
            _ip("netns", "add", ns)
            self._created.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        if self.own_hostname:
            for i, ns in enumerate(self.names):
                os.makedirs(os.path.join(NETNS_ETC, ns), exist_ok=True)
                with open(os.path.join(NETNS_ETC, ns, "hosts"), "w") as f:
                    f.write(f"127.0.0.1 localhost\n{self.addr(i)} {socket.gethostname()}\n")
        if self.link == "relay":
            self._start_relay()
            for i, ns in enumerate(self.names):
                _ip("-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
            return
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        for i, ns in enumerate(self.names):
            _ip("-n", self.hub, "link", "add", f"h{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", self.hub, "link", "set", f"h{i}", "master", "br0")
            _ip("-n", self.hub, "link", "set", f"h{i}", "up")
            _ip("-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

    def _start_relay(self) -> None:
        self.relay = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "tests", "net_relay.py"), *self.names],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        ready, _, _ = select.select([self.relay.stdout], [], [], 30)
        line = self.relay.stdout.readline() if ready else ""
        if line.strip() != "READY":
            raise RuntimeError(f"net_relay did not start (said {line!r})")

    def close(self) -> None:
        for job in self.jobs:
            job.kill()
        if self.relay is not None:
            try:
                os.killpg(self.relay.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.relay.wait(timeout=10)
            self.relay = None
        errors = []
        for ns in reversed(self._created):
            try:
                _delete(ns)
            except Exception as e:  # keep deleting the others
                errors.append(str(e))
        self._created = []
        if errors:
            raise RuntimeError("; ".join(errors))

    def exec(self, i: int, cmd: Sequence[str], timeout: float = 30) -> subprocess.CompletedProcess:
        """Runs `cmd` inside host i and waits (bounded)."""
        return subprocess.run(
            ["ip", "netns", "exec", self.names[i], *cmd], capture_output=True, text=True, timeout=timeout
        )

    def link_down(self, i: int) -> None:
        _ip(
            "-n",
            self.hub if self.link == "veth" else self.names[i],
            "link",
            "set",
            f"h{i}" if self.link == "veth" else "eth0",
            "down",
        )

    def impair(self, i: int, delay_ms: float, loss_percent: float) -> None:
        """Delay and loss on both directions of host i's cable (netem on each end, or the relay)."""
        if self.link == "relay":
            self.relay.stdin.write(f"impair {i} {delay_ms} {loss_percent}\n")
            self.relay.stdin.flush()
            ready, _, _ = select.select([self.relay.stdout], [], [], 10)
            line = self.relay.stdout.readline() if ready else ""
            if line.strip() != f"IMPAIRED {i}":
                raise RuntimeError(f"net_relay did not confirm the impairment (said {line!r})")
            return
        spec = ["netem", "delay", f"{delay_ms}ms", "loss", f"{loss_percent}%", "limit", "100000"]
        subprocess.run(
            ["tc", "-n", self.hub, "qdisc", "add", "dev", f"h{i}", "root", *spec],
            check=True,
            capture_output=True,
            timeout=20,
        )
        subprocess.run(
            ["tc", "-n", self.names[i], "qdisc", "add", "dev", "eth0", "root", *spec],
            check=True,
            capture_output=True,
            timeout=20,
        )

    def shape(self, rate: Optional[str], latency: str = "50ms") -> None:
        """Limits every host's cable to `rate` (tc's spelling: "100mbit",
        "1gbit", "10gbit") in both directions with a token bucket (tbf): on
        the host's eth0 (what it sends) and on the hub's h<i> (what it
        receives). A packet between two hosts passes two buckets of the same
        rate, so the path runs at `rate`. `latency` bounds the queue each
        bucket holds (tbf drops beyond it). Replaces an earlier shaping;
        rate None removes it. The burst is 4 ms at the rate (at least 64 KiB):
        tbf needs one at least rate / HZ to reach its rate."""
        if self.link != "veth":
            raise RuntimeError("Hosts.shape: only the veth link can be shaped")
        for i, ns in enumerate(self.names):
            for where, dev in ((ns, "eth0"), (self.hub, f"h{i}")):
                if rate is None:
                    subprocess.run(["tc", "-n", where, "qdisc", "del", "dev", dev, "root"], capture_output=True)
                    continue
                burst = max(64 << 10, int(rate_bits(rate) / 8 * 0.004))
                spec = ["tbf", "rate", rate, "burst", str(burst), "latency", latency]
                subprocess.run(
                    ["tc", "-n", where, "qdisc", "replace", "dev", dev, "root", *spec],
                    check=True,
                    capture_output=True,
                    timeout=20,
                )

    def torchrun(
        self,
        script: str,
        *args: str,
        nproc: int = 2,
        env: Optional[Dict[str, str]] = None,
        torchrun_args: Sequence[str] = (),
        port: int = 29400,
        elastic: Optional[str] = None,
        rdzv_conf: str = "",
        python: Optional[str] = None,
        cpus: Optional[Sequence[Sequence[int]]] = None,
    ) -> Job:
        """Starts one torchrun agent per host: --nnodes=n with the static
        rendezvous at host 0, or with elastic="MIN:MAX" --nnodes=MIN:MAX and
        the c10d rendezvous (endpoint on host 0, `rdzv_conf` its --rdzv-conf).
        Host 0's agent is told to host the rendezvous store (is_host): torchrun
        recognises its own address by the machine's host name, which resolves
        to no address inside a namespace. `python`: the interpreter whose
        torchrun runs the agents and ranks (default: this one). `cpus[i]`:
        the CPUs host i's agent, and so its ranks, may run on (default: any)."""
        torchrun = os.path.join(os.path.dirname(python or sys.executable), "torchrun")
        procs, logs = [], []
        for i, ns in enumerate(self.names):
            e = clean_env()
            e.update(
                {
                    "HVDTORCH_HOSTNAME": f"host{i}",
                    "GLOO_SOCKET_IFNAME": "eth0",
                    "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                }
            )
            if env:
                e.update({k: str(v) for k, v in env.items()})
            log = os.path.join(self.logdir, f"agent{i}-{len(self.jobs)}.log")
            logs.append(log)
            if elastic:
                rdzv = [
                    f"--nnodes={elastic}",
                    "--rdzv-backend=c10d",
                    f"--rdzv-endpoint={self.addr(0)}:{port}",
                    "--rdzv-id=hvdtorch-test",
                    f"--local-addr={self.addr(i)}",
                    f"--rdzv-conf={rdzv_conf + ',' if rdzv_conf else ''}is_host={int(i == 0)}",
                ]
            else:
                rdzv = [
                    f"--nnodes={self.n}",
                    f"--node_rank={i}",
                    f"--master_addr={self.addr(0)}",
                    f"--master_port={port}",
                ]
            cmd = [
                "ip",
                "netns",
                "exec",
                ns,
                torchrun,
                *rdzv,
                f"--nproc_per_node={nproc}",
                *torchrun_args,
                script,
                *args,
            ]
            with open(log, "w") as out:
                place = None if cpus is None else functools.partial(os.sched_setaffinity, 0, set(cpus[i]))
                procs.append(
                    subprocess.Popen(
                        cmd,
                        cwd=ROOT,
                        env=e,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        preexec_fn=place,
                    )
                )
        job = Job(procs, logs)
        self.jobs.append(job)
        return job

    def processes(self, host: Optional[int] = None) -> List[int]:
        """Every process inside the host namespaces (or host `host`'s): agents and workers."""
        names = self.names if host is None else [self.names[host]]
        return [p for ns in names for p in _pids_in(ns)]

    def kill_host(self, i: int) -> None:
        """The host leaves: every process on it is SIGKILLed at once."""
        _kill_all_in(self.names[i])


def rate_bits(rate: str) -> float:
    """Bits per second of a tc rate ("100mbit", "1gbit", "10gbit", "500kbit")."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}
    for unit, scale in units.items():
        if rate.lower().endswith(unit):
            return float(rate[: -len(unit)]) * scale
    raise ValueError(f"rate {rate!r}: expected a number and kbit, mbit or gbit (tc's units)")


def clean_env() -> Dict[str, str]:
    """This process's environment without another launcher's variables."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            (
                "OMPI_",
                "PMI",
                "SLURM_",
                "MASTER_",
                "RANK",
                "WORLD_SIZE",
                "LOCAL_",
                "GROUP_",
                "TORCHELASTIC_",
                "HVDTORCH_",
                "GLOO_",
            )
        )
    }
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "HVDTORCH_TIMEOUT": "30"})
    return env


@pytest.fixture
def netns_hosts(tmp_path):
    """Factory: netns_hosts(n) -> Hosts (started); all of them are torn down after the test."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"namespaced hosts unavailable: {reason}")
    made: List[Hosts] = []

    def make(n: int, impairable: bool = False) -> Hosts:
        """impairable: hosts whose cables impair() can slow down: netem on the
        veth pairs where the kernel has it, else the user-space relay."""
        link = "relay" if impairable and netem_unavailable_reason() else "veth"
        h = Hosts(n, str(tmp_path), link).__enter__()
        made.append(h)
        return h

    try:
        yield make
    finally:
        for h in made:
            h.close()
