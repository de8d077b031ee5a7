"""HierGroup: a gosym group whose ranks span hosts, as torch sees it (its ops).

Each op checks what it can at the call, then runs as a sequence of steps on the inner
groups (gosym.hier.lifetime posts them; gosym.hier.algorithms holds the paths between
hosts): reductions, broadcast and the gathers on the flat inter-host group or through the
leaders or along the rails, as gosym.hier.schedule chooses, and all_to_all_single of equal
splits on host tensors too; the other all_to_all forms, gather, scatter and send/recv across
hosts on the flat inter-host group.
"""

from __future__ import annotations

import torch
from torch._C import _distributed_c10d as _c10d

from .. import anysource as _anysource
from .. import forms as _forms
from .. import monitored as _monitored
from .. import profiling as _profiling
from .. import sparse as _sparse
from .._errors import DistBackendError
from .._tensors import _one, _op_device, _same_dtype
from ..work import EventWork, JoinedWork
from .algorithms import GENERAL, HierAlgorithms
from .tensors import _bytes, _contig, _copy_back, _flat_bytes, _opts, _split_op, _wait


def _joined(works, out):
    """One Work for the ops of a coalesced call, run one per tensor (None: they were
    synchronous): each may take another path (flat on the inner group's threads, general on
    the worker), so the last one's Work does not cover the others."""
    works = [w for w in works if w is not None]
    return JoinedWork(works, out) if works else None


class _Received(EventWork):
    """A receive from any source that is done (into a temporary, copied back): its sender."""

    def __init__(self, out, src):
        super().__init__(out)
        self._src = src
        self._finish(None)

    def _source_rank(self):
        return self._src


