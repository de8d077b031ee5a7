"""Past one host: a gosym group whose ranks span hosts.

gosym's links are abstract Unix sockets and its data planes shared memory, so they reach
the processes of one host (one network namespace) only. Between hosts gosym grows no
transport of its own: it runs the engines people already run there, Gloo for CPU tensors
and NCCL for CUDA tensors, as torch ProcessGroups it creates itself over the group's
store under a prefix of its own.

At creation the ranks publish a host id through the store (hostname, boot id, network
and pid namespaces; GOSYM_HOST_ID overrides it). A group wholly on one host is a plain
ProcessGroupGosym: nothing of this module stays on its path. Otherwise the group is a
HierGroup, the hierarchy UCC's cl/hier and Open MPI's HAN use:

- local: a gosym group over this host's ranks (local index = order of group rank);
- rail l: an inter-host group over the ranks of local index l, one per host that has one
  (rail 0, the hosts' first ranks, is the leaders' group);
- flat: an inter-host group over every rank, for what needs any pair (send/recv across
  hosts, all_to_all, gather, scatter).

Gloo's inner groups are created with the group (their construction is collective); NCCL's
at the first CUDA op that needs them (theirs is not). They are shut down with the group.
"""

from __future__ import annotations

import json
import math
import os
import queue
import socket
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from . import _lib, _settings
from . import forms as _forms
from ._dtypes import reduce_op, reduce_types
from ._errors import DistBackendError
from ._streams import _raw_stream
from ._tensors import _one, _op_device, _same_dtype
from .backend import ProcessGroupGosym
from .work import EventWork, cuda_work

HOST_ENV = "GOSYM_HOST_ID"


def tunables():
    """(rail_min, chunk, report_s), read at group creation (docs/TUNABLES.md): all_reduce,
    reduce_scatter and all_gather of at least rail_min bytes take the rails (every local
    index moves 1/n of the data between hosts) on hosts of equal rank counts, smaller ones
    and any on unequal hosts the hosts' leaders; the rails' all_reduce is pipelined in
    chunks of chunk bytes (one chunk's inter-host step overlaps the next one's intra-host
    reduce-scatter); after a failure, a rank waits report_s seconds for every other rank
    to report it before naming those that did not as lost."""
    return (_settings.whole("GOSYM_HIER_RAIL_MIN", 64 << 10, 1),
            _settings.whole("GOSYM_HIER_CHUNK", 4 << 20, 4096),
            _settings.whole("GOSYM_HIER_REPORT_S", 10, 0))

_RED_NAMES = {code: name for name, code in _lib.RED.items()}
# dtypes both Gloo and NCCL move and reduce as themselves; the rest travel as bytes, and
# reductions over int16 (which neither reduces) as int32 (the low bits wrap the same).
_WIRE = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
         torch.int32, torch.int64, torch.bool}
_SUM = dist.ReduceOp.SUM
_ZERO = timedelta(0)


def host_id() -> str:
    """This process's host as gosym's links see it: processes with the same id can link.
    Abstract Unix sockets do not cross network namespaces, and peers are authenticated by
    pid, which a pid namespace renumbers; GOSYM_HOST_ID, when set, is the id instead."""
    env = _settings.host_id()
    if env:
        return f"{HOST_ENV}={env}"
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "no-boot-id"
    parts = [socket.gethostname(), boot]
    for ns in ("net", "pid"):
        try:
            parts.append(f"{ns}:{os.stat(f'/proc/self/ns/{ns}').st_ino}")
        except OSError:
            parts.append(f"{ns}:?")
    return "/".join(parts)


def host_ids(store, rank, size, timeout, name):
    """Every rank's host_id(), through the store, and this rank's key (deleted once every
    rank has read it)."""
    gen = store.add(f"gosym/hostgen/{rank}", 1)  # fresh keys per creation, as _endpoint.bootstrap's
    keys = [f"gosym/host/{gen}/{r}" for r in range(size)]
    store.set(keys[rank], host_id())
    try:
        store.wait(keys, timeout)
    except Exception as e:  # noqa: BLE001 - re-raised naming the ranks that are missing
        late = [r for r in range(size) if not store.check([keys[r]])]
        raise DistBackendError(f"gosym: group {name!r} (rank {rank} of {size}): ranks {late} did "
                                f"not publish their host id within {timeout} ({e})") from e
    return [v.decode() for v in store.multi_get(keys)], keys[rank]


