"""Hosts simulated on one machine, for gosym's multi-host tests and benchmarks.

Each host is a network namespace (its own loopback and one end of a veth pair, address
10.231.0.<h+1>) entered with ``unshare --uts --mount``: its own hostname, bound into a
private /etc/hosts that names every host. The veth pairs' other ends are the ports of one
bridge in a namespace of its own (the switch), so any number of hosts (up to MAX_HOSTS) reach
each other as hosts on one switch do. gosym's links (abstract Unix sockets) do not cross
network namespaces, so a group over them is a real multi-host group to gosym; Gloo and NCCL
talk over the veths (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME). Needs root (ip netns,
unshare); ``unavailable()`` says why not where it cannot be made.

As a script it runs a command on every rank, or once per host (torchrun); where namespaces
cannot be made, on IdHosts (below):

    python tests/jobs/hier/simhosts.py --hosts 2,2 -- python -m gosym.bench --ops all_reduce
    python tests/jobs/hier/simhosts.py --hosts 2,2 --per-host -- python -m torch.distributed.run \\
        --nnodes 2 --nproc-per-node 2 --node-rank {host} --rdzv-backend c10d \\
        --rdzv-endpoint {master}:29400 script.py

Per rank it sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR
and MASTER_PORT (rank 0's host hosts the store); {host}, {master} and {nhosts} in the
command are replaced by the host index, the first host's address and the host count.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

SUBNET = "10.231.0"
PORT = 29500
# Runs in the namespace: set the hostname, bind the hosts file, exec the command.
_ENTER = 'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"'


def _ip(*args, ns=None):
    cmd = ["ip", *(("netns", "exec", ns, "ip") if ns else ()), *args]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30)


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if os.geteuid() != 0:
        return "simulated hosts need root (ip netns, unshare --mount)"
    try:
        with SimHosts([1, 1]) as h:
            subprocess.run(h.wrap(0, ["true"]), check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        err = getattr(e, "stderr", "") or ""
        return f"cannot make network namespaces: {e} {err}".strip()
    return None


class SimHosts:
    """len(counts) hosts (2 to MAX_HOSTS) with counts[h] ranks each (host-major rank order)."""

    MAX_HOSTS = 8

    def __init__(self, counts, gpus=False, link_mbit=0):
        if not 2 <= len(counts) <= self.MAX_HOSTS or min(counts) < 1:
            raise ValueError(f"{type(self).__name__}: 2 to {self.MAX_HOSTS} hosts with at least "
                             f"one rank each, got {counts}")
        self.counts = list(counts)
        self.gpus = gpus  # host h sees its own GPUs: one per rank, after the previous host's
        # each host's veth sends at most this many Mbit/s (0: unshaped): a NIC that the host's
        # ranks share, slower than the memory its host steps copy through, as between real
        # hosts; traffic inside a host stays on the namespace's own addresses, unshaped
        self.link_mbit = link_mbit
        tag = f"{os.getpid() % 100000}"
        hosts = range(len(counts))
        self.ns = [f"gosym{tag}h{h}" for h in hosts]
        self.ifname = [f"gsv{tag}h{h}" for h in hosts]  # the host's end of its veth
        self.switch = f"gosym{tag}sw"  # the namespace of the bridge and the veths' other ends
        self.port = [f"gsp{tag}h{h}" for h in hosts]
        self.hostname = [f"gosym-host{h}" for h in hosts]
        self.addr = [f"{SUBNET}.{h + 1}" for h in hosts]
        self._dir = None
        self._made = []

    @property
    def master(self) -> str:
        return self.addr[0]

    def __enter__(self):
        try:
            self._up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc):
        self.down()

    def _up(self):
        self._dir = tempfile.mkdtemp(prefix="gosym-simhosts-")
        with open(os.path.join(self._dir, "hosts"), "w") as f:
            f.write("127.0.0.1 localhost\n")
            f.writelines(f"{a} {n}\n" for a, n in zip(self.addr, self.hostname))
        for ns in (*self.ns, self.switch):
            subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True, timeout=30)
            self._made.append(ns)
            _ip("link", "set", "lo", "up", ns=ns)
        _ip("link", "add", "br0", "type", "bridge", ns=self.switch)
        _ip("link", "set", "br0", "up", ns=self.switch)
        for h in range(len(self.counts)):
            _ip("link", "add", self.ifname[h], "type", "veth", "peer", "name", self.port[h])
            _ip("link", "set", self.ifname[h], "netns", self.ns[h])
            _ip("link", "set", self.port[h], "netns", self.switch)
            _ip("link", "set", self.port[h], "master", "br0", ns=self.switch)
            _ip("link", "set", self.port[h], "up", ns=self.switch)
            _ip("addr", "add", f"{self.addr[h]}/24", "dev", self.ifname[h], ns=self.ns[h])
            _ip("link", "set", self.ifname[h], "up", ns=self.ns[h])
            if self.link_mbit:
                # what the host sends leaves its own end, what it receives the switch's port:
                # a full-duplex NIC of link_mbit each way, so two hosts sending to a third
                # share its rate as they would a real NIC's
                self._shape(self.ns[h], self.ifname[h])
                self._shape(self.switch, self.port[h])

    def _shape(self, ns, dev):
        """A token bucket on dev's egress holding 10 ms of the rate (at least 64 KiB: above
        one timer tick's worth at any HZ), queueing up to 200 ms."""
        burst = max(64 << 10, self.link_mbit * 1_000_000 // 8 // 100)
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root",
                        "tbf", "rate", f"{self.link_mbit}mbit", "burst", str(burst),
                        "latency", "200ms"], check=True, capture_output=True, timeout=30)

    def down(self):
        """Deletes the namespaces (the veths and the bridge go with them) and the hosts file."""
        for ns in self._made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self._made = []
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def wrap(self, host, argv):
        """argv run as a process of host `host`."""
        return ["ip", "netns", "exec", self.ns[host], "unshare", "--uts", "--mount", "--",
                "sh", "-c", _ENTER, self.hostname[host], os.path.join(self._dir, "hosts"), *argv]

    def host_env(self, host) -> dict:
        env = {"GLOO_SOCKET_IFNAME": self.ifname[host], "NCCL_SOCKET_IFNAME": self.ifname[host],
               "MASTER_ADDR": self.master, "MASTER_PORT": str(PORT)}
        if self.link_mbit:
            # the namespaces share this machine's kernel, whose boot id would make the link
            # loopback to gosym (schedule.link); a shaped one stands for a network
            env["GOSYM_HIER_LINK"] = "network"
        if self.gpus and int(os.environ.get("GOSYM_TEST_RANKS_PER_GPU", "1") or "1") <= 1:
            # (ranks that share GPUs see them all: wcommon.cuda_device picks one)
            first = sum(self.counts[:host])
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(first + i) for i in range(self.counts[host]))
        return env

    def ranks(self):
        """(rank, host, local rank) of every rank, host-major."""
        out = []
        for h, n in enumerate(self.counts):
            out += [(len(out) + i, h, i) for i in range(n)]
        return out

    def rank_env(self, rank, host, local) -> dict:
        return {**self.host_env(host), "RANK": str(rank), "WORLD_SIZE": str(sum(self.counts)),
                "LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": str(self.counts[host]),
                "GROUP_RANK": str(host)}

    def fill(self, argv, host):
        return [a.format(host=host, master=self.master, nhosts=len(self.counts)) for a in argv]