class HierGroup(HierAlgorithms):
    """A gosym group over ranks of several hosts: gosym inside each host, Gloo (CPU) or
    NCCL (CUDA) between them (see gosym.hier). Host-side ops run in post order on a worker
    thread; CUDA ops are enqueued on the caller's current stream, as NCCL's."""

    # ---- checks -----------------------------------------------------------------

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
            raise ValueError(f"gosym: {what}: this rank's {kind} tensor (number {self._rank}) has "
                             f"{ts[self._rank].numel()} elements, expected {like.numel()}")
        for x in ts if not uneven else ():
            if x.numel() != like.numel():
                raise ValueError(f"gosym: {what}: {kind} tensor has {x.numel()} elements, "
                                 f"expected {like.numel()}")
        return max(x.numel() for x in ts)

    # ---- reductions, broadcast ----------------------------------------------------

    def _in_place(self, what, tensors, fn, async_op):
        """An op in place on tensors[0]: fn(flat contiguous buffer, dev), copied back into a
        non-contiguous tensor."""
        t = _one(tensors, what)

        def run(dev):
            if not t.numel():
                return  # nothing moves (and gosym's steps of an empty op are not collective)
            buf = t if t.is_contiguous() else t.contiguous()
            fn(buf if buf.dim() == 1 else buf.view(-1), dev)
            if buf is not t:
                t.copy_(buf)

        return self._post(what, t, tensors, run, async_op)

    def _sparse_allreduce(self, t, tensors, opts):
        """all_reduce of a sparse COO tensor (SUM): gosym.sparse's gathers of the indices and
        values, run on this group, synchronously; an asynchronous caller gets a done Work."""
        sync = _c10d.AllreduceOptions()
        sync.reduceOp, sync.asyncOp = opts.reduceOp, False
        _sparse.sparse_allreduce(self, t, tensors, sync)
        if not opts.asyncOp:
            return None
        w = EventWork(tensors)
        w._finish(None)
        return w

    def allreduce(self, tensors, opts=None):
        opts = opts or _c10d.AllreduceOptions()
        t = _one(tensors, "all_reduce")
        if t.layout is torch.sparse_coo:  # DDP's sparse gradients, as on one host and gloo
            return self._sparse_allreduce(t, tensors, opts)
        if t.layout is not torch.strided:
            raise ValueError(f"gosym: all_reduce of {t.layout} tensors is not supported")
        op = opts.reduceOp
        _, iop, _, scale = _split_op(op, t)  # bad input raises here, not on the worker
        w = self._flat_now("all_reduce", t.numel() * t.element_size(), t,
                           lambda pg, v: pg.allreduce([t], opts), tensors, opts.asyncOp,
                           iop is op, nccl_red=scale is None)
        if w is not GENERAL:
            return w
        return self._in_place("all_reduce", tensors,
                              lambda buf, dev: self._allreduce(buf, op, dev), opts.asyncOp)

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
            self._allreduce(flat, op, dev)
            off = 0
            for t in tensors:
                t.copy_(flat[off:off + t.numel()].view(t.shape))
                off += t.numel()

        return self._in_batch(self._post("all_reduce_coalesced", tensors, tensors, run))

    def reduce(self, tensors, opts=None):
        opts = opts or _c10d.ReduceOptions()
        root = self._root(opts.rootRank, "reduce")
        t = _one(tensors, "reduce")
        lop, iop, avg, scale = _split_op(opts.reduceOp, t)

        def run(buf, dev):
            self._reduce(buf, root, lop, iop, avg, scale, dev)

        return self._in_place("reduce", tensors, run, opts.asyncOp)

    def broadcast(self, tensors, opts=None):
        opts = opts or _c10d.BroadcastOptions()
        root = self._root(opts.rootRank, "broadcast")
        t = _one(tensors, "broadcast")
        w = self._flat_now("broadcast", t.numel() * t.element_size(), t,
                           lambda pg, v: pg.broadcast([t], opts), tensors, opts.asyncOp)
        if w is not GENERAL:
            return w
        return self._in_place("broadcast", tensors,
                              lambda buf, dev: self._broadcast(buf, root, dev),
                              opts.asyncOp)

    # ---- all_gather, reduce_scatter ---------------------------------------------------

    def _allgather_base(self, output, input, opts=None):  # noqa: A002 - torch's names
        opts = opts or _c10d.AllgatherOptions()
        _same_dtype(output, input, "all_gather_into_tensor")
        if output.numel() != input.numel() * self._size:
            raise ValueError(f"gosym: all_gather_into_tensor: output has {output.numel()} "
                             f"elements, expected world size {self._size} x input "
                             f"{input.numel()}")
        w = self._flat_now("all_gather_into_tensor", input.numel() * input.element_size(),
                           (output, input),
                           lambda pg, v: pg._allgather_base(v(output), v(input), opts), [output],
                           opts.asyncOp)
        if w is not GENERAL:
            return w

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
        """torch's layout: one output list per rank, output_lists[r][i] is rank r's input i
        (one all_gather per input, one Work for all: _joined)."""
        world, n = self._size, len(input_list)
        if len(output_lists) != world or any(len(o) != n for o in output_lists):
            raise ValueError(f"gosym: all_gather_coalesced: expected {world} output lists (one "
                             f"per rank) of {n} tensors (one per input), got "
                             f"{[len(o) for o in output_lists]}")
        works = [self.allgather([[o[i] for o in output_lists]], [t], opts)
                 for i, t in enumerate(input_list)]
        return _joined(works, output_lists)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return self._in_batch(_joined(works, outputs))

    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002
        opts = opts or _c10d.ReduceScatterOptions()
        _same_dtype(output, input, "reduce_scatter_tensor")
        if input.numel() != output.numel() * self._size:
            raise ValueError(f"gosym: reduce_scatter_tensor: input has {input.numel()} "
                             f"elements, expected world size {self._size} x output "
                             f"{output.numel()}")
        op = opts.reduceOp
        _, iop, _, scale = _split_op(op, output)
        w = self._flat_now("reduce_scatter_tensor", input.numel() * input.element_size(),
                           (output, input),
                           lambda pg, v: pg._reduce_scatter_base(v(output), v(input), opts),
                           [output], opts.asyncOp, iop is op, nccl_red=scale is None)
        if w is not GENERAL:
            return w

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
        return self._in_batch(_joined(works, outputs))

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

        nbytes = input.numel() * input.element_size()
        blocks = self._a2a_applies(input, (*output_split_sizes, *input_split_sizes))
        w = self._flat_now("all_to_all_single", nbytes, (output, input),
                           lambda pg, v: pg.alltoall_base(output, input, output_split_sizes,
                                                          input_split_sizes, opts),
                           [output], opts.asyncOp, choice=blocks)
        if w is not GENERAL:
            return w

        def run(dev):
            cb = []
            out = _contig(output, cb)
            if blocks and self._hier("all_to_all_single", nbytes, dev):
                self._a2a_blocks(_flat_bytes(out), _flat_bytes(input.contiguous()), dev)
            else:
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
        """send/recv: straight through an inter-host group (Gloo, NCCL: _p2p_group), or
        through the local gosym group to a rank of this host (_local_pair). Each pair and
        direction uses one of them, so its messages keep their order. Either way a failure
        is the group's (_p2p_failed), naming the lost ranks: a rank whose host peer waits
        on another host's lost rank has its host group's CUDA work aborted by the watch's
        news (_abort_inner), which the local op would otherwise report as its own cause."""
        peer = self._peer(peer, what)
        t = _one(tensors, what)
        hp, lp = self._where[peer]
        self._usable(what)
        named = self._p2p_failed(f"{what} {'from' if recv else 'to'} rank {peer}")
        if hp == self._host and self._local_pair(t, peer):
            try:
                w = (self._local.recv if recv else self._local.send)(tensors, lp, tag)
            except DistBackendError as e:  # the group's failure; bad arguments raise as they are
                raise named(e) from e
            return JoinedWork([w], tensors, named)
        try:
            pg = self._p2p_group(peer, recv, t)
            if not recv:
                return JoinedWork([pg.send([_bytes(t.contiguous())], peer, tag)], tensors, named)
            if t.is_contiguous():
                return JoinedWork([pg.recv([_bytes(t)], peer, tag)], tensors, named)
            buf = t.contiguous()
            _wait(pg.recv([_bytes(buf)], peer, tag))
        except Exception as e:
            raise named(e) from e
        t.copy_(buf)
        w = EventWork(tensors)
        w._finish(None)
        return w

    def _p2p_group(self, peer, recv, t):
        """The inter-host group a send to or receive from peer takes: Gloo's flat group for
        host tensors; for CUDA tensors one NCCL group per direction ("flat" from the lower rank
        to the higher, "down" back). torch hands a Python group's batch_isend_irecv over one op
        at a time (it coalesces a plain ProcessGroup's only), and NCCL pairs a pair's unbatched
        ops in call order on one communicator: two ranks that both send first, as a batch
        may, would pair a send with a send (NCCL's connection setup then reads the peer's
        send handle as a receive handle: "connecting to address with family 0", and worse).
        On a communicator of its own each direction's ops are sends on one side and receives
        on the other, in the order called, whatever the batch's order. NCCL makes a pair's
        communicator at the pair's first op on it, both ranks together, so the pair's first
        op makes both, in one order on both ranks (_p2p_connect)."""
        if t.is_cpu:
            return self._group("flat", "cpu")
        self._meet(peer, t.device)
        sender, receiver = (peer, self._rank) if recv else (self._rank, peer)
        return self._group("flat" if sender < receiver else "down", "cuda")

    def _meet(self, peer, device):
        """Makes the pair's CUDA communicators with peer (_p2p_connect) unless made before."""
        if peer not in self._p2p_peers:
            self._p2p_connect(peer, device)
            self._p2p_peers.add(peer)

    def _p2p_connect(self, peer, device):
        """Makes the pair's NCCL communicators of both directions, the lower rank to the
        higher first, by a byte each way: were each made by the op that first needs it, a
        pair whose ranks both send first would each wait in the making of another one."""
        up, down = self._group("flat", "cuda"), self._group("down", "cuda")
        byte = torch.zeros(1, dtype=torch.uint8, device=device)
        if self._rank < peer:
            works = [up.send([byte], peer, 0), down.recv([byte], peer, 0)]
        else:
            works = [up.recv([byte], peer, 0), down.send([byte], peer, 0)]
        for w in works:
            w.wait()

    def _p2p_failed(self, what):
        """The error a failed send or receive across hosts raises (what names it and the
        peer): the group's, as a collective's (_failed): broken, the lost ranks named."""
        return lambda e: self._failed(what, None, e)

    def _local_pair(self, t, peer):
        """Whether a send or recv of t with peer, a rank of this host, goes through the local
        gosym group: CUDA tensors always (NCCL has no receive from any source) and the rank
        itself (Gloo cannot send to itself); CPU tensors with GOSYM_HIER_CPU_P2P=local only.
        By default they go through Gloo like every other pair's, so that a receive from any
        source, which Gloo takes from whichever pair brings a message first, sees every
        sender: one receive cannot wait on two transports (a receive posted to Gloo cannot be
        taken back once another transport's message arrived first)."""
        return self._cpu_p2p_local or peer == self._rank or not t.is_cpu

    def send(self, tensors, dstRank, tag):  # noqa: N803 - torch's names
        return self._p2p_or_held("send", tensors, dstRank, tag, False)

    def recv(self, tensors, srcRank, tag):  # noqa: N803
        return self._p2p_or_held("recv", tensors, srcRank, tag, True)

    # ---- batches (torch's batch_isend_irecv) -------------------------------------------

    # torch's batch_isend_irecv hands a batch to a backend that supports coalescing as one
    # (start_coalescing, the ops, end_coalescing), and to any other op by op
    supports_coalescing = True
    _batch = None  # the sends and receives held since start_coalescing
    _batch_colls = ()  # the Works of the coalesced collectives posted since (_in_batch)

    def _in_batch(self, work):
        """work, of a coalesced collective (all_reduce, all_gather_into_tensor or
        reduce_scatter_tensor: torch's _coalescing_manager gathers those of its body into
        one call), joined to the open batch's Work too: the manager keeps the batch's Work
        (end_coalescing's) in its place, as ProcessGroupNCCL's covers the whole group."""
        if self._batch is not None and work is not None:
            self._batch_colls.append(work)
        return work

    def _p2p_or_held(self, what, tensors, peer, tag, recv):
        """A send or recv posted now, or, inside a batch, checked now and held for
        end_coalescing: its Work joins the op's once the batch is posted."""
        if self._batch is None:
            return self._p2p(what, tensors, peer, tag, recv)
        peer = self._peer(peer, what)
        _one(tensors, what)
        held = JoinedWork([], tensors)
        self._batch.append((what, tensors, peer, tag, recv, held))
        return held

    def start_coalescing(self):
        """Opens a batch: the sends and receives posted until end_coalescing are held, so
        that the batch's first contacts across hosts are made before any of its ops runs
        (end_coalescing). Collectives posted meanwhile (_coalescing_manager's own
        *_coalesced calls) run as they come."""
        if self._batch is not None:
            raise ValueError("gosym: start_coalescing: a batch is already open on this group")
        self._batch, self._batch_colls = [], []

    def end_coalescing(self):
        """Posts the batch's sends and receives in their order and returns one Work for all.
        First, every CUDA peer across hosts that this rank has not met yet is met
        (_p2p_connect), in ascending rank order, before any op of the batch is posted. Made
        op by op, a first contact could wait on a receive of the batch already spinning on
        the GPU: NCCL's making of a communicator waits for the device while a gosym kernel
        of the process spins (session 52's probe: rank 0's first contact with rank 2 took
        the 8 s that its receive from rank 1 spun; its setup's stream sync waited), and in a
        batch where rank 1 sends to rank 0 only after its own first contacts, one of which
        needs rank 0, that is a cycle (session 51's conformance batch at 2 x 2 hung). In
        ascending order on every rank, the pair made first among those left is one whose
        ranks both come to it: no cycle."""
        batch, colls, self._batch, self._batch_colls = self._batch, self._batch_colls, None, ()
        if batch is None:
            raise ValueError("gosym: end_coalescing without start_coalescing")
        meet = {}  # peer -> device
        for what, ts, peer, _, _, _ in batch:
            t = _one(ts, what)
            if not t.is_cpu and self._where[peer][0] != self._host and peer not in self._p2p_peers:
                meet.setdefault(peer, t.device)
        for peer in sorted(meet):
            self._usable("send/recv")
            try:
                self._meet(peer, meet[peer])
            except Exception as e:
                raise self._p2p_failed(f"first contact with rank {peer}")(e) from e
        works = []
        for what, tensors, peer, tag, recv, held in batch:
            w = self._p2p(what, tensors, peer, tag, recv)
            held._works.append(w)
            works.append(w)
        return JoinedWork(colls + works, [t for _, ts, _, _, _, _ in batch for t in ts])

    def recv_anysource(self, tensors, tag):
        """recv from any source (dist.recv(t) without src) into a CPU tensor: Gloo's own
        receive from any source on the flat group (its Work's _source_rank() is the sender's
        group rank), which every CPU send to this rank takes (_local_pair). With
        GOSYM_HIER_CPU_P2P=local a rank that shares its host gets NotImplementedError saying
        so: its host's senders then use the local gosym group."""
        t = _anysource.host_tensor(tensors)
        if self._n > 1 and self._cpu_p2p_local:
            mates = [r for r in self._hosts[self._host] if r != self._rank]
            raise NotImplementedError(
                f"gosym: recv from any source on a group across hosts with "
                f"GOSYM_HIER_CPU_P2P=local needs the receiving rank alone on its host, and rank "
                f"{self._rank} shares host {self._host} with ranks {mates}: their sends travel "
                "through gosym's group of the host, those of other hosts through Gloo, and one "
                "receive cannot wait on both. Pass src, or leave GOSYM_HIER_CPU_P2P unset (gloo)")
        self._usable("recv")
        pg = self._group("flat", "cpu")
        named = self._p2p_failed("recv from any source")
        try:
            if not t.numel():
                # Gloo's own refuses an empty buffer (an enforce in its unbound buffer: "offset
                # < this->size. 0 vs 0"; gosym's host engine takes it): one byte of scratch
                # takes the sender's empty message (Gloo accepts a message shorter than the
                # buffer)
                return JoinedWork([pg.recv_anysource([torch.empty(1, dtype=torch.uint8)], tag)],
                                  tensors, named)
            if t.is_contiguous():
                return JoinedWork([pg.recv_anysource([_bytes(t)], tag)], tensors, named)
            buf = t.contiguous()
            w = pg.recv_anysource([_bytes(buf)], tag)
            w.wait()
        except Exception as e:
            raise named(e) from e
        t.copy_(buf)
        return _Received(tensors, w._source_rank())

    def barrier(self, opts=None):
        """Every host's ranks meet, then the leaders, then every host's again; a group that
        ran CUDA ops first waits for its device, as NCCL's barrier does, and host ops issued
        flat and still running finish first, as Gloo's barrier waits for the work before it
        (the ops posted to the worker run before the barrier in any case)."""
        opts = opts or _c10d.BarrierOptions()
        if self._cuda is not None:
            torch.cuda.synchronize(self._cuda)
        self._wait_flat_host()

        def run(dev):
            if self._n > 1:
                _wait(self._local.barrier(_opts(_c10d.BarrierOptions)))
            if self._lidx == 0:
                _wait(self._group("rail", "cpu").barrier(_opts(_c10d.BarrierOptions)))
            if self._n > 1:
                _wait(self._local.barrier(_opts(_c10d.BarrierOptions)))

        return self._post("barrier", [], [], run, opts.asyncOp)

    # monitored_barrier's tags: Gloo (the flat group's sends) takes tags in [0, 2^31), so not
    # the negative ones of one host; the top 2^24 of that range are kept for it
    _monitored_tag_base = (1 << 31) - (1 << 24)

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """gloo's monitored barrier over this group's send/recv (gosym.monitored), as on one
        host: the ranks that did not arrive are named on rank 0, the others are told."""
        self._usable("monitored_barrier")
        _monitored.monitored_barrier(self, timeout, wait_all_ranks)


_profiling.instrument(HierGroup, skip=_forms.FORMS)  # forms' wrapper records their ranges
_forms.accept(HierGroup, _profiling.hook)