def linked(store, rank, size, timeout, name, global_ranks, members, hid):
    """ProcessGroupGosym(...) over the ranks host detection put on one host (members, as
    ranks of the outer group); the connect proves it, and its failure says so."""
    try:
        return ProcessGroupGosym(store, rank, size, timeout, name, global_ranks)
    except Exception as e:
        if "connect" not in str(e):
            raise
        how = ("set by the operator" if hid.startswith(HOST_ENV) else
               "hostname/boot id/network and pid namespaces")
        raise DistBackendError(
            f"gosym: group {name!r}: host detection put ranks {members} on one host "
            f"({hid!r}, {how}), but gosym could not link them: they do not share a host "
            f"(or a network namespace) after all. Set {HOST_ENV} to one value per host. "
            f"({e})") from e


def _opts(cls, async_op=False, **kw):
    o = cls()
    o.asyncOp = async_op
    for k, v in kw.items():
        setattr(o, k, v)
    return o


def _wait(w):
    if w is not None:
        w.wait()


def _split_op(op, t):
    """(the local step's op, the inter-host step's op, whether to divide by the world at the
    end, PREMUL_SUM's factor or None) of reduction op on t; TypeError for what gosym does not
    reduce. The factor is applied by the local step, or by hand where a host has one rank."""
    red, scale = reduce_op(op)
    reduce_types(t, red)  # raises for dtypes and ops gosym cannot reduce
    name = _RED_NAMES[red]
    if t.is_cuda and t.dtype == torch.int16:
        # refused at the call, as gosym's CUDA kernels and NCCL refuse it: the group goes on
        raise NotImplementedError(f"gosym: {name} of int16 CUDA tensors is not supported (nor "
                                  "by NCCL); int16 reduces on CPU tensors")
    if t.is_cuda and name in ("BAND", "BOR", "BXOR"):
        raise ValueError(f"gosym: {name} of CUDA tensors across hosts is not supported: NCCL, "
                         "the inter-host engine, has no bitwise reductions")
    if name == "AVG":
        return _SUM, _SUM, True, None
    if name == "PREMUL_SUM":
        return op, _SUM, False, scale
    return op, op, False, None


def _red_wire(t):
    """t as the inter-host engine reduces it, and whether the result must be copied back."""
    if t.dtype in _WIRE:
        return t, False
    if t.is_complex():
        return torch.view_as_real(t), False
    if t.dtype == torch.int16:
        return t.to(torch.int32), True
    raise TypeError(f"gosym: reductions across hosts do not support dtype {t.dtype}")


def _bytes(t):
    """A contiguous t as rows of bytes along dim 0 (as the inter-host engine moves any dtype;
    splits along dim 0 keep their meaning): t itself for dtypes it knows."""
    if t.dtype in _WIRE:
        return t
    rows = t.shape[0] if t.dim() else 1
    return t.reshape(rows, math.prod(t.shape[1:])).view(torch.uint8)


def _contig(t, cb):
    """A contiguous t (a temporary whose contents go back into t through cb)."""
    if t.is_contiguous():
        return t
    tmp = t.contiguous()
    cb.append((t, tmp))
    return tmp


def _copy_back(cb):
    for t, tmp in cb:
        t.copy_(tmp)


def _divide(t, n):
    if t.is_floating_point() or t.is_complex():
        t.div_(n)
    else:
        t.copy_(torch.div(t, n, rounding_mode="trunc"))


class _Runner:
    """The thread that runs a HierGroup's host-side ops one after another, in post order:
    every rank posts the inner groups' ops in the same order, whatever its caller does
    meanwhile (torch's async Work, DDP's overlap)."""

    def __init__(self, name):
        self._name = name
        self._q = queue.SimpleQueue()
        self._thread = None

    def submit(self, fn, work):
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"gosym-hier-{self._name}",
                                            daemon=True)
            self._thread.start()
        self._q.put((fn, work))

    def on_thread(self):
        return threading.current_thread() is self._thread

    def drain(self):
        """Blocks until every op posted so far ran."""
        if self._thread is not None and not self.on_thread():
            w = EventWork(None)
            self._q.put((lambda: None, w))
            w.wait()

    def close(self):
        t, self._thread = self._thread, None
        if t is not None:
            self._q.put(None)
            if t is not threading.current_thread():
                t.join(30)

    def _loop(self):
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, work = item
            try:
                fn()
                work._finish(None)
            except BaseException as e:  # noqa: BLE001 - handed to the waiter
                work._finish(e)