class IdHosts(SimHosts):
    """SimHosts' interface without namespaces: every rank on this machine, told apart into
    hosts by GOSYM_HOST_ID and NCCL_HOSTID (gosym links a host's ranks, Gloo and NCCL the rest
    over loopback). Where namespaces cannot be made (the GPU machine has no `ip`), and for
    tests of what a host id decides."""

    def __init__(self, counts, gpus=False, link_mbit=0):
        if link_mbit:
            raise ValueError("IdHosts: hosts told apart by id share loopback; no link to shape")
        super().__init__(counts, gpus)
        self.addr = ["127.0.0.1"] * len(counts)
        self.port = str(29500 + os.getpid() % 20000)

    def _up(self):
        pass

    def wrap(self, host, argv):
        return list(argv)

    def host_env(self, host) -> dict:
        env = super().host_env(host)
        for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            env.pop(k)
        # NCCL_HOSTID: NCCL sees the hosts too (its network transport between them)
        env.update(GOSYM_HOST_ID=self.hostname[host], NCCL_HOSTID=self.hostname[host],
                   MASTER_PORT=self.port)
        return env


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hosts", default="2,2", help="ranks per host, e.g. 2,2 or 1,2")
    p.add_argument("--per-host", action="store_true", help="run the command once per host")
    p.add_argument("--gpus", action="store_true", help="give each host one GPU per rank "
                                                       "(CUDA_VISIBLE_DEVICES)")
    p.add_argument("--link-mbit", type=int, default=0,
                   help="shape each host's link to this many Mbit/s (tc tbf; 0: unshaped)")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        p.error("no command")
    counts = [int(x) for x in a.hosts.split(",")]
    why = (unavailable() if len(counts) <= SimHosts.MAX_HOSTS
           else f"more than {SimHosts.MAX_HOSTS} hosts")
    if why and a.link_mbit:
        p.error(f"--link-mbit needs namespaced hosts, and here {why}")
    if why:
        print(f"simhosts: {why}; the hosts are told apart by GOSYM_HOST_ID and NCCL_HOSTID",
              file=sys.stderr)
    with (IdHosts(counts, a.gpus) if why else SimHosts(counts, a.gpus, a.link_mbit)) as hosts:
        procs = []
        if a.per_host:
            for h in range(len(counts)):
                env = dict(os.environ, **hosts.host_env(h))
                procs.append(subprocess.Popen(hosts.wrap(h, hosts.fill(cmd, h)), env=env))
        else:
            for r, h, li in hosts.ranks():
                env = dict(os.environ, **hosts.rank_env(r, h, li))
                procs.append(subprocess.Popen(hosts.wrap(h, hosts.fill(cmd, h)), env=env))
        rc = 0
        for q in procs:
            try:
                rc = q.wait(timeout=a.timeout) or rc
            except subprocess.TimeoutExpired:
                for x in procs:
                    x.kill()
                rc = 124
    sys.exit(rc)


if __name__ == "__main__":
    main()