class HierGroup(ProcessGroupGosym):
    """A gosym group over ranks of several hosts: gosym inside each host, Gloo (CPU) or
    NCCL (CUDA) between them (see the module's doc). Host-side ops run in post order on
    a worker thread; CUDA ops are enqueued on the caller's current stream, as NCCL's."""

    def __init__(self, store, rank, size, timeout, name, global_ranks, hosts, hid):
        dist.ProcessGroup.__init__(self, rank, size)
        self._rank, self._size, self._timeout, self._name = rank, size, timeout, name
        self._rail_min, self._chunk, self._report_s = tunables()
        self._desc = "undefined"
        self._global_ranks = list(global_ranks) if global_ranks else list(range(size))
        self._h, self._cuda = 0, None
        self._hosts = hosts
        self._where = {r: (h, li) for h, rs in enumerate(hosts) for li, r in enumerate(rs)}
        self._host, self._lidx = self._where[rank]
        counts = {len(rs) for rs in hosts}
        self._n = len(hosts[self._host])
        self._balanced = len(counts) == 1
        self._rail = [rs[self._lidx] for rs in hosts if len(rs) > self._lidx]
        self._seq = 0
        self._broken = None
        self._inner = {}
        gen = store.add(f"gosym/hiergen/{rank}", 1)
        self._store = dist.PrefixStore(f"gosym/hier/{gen}/", store)
        mine = hosts[self._host]
        local_store = dist.PrefixStore(f"host{self._host}/", self._store)
        self._local = linked(local_store, self._lidx, self._n, timeout, f"{name}/host{self._host}",
                              [self._global_ranks[r] for r in mine], mine, hid)
        self._runner = _Runner(name)
        try:
            self._group("rail", "cpu")
            self._group("flat", "cpu")
        except BaseException:
            self._local.shutdown()
            raise

    # ---- identity, lifetime ---------------------------------------------------

    def __repr__(self):
        return (f"HierGroup(name={self._name!r}, rank={self._rank}, size={self._size}, "
                f"hosts={self._hosts})")

    def _endpoint(self):
        raise ValueError("gosym: this group spans hosts; memory views and registrations "
                         "need a group whose ranks share one host")

    def _stats_json(self):
        s = json.loads(self._local._stats_json())
        s["hier"] = {"hosts": self._hosts, "host": self._host, "local_rank": self._lidx,
                     "inner_groups": sorted(f"{k}/{d}" for k, d in self._inner)}
        return json.dumps(s)

    def shutdown(self):
        """Drains the worker, then shuts the inner groups down. Idempotent."""
        self._runner.close()
        self._close_inner(abort=False)
        self._local.shutdown()

    def abort(self):
        self._runner.close()
        self._close_inner(abort=True)
        self._local.shutdown()

    def _close_inner(self, abort):
        inner, self._inner = self._inner, {}
        for pg in inner.values():
            try:
                pg.abort() if abort else pg.shutdown()
            except Exception:  # noqa: BLE001 - best effort: the group goes either way
                pass

    # ---- inner groups ---------------------------------------------------------

    def _group(self, kind, dev):
        """This rank's inter-host group of kind "rail" (its local index's) or "flat" (every
        rank), on Gloo (dev "cpu") or NCCL (dev "cuda")."""
        pg = self._inner.get((kind, dev))
        if pg is None:
            ranks = self._rail if kind == "rail" else list(range(self._size))
            tag = f"rail{self._lidx}" if kind == "rail" else kind
            sub = dist.PrefixStore(f"{tag}/{dev}/", self._store)
            me = ranks.index(self._rank)
            if dev == "cpu":
                pg = _c10d.ProcessGroupGloo(sub, me, len(ranks), self._timeout)
            else:
                opts = _c10d.ProcessGroupNCCL.Options()
                opts._timeout = self._timeout
                opts.group_name = f"{self._name}/{tag}"
                opts.global_ranks_in_group = [self._global_ranks[r] for r in ranks]
                pg = _c10d.ProcessGroupNCCL(sub, me, len(ranks), opts)
            self._inner[(kind, dev)] = pg
        return pg

    def _dev(self, dev):
        return "cpu" if dev < 0 else "cuda"

    # ---- running ops -----------------------------------------------------------

    def _per_rank(self, ts, like, what, kind, uneven=False):
        """Checks ts, an op's list of one tensor per rank, against like: the dtype, and the
        size at this rank's place (the others may differ: NCCL's all_gather_v and
        reduce_scatter_v, which torch reaches through these list forms) or, unless uneven,
        everywhere. Returns the largest size: the _v forms pad every rank's part to it."""
        if len(ts) != self._size:
            raise ValueError(f"gosym: {what}: {kind} list has {len(ts)} tensors, the group has "
                             f"{self._size} ranks")
        for x in ts:
            _same_dtype(like, x, what)
        if ts[self._rank].numel() != like.numel():
            raise ValueError(f"gosym: {what}: {kind} tensor {self._rank} (this rank's) has "
                             f"{ts[self._rank].numel()} elements, expected {like.numel()}")
        for x in ts if not uneven else ():
            if x.numel() != like.numel():
                raise ValueError(f"gosym: {what}: {kind} tensor has {x.numel()} elements, "
                                 f"expected {like.numel()}")
        return max(x.numel() for x in ts)

    def _post(self, what, keep, out, fn, async_op=True):
        """Runs fn(dev) (the op's steps) as op `what`: CUDA ops (keep's tensors on a GPU)
        at once on the caller's stream, host ops on the worker thread (inline when called
        from it, by a future's callback). Errors become gosym errors naming the op."""
        if self._broken is not None:
            raise DistBackendError(f"gosym: {what}: the group is unusable after an earlier "
                                    f"failure: {self._broken}")
        dev = _op_device(keep)
        self._seq += 1
        seq = self._seq

        def run():
            try:
                fn(self._dev(dev))
            except Exception as e:
                raise self._failed(what, seq, e) from e

        if dev >= 0:
            self._runner.drain()  # host ops posted earlier go first on the inner groups
            self._cuda = dev
            run()
            return cuda_work(out, dev, _raw_stream(dev)) if async_op else None
        w = EventWork(out)
        if self._runner.on_thread():
            try:
                run()
                w._finish(None)
            except Exception as e:  # noqa: BLE001 - raised through the Work
                w._finish(e)
        else:
            self._runner.submit(run, w)
        if async_op:
            return w
        w.wait()
        return None

    def _failed(self, what, seq, e):
        """The error of op what (seq) that failed with e: the inner groups are aborted (a
        peer in a gosym step with this rank fails at once, one in a Gloo step at the latest
        at its timeout), the failure is reported through the store, and the ranks that do
        not report it within GOSYM_HIER_REPORT_S are named as lost."""
        if self._broken is not None:
            return DistBackendError(f"gosym: {what} (seq {seq}): {self._broken}")
        self._broken = "aborting"
        self._close_inner(abort=True)
        self._local.abort()
        lost = self._lost(what, seq)
        msg = (f"gosym: {what} (seq {seq}) across hosts failed on rank {self._rank} of "
               f"{self._size} (group {self._name!r}, host {self._host} of ranks "
               f"{self._hosts[self._host]}): {lost}; cause: {type(e).__name__}: {e}")
        self._broken = msg
        return DistBackendError(msg)

    def _lost(self, what, seq):
        try:
            keys = [f"failed/{r}" for r in range(self._size)]
            self._store.set(keys[self._rank], f"{what} {seq}")
            deadline = time.monotonic() + self._report_s
            while True:
                late = [r for r in range(self._size) if not self._store.check([keys[r]])]
                if not late or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        except Exception as e:  # noqa: BLE001 - the store's host may be the lost one
            return f"the store is unreachable to name the lost ranks ({e})"
        if not late:
            return "every rank reported the failure (no rank was lost)"
        return (f"ranks {late} were lost or are blocked elsewhere (no report of the failure "
                f"from them within {self._report_s:.0f} s)")

    # ---- reductions -------------------------------------------------------------

    def _inter_allreduce(self, pg, buf, op):
        w, back = _red_wire(buf)
        _wait(pg.allreduce([w], _opts(_c10d.AllreduceOptions, reduceOp=op)))
        if back:
            buf.copy_(w)

    def _local_bcast(self, buf, root):
        if self._n > 1:
            _wait(self._local.broadcast([buf], _opts(_c10d.BroadcastOptions, rootRank=root)))

    def _host_reduce(self, buf, lop, scale):
        """The local step of a reduction through the leaders: reduce to local index 0."""
        if self._n > 1:
            _wait(self._local.reduce([buf], _opts(_c10d.ReduceOptions, reduceOp=lop, rootRank=0)))
        elif scale is not None:
            buf.mul_(scale)

    def _ar_leaders(self, buf, lop, iop, scale, dev):
        """all_reduce through the hosts' leaders: reduce to local index 0, all_reduce among
        the leaders, broadcast from local index 0."""
        self._host_reduce(buf, lop, scale)
        if self._lidx == 0:
            self._inter_allreduce(self._group("rail", dev), buf, iop)
        self._local_bcast(buf, 0)

    def _ar_rails(self, buf, lop, iop, dev):
        """all_reduce on hosts of n ranks each, in chunks: intra-host reduce-scatter, then
        all_reduce of each rank's 1/n among the ranks of its local index (async, so it
        overlaps the next chunk's reduce-scatter), then intra-host all_gather."""
        n, total = self._n, buf.numel()
        step = max(n, self._chunk // buf.element_size() // n * n)
        rail = self._group("rail", dev)
        prev = None
        for a in range(0, total, step):
            seg = buf.narrow(0, a, min(step, total - a))
            pad = -seg.numel() % n
            segp = seg
            if pad:
                segp = buf.new_zeros(seg.numel() + pad)
                segp[:seg.numel()].copy_(seg)
            shard = buf.new_empty(segp.numel() // n)
            _wait(self._local._reduce_scatter_base(
                shard, segp, _opts(_c10d.ReduceScatterOptions, reduceOp=lop)))
            w, back = _red_wire(shard)
            work = rail.allreduce([w], _opts(_c10d.AllreduceOptions, True, reduceOp=iop))
            if prev is not None:
                self._ar_gather(*prev)
            prev = (seg, segp, shard, w, back, work)
        if prev is not None:
            self._ar_gather(*prev)

    def _ar_gather(self, seg, segp, shard, w, back, work):
        work.wait()
        if back:
            shard.copy_(w)
        _wait(self._local._allgather_base(segp, shard, _opts(_c10d.AllgatherOptions)))
        if segp is not seg:
            seg.copy_(segp[:seg.numel()])

    def _use_rails(self, nbytes, numel):
        return self._balanced and self._n > 1 and nbytes >= self._rail_min and numel >= self._n

    def _allreduce_flat(self, buf, op, dev):
        """all_reduce of a contiguous 1-D buffer in place."""
        lop, iop, avg, scale = _split_op(op, buf)
        if not buf.numel():
            return
        if self._use_rails(buf.numel() * buf.element_size(), buf.numel()):
            self._ar_rails(buf, lop, iop, dev)
        else:
            self._ar_leaders(buf, lop, iop, scale, dev)
        if avg:
            _divide(buf, self._size)

    def _in_place(self, what, tensors, fn, async_op):
        """An op in place on tensors[0]: fn(flat contiguous buffer, dev), copied back into a
        non-contiguous tensor."""
        t = _one(tensors, what)

        def run(dev):
            if not t.numel():
                return  # nothing moves (and gosym's steps of an empty op are not collective)
            buf = t if t.is_contiguous() else t.contiguous()
            fn(buf.view(-1), dev)
            if buf is not t:
                t.copy_(buf)

        return self._post(what, t, tensors, run, async_op)

    def allreduce(self, tensors, opts=None):
        opts = opts or _c10d.AllreduceOptions()
        t = _one(tensors, "all_reduce")
        if t.layout is not torch.strided:
            raise ValueError("gosym: all_reduce of sparse tensors across hosts is not supported")
        _split_op(opts.reduceOp, t)  # bad input raises here, not on the worker
        op = opts.reduceOp
        return self._in_place("all_reduce", tensors,
                              lambda buf, dev: self._allreduce_flat(buf, op, dev), opts.asyncOp)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or _c10d.AllreduceCoalescedOptions()
        if not tensors:
            return self._post("all_reduce_coalesced", [], tensors, lambda dev: None, True)
        for t in tensors:
            _same_dtype(tensors[0], t, "all_reduce_coalesced")
        _split_op(opts.reduceOp, tensors[0])
        op = opts.reduceOp

        def run(dev):
            flat = torch.cat([t.reshape(-1) for t in tensors])
            self._allreduce_flat(flat, op, dev)
            off = 0
            for t in tensors:
                t.copy_(flat[off:off + t.numel()].view(t.shape))
                off += t.numel()

        return self._post("all_reduce_coalesced", tensors, tensors, run)

    def reduce(self, tensors, opts=None):
        opts = opts or _c10d.ReduceOptions()
        root = self._root(opts.rootRank, "reduce")
        t = _one(tensors, "reduce")
        lop, iop, avg, scale = _split_op(opts.reduceOp, t)
        hr, _ = self._where[root]

        def run(buf, dev):
            # local index 0 gathers its host, the leaders reduce to the root's host's one,
            # which hands the result on to its host (the root among them)
            self._host_reduce(buf, lop, scale)
            if self._lidx == 0:
                w, back = _red_wire(buf)
                _wait(self._group("rail", dev).reduce([w], _opts(_c10d.ReduceOptions, reduceOp=iop,
                                                                 rootRank=hr)))
                if back:
                    buf.copy_(w)
            if self._host == hr:
                self._local_bcast(buf, 0)
            if avg and self._rank == root:
                _divide(buf, self._size)

        return self._in_place("reduce", tensors, run, opts.asyncOp)

    def broadcast(self, tensors, opts=None):
        opts = opts or _c10d.BroadcastOptions()
        root = self._root(opts.rootRank, "broadcast")
        hr, lr = self._where[root]

        def run(buf, dev):
            buf = _bytes(buf)
            if self._host == hr:
                self._local_bcast(buf, lr)
            if self._lidx == 0:
                _wait(self._group("rail", dev).broadcast(
                    [buf], _opts(_c10d.BroadcastOptions, rootRank=hr)))
            if self._host != hr:
                self._local_bcast(buf, 0)

        return self._in_place("broadcast", tensors, run, opts.asyncOp)

    # ---- all_gather, reduce_scatter ---------------------------------------------------

    def _order(self, dev):
        """Group ranks in the order of (local index, host): where the rails' layouts put
        them, as an index tensor on dev."""
        n, hosts = self._n, self._hosts
        order = [hosts[h][li] for li in range(n) for h in range(len(hosts))]
        return torch.tensor(order, device="cpu" if dev == "cpu" else f"cuda:{self._cuda}")

    def _gather_rows(self, out, inp, dev):
        """out (size x m rows, contiguous) <- every rank's inp (m elements)."""
        m = inp.numel()
        rows = out.view(self._size, m)
        if not m:
            return
        if self._use_rails(out.numel() * out.element_size(), out.numel()):
            # the rail's pieces (one per host), then the host's rails: (local index, host)
            hosts = len(self._hosts)
            r1 = inp.new_empty(hosts * m)
            _wait(self._group("rail", dev)._allgather_base(r1, inp, _opts(_c10d.AllgatherOptions)))
            r2 = inp.new_empty(self._size * m)
            _wait(self._local._allgather_base(r2, r1, _opts(_c10d.AllgatherOptions)))
            rows.index_copy_(0, self._order(dev), r2.view(self._size, m))
            return
        # leaders: each host's rows, padded to the largest host, gathered among the
        # leaders, then broadcast inside each host
        most = max(len(rs) for rs in self._hosts)
        hb = inp.new_zeros(most * m)
        if self._n > 1:
            _wait(self._local._allgather_base(hb[:self._n * m], inp, _opts(_c10d.AllgatherOptions)))
        else:
            hb[:m].copy_(inp)
        lb = inp.new_empty(len(self._hosts) * most * m)
        if self._lidx == 0:
            _wait(self._group("rail", dev)._allgather_base(lb, hb, _opts(_c10d.AllgatherOptions)))
        self._local_bcast(lb, 0)
        pos = [h * most + li for h, rs in enumerate(self._hosts) for li in range(len(rs))]
        ranks = [r for rs in self._hosts for r in rs]
        idx = torch.tensor(ranks, device=lb.device)
        slots = lb.view(len(self._hosts) * most, m)
        rows.index_copy_(0, idx, slots[torch.tensor(pos, device=lb.device)])

    def _allgather_base(self, output, input, opts=None):  # noqa: A002 - torch's names
        opts = opts or _c10d.AllgatherOptions()
        _same_dtype(output, input, "all_gather_into_tensor")
        if output.numel() != input.numel() * self._size:
            raise ValueError(f"gosym: all_gather_into_tensor: output has {output.numel()} "
                             f"elements, expected world size {self._size} x input "
                             f"{input.numel()}")

        def run(dev):
            cb = []
            out = _contig(output, cb)
            src = _bytes(input.contiguous().view(-1)).view(-1)
            self._gather_rows(_bytes(out.view(-1)).view(-1), src, dev)
            _copy_back(cb)

        return self._post("all_gather_into_tensor", (output, input), [output], run, opts.asyncOp)

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts or _c10d.AllgatherOptions()
        outs = _one(output_tensors, "all_gather")
        t = _one(input_tensors, "all_gather")
        m = self._per_rank(outs, t, "all_gather", "output", uneven=True)

        def run(dev):
            src = t.contiguous().view(-1)
            if m != src.numel():
                src = torch.cat([src, src.new_zeros(m - src.numel())])
            flat = t.new_empty(self._size * m)
            self._gather_rows(_bytes(flat).view(-1), _bytes(src).view(-1), dev)
            for r, o in enumerate(flat.view(self._size, m)):
                outs[r].copy_(o[:outs[r].numel()].view(outs[r].shape))

        return self._post("all_gather", (outs, t), outs, run, opts.asyncOp)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        pairs = zip(output_lists, input_list, strict=True)
        works = [self.allgather([o], [i], opts) for o, i in pairs]
        return works[-1] if works else None

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return works[-1] if works else None

    def _scatter_rows(self, out, inp, op, dev):
        """out (m) <- the reduction of every rank's row `rank` of inp (size x m, contiguous)."""
        lop, iop, avg, _ = _split_op(op, out)
        m = out.numel()
        if self._use_rails(inp.numel() * inp.element_size(), inp.numel()):
            # rows in (local index, host) order: the host's reduce-scatter gives each rank
            # its local index's rows (one per host), the rail's reduce-scatter its own row
            y = inp.view(self._size, m).index_select(0, self._order(dev)).view(-1)
            shard = out.new_empty(len(self._hosts) * m)
            _wait(self._local._reduce_scatter_base(
                shard, y, _opts(_c10d.ReduceScatterOptions, reduceOp=lop)))
            ws, back = _red_wire(shard)
            wo = out.new_empty(m, dtype=ws.dtype) if back else _red_wire(out)[0]
            _wait(self._group("rail", dev)._reduce_scatter_base(
                wo, ws, _opts(_c10d.ReduceScatterOptions, reduceOp=iop)))
            if back:
                out.copy_(wo)
        else:
            tmp = inp.clone()
            self._allreduce_flat(tmp, op, dev)
            out.copy_(tmp.view(self._size, m)[self._rank])
            return
        if avg:
            _divide(out, self._size)

    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002
        opts = opts or _c10d.ReduceScatterOptions()
        _same_dtype(output, input, "reduce_scatter_tensor")
        if input.numel() != output.numel() * self._size:
            raise ValueError(f"gosym: reduce_scatter_tensor: input has {input.numel()} "
                             f"elements, expected world size {self._size} x output "
                             f"{output.numel()}")
        _split_op(opts.reduceOp, output)
        op = opts.reduceOp

        def run(dev):
            cb = []
            out = _contig(output, cb)
            self._scatter_rows(out.view(-1), input.contiguous().view(-1), op, dev)
            _copy_back(cb)

        return self._post("reduce_scatter_tensor", (output, input), [output], run, opts.asyncOp)

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        opts = opts or _c10d.ReduceScatterOptions()
        out = _one(output_tensors, "reduce_scatter")
        ins = _one(input_lists, "reduce_scatter")
        m = self._per_rank(ins, out, "reduce_scatter", "input", uneven=True)
        _split_op(opts.reduceOp, out)
        op = opts.reduceOp

        def run(dev):
            flat = out.new_zeros(self._size, m)
            for row, t in zip(flat, ins):
                row[:t.numel()].copy_(t.reshape(-1))
            buf = out.new_empty(m)
            self._scatter_rows(buf, flat.view(-1), op, dev)
            out.copy_(buf[:out.numel()].view(out.shape))

        return self._post("reduce_scatter", (out, ins), output_tensors, run, opts.asyncOp)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        pairs = zip(outputs, inputs, strict=True)
        works = [self._reduce_scatter_base(o, i, opts) for o, i in pairs]
        return works[-1] if works else None

    # ---- all_to_all, gather, scatter: the flat inter-host group ------------------------

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes,  # noqa: A002
                      opts=None):
        opts = opts or _c10d.AllToAllOptions()
        _same_dtype(output, input, "all_to_all_single")
        for t, splits, what in ((input, input_split_sizes, "input"),
                                (output, output_split_sizes, "output")):
            rows = t.shape[0] if t.dim() else 1
            if not splits:
                if rows % self._size:
                    raise ValueError(f"gosym: all_to_all_single: {what} dim 0 ({rows}) is not "
                                     f"divisible by the world size {self._size}")
            elif len(splits) != self._size or min(splits) < 0 or sum(splits) != rows:
                raise ValueError(f"gosym: all_to_all_single: {what} splits {list(splits)} do "
                                 f"not split dim 0 ({rows}) among {self._size} ranks")

        def run(dev):
            cb = []
            out = _contig(output, cb)
            _wait(self._group("flat", dev).alltoall_base(
                _bytes(out), _bytes(input.contiguous()), list(output_split_sizes),
                list(input_split_sizes), _opts(_c10d.AllToAllOptions)))
            _copy_back(cb)

        return self._post("all_to_all_single", (output, input), [output], run, opts.asyncOp)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts or _c10d.AllToAllOptions()
        if len(output_tensors) != self._size or len(input_tensors) != self._size:
            raise ValueError(f"gosym: all_to_all: {len(output_tensors)} outputs and "
                             f"{len(input_tensors)} inputs for {self._size} ranks")
        first = input_tensors[0]
        for t in (*input_tensors, *output_tensors):
            _same_dtype(first, t, "all_to_all")

        def run(dev):
            src = torch.cat([t.reshape(-1) for t in input_tensors])
            dst = src.new_empty(sum(t.numel() for t in output_tensors))
            _wait(self._group("flat", dev).alltoall_base(
                _bytes(dst.view(-1, 1)), _bytes(src.view(-1, 1)),
                [t.numel() for t in output_tensors], [t.numel() for t in input_tensors],
                _opts(_c10d.AllToAllOptions)))
            off = 0
            for t in output_tensors:
                t.copy_(dst[off:off + t.numel()].view(t.shape))
                off += t.numel()

        return self._post("all_to_all", (output_tensors, input_tensors), output_tensors, run,
                          opts.asyncOp)

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or _c10d.GatherOptions()
        root = self._root(opts.rootRank, "gather")
        t = _one(input_tensors, "gather")
        outs = _one(output_tensors, "gather") if self._rank == root else []
        if self._rank == root:
            self._per_rank(outs, t, "gather", "gather")

        def run(dev):
            bufs = [t.new_empty(t.numel()) for _ in outs]
            _wait(self._group("flat", dev).gather(
                [[_bytes(b) for b in bufs]] if bufs else [], [_bytes(t.contiguous().view(-1))],
                _opts(_c10d.GatherOptions, rootRank=root)))
            for o, b in zip(outs, bufs):
                o.copy_(b.view(o.shape))

        out = outs if self._rank == root else output_tensors
        return self._post("gather", (t, outs), out, run, opts.asyncOp)

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or _c10d.ScatterOptions()
        root = self._root(opts.rootRank, "scatter")
        out = _one(output_tensors, "scatter")
        ins = _one(input_tensors, "scatter") if self._rank == root else []
        if self._rank == root:
            self._per_rank(ins, out, "scatter", "scatter")

        def run(dev):
            buf = out.new_empty(out.numel())
            _wait(self._group("flat", dev).scatter(
                [_bytes(buf)], [[_bytes(i.contiguous().view(-1)) for i in ins]] if ins else [],
                _opts(_c10d.ScatterOptions, rootRank=root)))
            out.copy_(buf.view(out.shape))

        return self._post("scatter", (out, ins), output_tensors, run, opts.asyncOp)

    # ---- point to point, barrier ----------------------------------------------------

    def _p2p(self, what, tensors, peer, tag, recv):
        """send/recv: through the local gosym group to a rank of this host, straight
        through the flat inter-host group to any other."""
        peer = self._peer(peer, what)
        t = _one(tensors, what)
        hp, lp = self._where[peer]
        if hp == self._host:
            return (self._local.recv if recv else self._local.send)(tensors, lp, tag)
        if self._broken is not None:
            raise DistBackendError(f"gosym: {what}: the group is unusable after an earlier "
                                    f"failure: {self._broken}")
        pg = self._group("flat", self._dev(_op_device(t)))
        if not recv:
            return pg.send([_bytes(t.contiguous())], peer, tag)
        if t.is_contiguous():
            return pg.recv([_bytes(t)], peer, tag)
        buf = t.contiguous()
        _wait(pg.recv([_bytes(buf)], peer, tag))
        t.copy_(buf)
        w = EventWork(tensors)
        w._finish(None)
        return w

    def send(self, tensors, dstRank, tag):  # noqa: N803 - torch's names
        return self._p2p("send", tensors, dstRank, tag, False)

    def recv(self, tensors, srcRank, tag):  # noqa: N803
        return self._p2p("recv", tensors, srcRank, tag, True)

    def barrier(self, opts=None):
        """Every host's ranks meet, then the leaders, then every host's again; a group that
        ran CUDA ops first waits for its device, as NCCL's barrier does."""
        opts = opts or _c10d.BarrierOptions()
        if self._cuda is not None:
            torch.cuda.synchronize(self._cuda)

        def run(dev):
            if self._n > 1:
                _wait(self._local.barrier(_opts(_c10d.BarrierOptions)))
            if self._lidx == 0:
                _wait(self._group("rail", "cpu").barrier(_opts(_c10d.BarrierOptions)))
            if self._n > 1:
                _wait(self._local.barrier(_opts(_c10d.BarrierOptions)))

        return self._post("barrier", [], [], run, opts.asyncOp)

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        self.barrier().wait(timeout if timeout is not None else _ZERO)


_forms.accept(HierGroup)
