"""ProcessGroupGosym: the torch.distributed process group backed by gosym's engine.

Thin by design: each method validates what is visible locally, turns tensors into
(address, element count, dtype), packs one gosym_op_desc and posts it. Collective
algorithms, cross-rank checks and deadlines live in the engine.

Non-contiguous inputs are read through a contiguous copy; non-contiguous outputs
are written into a contiguous temporary that is copied back when the operation
completes (in Work.wait() or on the completer thread), so results appear at the
same moment as for contiguous outputs.

CUDA tensors are stream-ordered like NCCL: the engine enqueues a collective on the
caller's current stream before the call returns, so the Work is complete on the host
at once and the stream carries the ordering. send/recv run on the group's internal
send and receive streams, after the caller's stream, and their Work's wait() joins the
caller's stream back. A group runs on one CUDA device per rank: the device of its
first CUDA op.

Beside this module: tensor checks and marshalling in _tensors, descriptors in descriptors,
the endpoint's bootstrap in _endpoint, CUDA streams and the send/recv launch in _streams, the
sparse all_reduce in sparse.
"""

from __future__ import annotations

import ctypes
import math
import weakref

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from . import _endpoint, _lib, descriptors
from . import anysource as _anysource
from . import forms as _forms
from . import memory as _memory
from . import monitored as _monitored
from . import profiling as _profiling
from . import selfp2p as _selfp2p
from . import sparse as _sparse
from . import split as _split
from ._dtypes import DTYPES as _DTYPES
from ._dtypes import move_dtype, reduce_op, reduce_types
from ._streams import CudaStreams, _raw_stream
from ._streams import stream_of as _stream_of
from ._tensors import (_check, _dst, _even_pieces, _in_place_types, _one, _op_device, _pieces,
                       _read_here, _same_dtype, _src)
from .work import Completer, _Op, cuda_work, work_of

_post = _lib.post
_run = _lib.run
_strided = torch.strided
_sparse_coo = torch.sparse_coo
_Tensor = torch.Tensor


def _as_works(built):
    """Two-buffer ops' (desc, src, dst, cb) as _works takes them: (desc, keep, cb)."""
    return [(desc, (src, dst), cb) for desc, src, dst, cb in built]


_AR = _c10d.AllreduceOptions()
_ARC = _c10d.AllreduceCoalescedOptions()
_BC = _c10d.BroadcastOptions()
_RD = _c10d.ReduceOptions()
_AG = _c10d.AllgatherOptions()
_RS = _c10d.ReduceScatterOptions()
_A2A = _c10d.AllToAllOptions()
_GA = _c10d.GatherOptions()
_SC = _c10d.ScatterOptions()
_BA = _c10d.BarrierOptions()


class ProcessGroupGosym(dist.ProcessGroup):
    """A process group whose collectives run on one gosym endpoint.

    Created by torch through the registered "gosym" backend; one endpoint per group.
    """

    # gosym.memory tells a gosym group by this mark (it cannot import this module, which
    # imports it)
    _gosym_endpoint_group = True

    # torch's helpers ask a group for its per-device backend (_get_backend) and read
    # these flags; a Python group is its own backend and supports none of them.
    supports_splitting = True  # dist.split_group: gosym/split.py
    supports_coalescing = False
    supports_time_estimate = False
    supports_shrinking = False

    def __init__(self, store, rank, size, timeout, name, global_ranks=None):
        super().__init__(rank, size)
        self._rank = rank
        self._size = size
        self._timeout = timeout
        self._name = name
        self._desc = "undefined"
        self._global_ranks = list(global_ranks) if global_ranks else list(range(size))
        self._store = store  # split_group's children bootstrap through it
        self._split_count = 0
        self._views = weakref.WeakValueDictionary()  # gosym.contiguous_view's tensors
        self._h = _endpoint.bootstrap(store, rank, size, timeout, name)
        # the endpoint and the CUDA device, as gosym._c10d's backend reads them (gosym.c10d)
        self._shared = (ctypes.c_int64 * 2)(self._h, -1)
        self._streams = CudaStreams(self._h, self, self._shared)
        self._self = None  # host sends to itself not matched yet (selfp2p.HostSelf)
        self._completer = Completer(name)
        self._finalizer = weakref.finalize(self, _endpoint.destroy, self._h, self._completer, name)

    # ---- identity, lifetime -------------------------------------------------

    def getBackendName(self):
        return "gosym"

    # The C++ base keeps a group's name and description in its per-device backends,
    # which a Python group does not have ("ProcessGroup name not set"); torch sets
    # and reads them through these (pg.group_name, functional collectives' lookup).
    def getGroupName(self):
        return self._name

    def setGroupName(self, name):
        self._name = name

    def getGroupDesc(self):
        return self._desc

    def setGroupDesc(self, desc):
        self._desc = desc

    def __repr__(self):
        state = "" if self._h else ", shut down"
        return (f"ProcessGroupGosym(name={self._name!r}, rank={self._rank}, size={self._size}, "
                f"global_ranks={self._global_ranks}{state})")

    def _get_backend(self, device):
        # torch 2.11 calls pg._get_backend(device_id).supports_splitting after the
        # creator returns when a device is bound (init_process_group(device_id=...) and
        # every later new_group); a Python group has no per-device backend registered,
        # so the base method raises "No backend type associated with device type".
        return self

    def supports_tensor_alloc(self, device):
        """CUDA devices: allocate_tensor's buffers are gosym's shareable memory (FSDP2 asks,
        under set_allocate_memory_from_process_group_for_comm)."""
        return _memory.comm_supported(device)

    def allocate_tensor(self, size, *, dtype, device):
        """A 1-D tensor of size elements that this group's large ops read in place once
        bound (gosym.memory.comm_empty); CUDA only, as supports_tensor_alloc says."""
        if not _memory.comm_supported(device):
            raise ValueError(f"gosym: allocate_tensor serves CUDA devices where gosym's shareable "
                             f"memory works, not {device}")
        return _memory.comm_empty(size, dtype, device)

    def eager_connect_single_device(self, device):
        pass  # the endpoint is connected at creation

    # ---- split_group (torch calls these on a backend that supports splitting) ----

    options = None  # no backend options: split_group deep-copies this as the child's

    def split_group(self, ranks, timeout=None, opts=None, group_name=None, group_desc=None):
        return _split.split(self, ranks, timeout, group_name, group_desc)

    def comm_split_count(self):
        return self._split_count

    def perform_nocolor_split(self, device):
        pass  # a rank outside a new group takes no part in its creation

    def _set_sequence_number_for_group(self):
        pass  # sequence numbers are the engine's, per group

    def get_group_store(self):
        return self._store

    def shutdown(self):
        """Destroys the endpoint; outstanding work fails. Idempotent.
        destroy_process_group() calls it; so does garbage collection or exit, via the finalizer.
        CUDA sends and receives still pending are launched first, as a caller that never
        waited for them would expect of any backend."""
        if self._streams.pending and self._h:
            self._streams.flush()
        self._h = self._streams.h = self._shared[0] = 0
        self._finalizer()

    def abort(self):
        self.shutdown()

    def abort_cuda(self, why: str) -> None:
        """Ends this rank's CUDA work on the group at once, as NCCL's abort ends a
        communicator's (gosym_endpoint_abort_cuda): the group breaks with an error quoting
        why, and its kernels, running and enqueued, give up. A group across hosts calls it
        with its NCCL groups' abort, which waits for the device a kernel of this group
        could keep busy (gosym.hier.lifetime._abort_all). Nothing once shut down."""
        if self._h:
            _lib.check(_lib.endpoint_abort_cuda(self._h, why.encode()), "abort_cuda")

    def _endpoint(self) -> int:
        if not self._h:
            raise RuntimeError("gosym: the process group has been shut down")
        return self._h

    def _stats_json(self) -> str:
        if not self._h:
            raise RuntimeError("gosym: the process group has been shut down")
        return _lib.read_string(_lib.endpoint_stats, self._h)

    # ---- plumbing -----------------------------------------------------------

    def _work(self, desc, out, keep, cb, async_op=True):
        """Posts one op. For a synchronous caller (torch's asyncOp false: it waits at once)
        a host op runs in one native call that posts, waits and releases, and its failure
        raises here, where the caller's wait would have raised it. Such a caller gets no
        Work: torch's wrappers skip the wait when there is none, and there is nothing
        left to wait for (a CUDA op is on the caller's current stream)."""
        dev = _op_device(keep)
        if dev >= 0:
            return self._streams.op(desc, out, dev, cb, async_op, keep)
        if not async_op:
            _run(self._h, desc)
            if cb:
                for t, tmp in cb:
                    t.copy_(tmp)
            return None
        return work_of(_Op((_post(self._h, desc),), out, keep, cb or None, self._completer))

    def _works(self, built, out):
        """Posts several (desc, keep, cb) together as one Work."""
        dev = _op_device([k for _, k, _ in built])
        if dev >= 0:
            return self._streams.ops(built, out, dev)
        handles, keep, cb = [], [], []
        try:
            for desc, k, c in built:
                handles.append(_post(self._h, desc))
                keep.append(k)
                cb.extend(c)
        except BaseException:
            # Already-posted parts may still touch their tensors: let them finish.
            self._completer.submit(_Op(tuple(handles), out, keep, None, self._completer))
            raise
        return work_of(_Op(tuple(handles), out, keep, cb or None, self._completer))

    def _root(self, root, what):
        if not 0 <= root < self._size:
            raise ValueError(f"gosym: {what}: root rank {root} is out of range for a group "
                             f"of size {self._size}")
        return root

    def _peer(self, peer, what):
        if not 0 <= peer < self._size:
            raise ValueError(f"gosym: {what}: peer rank {peer} is out of range for a group "
                             f"of size {self._size}")
        return peer

    # ---- ops on one buffer, in place ----------------------------------------

    def _in_place(self, build, t, opts, root, dense=False):
        """The host desc of build's op (descriptors.all_reduce, reduce or broadcast) in
        place on t, the buffer the engine works on and its copy-backs: t itself when dense
        (a contiguous strided tensor, checked by the caller), else what _dst makes of it."""
        cb = []
        buf = t if dense else _dst(t, cb, True)
        code, mult, red, scale = _in_place_types(build, buf, opts)
        desc = build(dtype=code, count=buf.numel() * mult, addr=buf.data_ptr(), red_op=red,
                     scale=scale, root=root)
        return desc, buf, cb

    def _buffer_op(self, build, tensors, opts, root, what):
        """all_reduce, reduce and broadcast (build: the op's builder in descriptors): one
        tensor, in place. A dense contiguous CUDA tensor takes a short path: its desc is
        packed with its stream at once and posted by one native call (small eager CUDA ops
        are bound by the host, where every Python frame shows). On the group's device with
        no CUDA send or receive pending, the common case, that happens right here, with no
        further frame but the builder's (on 2xH200 the frames this skips cost ~0.5 us of a
        ~12 us dist.all_reduce); the first op of a group goes through CudaStreams.op, the
        rest through _work. A synchronous op on a dense host tensor is one native call too
        (post, wait, release)."""
        t = _one(tensors, what)
        dense = t.__class__ is _Tensor and t.layout is _strided and t.is_contiguous()
        if dense and not opts.asyncOp and t.is_cpu:
            # A synchronous host op on a dense tensor: one native call, as the CUDA path's.
            code, mult, red, scale = _in_place_types(build, t, opts)
            _run(self._h, build(code, t.numel() * mult, t.data_ptr(), red, scale, root))
            return None
        fast = dense and t.is_cuda
        streams = self._streams
        if fast and not streams.pending:
            idx = t.get_device()
            if idx == streams.device:
                code, mult, red, scale = _in_place_types(build, t, opts)
                raw = _raw_stream(idx)
                # In build's order (dtype, count, addr, red_op, scale, root, stream, device):
                # eight keywords cost several times the builder's frame (descriptors._in_place).
                _run(self._h, build(code, t.numel() * mult, t.data_ptr(), red, scale, root, raw,
                                    idx))
                t.record_stream(_stream_of(raw, idx))  # as CudaStreams.op (_streams.record)
                if not opts.asyncOp:
                    return None
                return cuda_work(tensors, idx, raw, None, streams.device_error)
        if t.layout is _sparse_coo and build is descriptors.all_reduce:
            return _sparse.sparse_allreduce(self, t, tensors, opts)
        desc, buf, cb = self._in_place(build, t, opts, root, fast)
        if not fast:
            return self._work(desc, tensors, buf, cb, opts.asyncOp)
        return streams.op(desc, tensors, t.get_device(), None, opts.asyncOp, t)

    def _short_pair(self, output, input):  # noqa: A002 - torch's names
        """The CUDA device of a two-buffer op (all_gather_into_tensor, reduce_scatter_tensor,
        all_to_all_single) whose tensors take the short path: dense,
        contiguous, of one dtype, on the group's device with no CUDA send or receive
        pending; else -1. The caller then posts the desc with the stream at once (_pair_now,
        if the engine knows the dtype) by one native call, with no frame of the
        general path (_pair_op, CudaStreams.op, record's walk), as all_reduce's
        (_buffer_op): FSDP2's all_gather and reduce_scatter are small eager ops as often
        as not."""
        if (output.__class__ is _Tensor and input.__class__ is _Tensor and input.is_cuda
                and input.layout is _strided and output.layout is _strided
                and input.dtype is output.dtype and input.is_contiguous()
                and output.is_contiguous()):
            streams = self._streams
            idx = input.get_device()
            if idx == streams.device and not streams.pending and output.get_device() == idx:
                return idx
        return -1

    def _pair_now(self, output, input, idx, async_op, build, *fields):  # noqa: A002
        """The short path's post: build's desc (its fields, then the caller's stream and
        device idx) in one native call, both tensors recorded on that stream (as
        _streams.record), the Work of an asynchronous caller."""
        raw = _raw_stream(idx)
        _run(self._h, build(*fields, raw, idx))
        s = _stream_of(raw, idx)
        input.record_stream(s)
        output.record_stream(s)
        return cuda_work([output], idx, raw, None, self._streams.device_error) if async_op else None

    def _pair_op(self, desc, src, dst, cb, out, async_op, pieces=()):
        """A two-buffer op (all_gather_into_tensor, reduce_scatter_tensor,
        all_to_all_single) given its host desc: src is read, dst written, cb dst's
        copy-back, pieces the arrays the desc points to. Buffers on one CUDA device with
        no copy-back, the common case, go straight to the caller's stream (the engine is
        done with the arrays when it returns); the rest goes through _work."""
        if not cb and src.is_cuda:
            idx = src.get_device()
            if dst.get_device() == idx:
                return self._streams.op(desc, out, idx, None, async_op, (src, dst))
        return self._work(desc, out, (src, dst, *pieces), cb, async_op)

    def allreduce(self, tensors, opts=_AR):
        return self._buffer_op(descriptors.all_reduce, tensors, opts, 0, "allreduce")

    def reduce(self, tensors, opts=_RD):
        root = self._root(opts.rootRank, "reduce")
        return self._buffer_op(descriptors.reduce, tensors, opts, root, "reduce")

    def allreduce_coalesced(self, tensors, opts=_ARC):
        """One allreduce over the tensors packed into one buffer, unpacked on completion."""
        if not tensors:
            return work_of(_Op((), tensors, None, None, self._completer))
        first = tensors[0]
        for t in tensors:
            _check(t)
            _same_dtype(first, t, "allreduce_coalesced")
        flat = torch.cat([t.reshape(-1) for t in tensors])
        cb, off = [], 0
        for t in tensors:
            n = t.numel()
            cb.append((t, flat[off:off + n].view(t.shape)))
            off += n
        desc, buf, _ = self._in_place(descriptors.all_reduce, flat, opts, 0)
        return self._work(desc, tensors, buf, cb, opts.asyncOp)

    def broadcast(self, tensors, opts=_BC):
        root = self._root(opts.rootRank, "broadcast")
        if opts.rootTensor != 0:
            raise ValueError(f"gosym: broadcast: rootTensor must be 0, got {opts.rootTensor}")
        return self._buffer_op(descriptors.broadcast, tensors, opts, root, "broadcast")

    # ---- allgather ------------------------------------------------------------

    def _allgather_desc(self, outs, t):
        world = self._size
        if len(outs) != world:
            raise ValueError(f"gosym: all_gather: output list has {len(outs)} tensors, the "
                             f"group has {world} ranks")
        src = _src(t)
        code, mult = move_dtype(src)
        n = src.numel()
        cb, bufs, pairs = [], [], []
        for o in outs:
            _same_dtype(t, o, "all_gather")
            if o.numel() != n:
                raise ValueError(f"gosym: all_gather: output tensor has {o.numel()} elements, "
                                 f"the input has {n}")
            d = _dst(o, cb, False)
            bufs.append(d)
            pairs += (d.data_ptr(), n * mult)
        arr, ap = _pieces(pairs)
        desc = descriptors.all_gather(dtype=code, count=n * mult, src=src.data_ptr(),
                                      out_pieces=ap, n_out=world)
        return desc, (src, bufs, arr), cb

    def allgather(self, output_tensors, input_tensors, opts=_AG):
        outs = _one(output_tensors, "all_gather")
        t = _one(input_tensors, "all_gather")
        if len(outs) == self._size and any(o.numel() != t.numel() for o in outs):
            return self._allgather_v(outs, t)
        desc, keep, cb = self._allgather_desc(outs, t)
        # The future's value is the gathered list, as gloo's (not the list of lists).
        return self._work(desc, outs, keep, cb, opts.asyncOp)

    def _allgather_v(self, outs, t):
        """all_gather into outputs of unequal sizes, output j as long as rank j's input (NCCL's
        all_gather_v, which torch reaches through allgather): as NCCL does it, a broadcast
        from each rank, all posted as one Work."""
        mine = outs[self._rank]
        if mine.numel() != t.numel():
            raise ValueError(f"gosym: all_gather: this rank's output tensor has {mine.numel()} "
                             f"elements, its input has {t.numel()}")
        for o in outs:
            _same_dtype(t, o, "all_gather")
        mine.copy_(t)  # on a CUDA tensor's current stream, before the broadcasts
        _read_here(t)
        return self._works([self._in_place(descriptors.broadcast, o, _BC, j)
                            for j, o in enumerate(outs)], outs)

    def allgather_coalesced(self, output_lists, input_list, opts=_AG):
        """torch's layout: one output list per rank, output_lists[r][i] is rank r's input i."""
        world, n = self._size, len(input_list)
        if len(output_lists) != world or any(len(o) != n for o in output_lists):
            raise ValueError(f"gosym: all_gather_coalesced: expected {world} output lists (one "
                             f"per rank) of {n} tensors (one per input), got "
                             f"{[len(o) for o in output_lists]}")
        built = [self._allgather_desc([o[i] for o in output_lists], t)
                 for i, t in enumerate(input_list)]
        return self._works(built, output_lists)

    def _allgather_base_desc(self, out, inp):
        """all_gather_into_tensor's desc, buffers and copy-backs (as _pair_op takes them)."""
        world = self._size
        _same_dtype(inp, out, "all_gather_into_tensor")
        src = _src(inp)
        n = src.numel()
        if out.numel() != n * world:
            raise ValueError(f"gosym: all_gather_into_tensor: output has {out.numel()} "
                             f"elements, expected world size {world} x input {n}")
        cb = []
        dst = _dst(out, cb, False)
        code, mult = move_dtype(src)
        desc = descriptors.all_gather(dtype=code, count=n * mult, src=src.data_ptr(),
                                      dst=dst.data_ptr())
        return desc, src, dst, cb

    def _allgather_base(self, output, input, opts=_AG):  # noqa: A002 - torch's names
        idx = self._short_pair(output, input)
        if idx >= 0:
            code, n = _DTYPES.get(input.dtype), input.numel()
            if code is not None and output.numel() == n * self._size:
                return self._pair_now(output, input, idx, opts.asyncOp, descriptors.all_gather_on,
                                      code, n, input.data_ptr(), output.data_ptr())
        return self._pair_op(*self._allgather_base_desc(output, input), [output], opts.asyncOp)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=_AG):
        if len(outputs) != len(inputs):
            raise ValueError(f"gosym: all_gather_into_tensor_coalesced: {len(outputs)} "
                             f"outputs for {len(inputs)} inputs")
        built = [self._allgather_base_desc(o, i) for o, i in zip(outputs, inputs)]
        return self._works(_as_works(built), outputs)

    # ---- reduce-scatter ---------------------------------------------------------

    def reduce_scatter(self, output_tensors, input_lists, opts=_RS):
        world = self._size
        out = _one(output_tensors, "reduce_scatter")
        ins = _one(input_lists, "reduce_scatter")
        if len(ins) != world:
            raise ValueError(f"gosym: reduce_scatter: input list has {len(ins)} tensors, the "
                             f"group has {world} ranks")
        if any(t.numel() != out.numel() for t in ins):
            return self._reduce_scatter_v(out, ins, opts)
        red, scale = reduce_op(opts.reduceOp)
        code, mult = reduce_types(out, red)
        n = out.numel()
        srcs, pairs = [], []
        for t in ins:
            _same_dtype(out, t, "reduce_scatter")
            if t.numel() != n:
                raise ValueError(f"gosym: reduce_scatter: input tensor has {t.numel()} "
                                 f"elements, the output has {n}")
            s = _src(t)
            srcs.append(s)
            pairs += (s.data_ptr(), n * mult)
        arr, ap = _pieces(pairs)
        cb = []
        dst = _dst(out, cb, False)
        desc = descriptors.reduce_scatter(dtype=code, red_op=red, scale=scale, count=n * mult,
                                          dst=dst.data_ptr(), in_pieces=ap, n_in=world)
        return self._work(desc, output_tensors, (srcs, dst, arr), cb, opts.asyncOp)

    def _reduce_scatter_v(self, out, ins, opts):
        """reduce_scatter from inputs of unequal sizes, input j as long as rank j's output
        (NCCL's reduce_scatter_v): as NCCL does it, a reduce to each rank, all posted as one
        Work, here on copies of the inputs (a reduce works in place); this rank's result is
        copied into out once done."""
        mine = ins[self._rank]
        if mine.numel() != out.numel():
            raise ValueError(f"gosym: reduce_scatter: this rank's input tensor has "
                             f"{mine.numel()} elements, its output has {out.numel()}")
        built = []
        for j, t in enumerate(ins):
            _same_dtype(out, t, "reduce_scatter")
            buf = t.clone(memory_format=torch.contiguous_format)
            _read_here(t)
            desc, buf, cb = self._in_place(descriptors.reduce, buf, opts, j, True)
            if j == self._rank:
                cb = [(out, buf.view(out.shape))]
            built.append((desc, buf, cb))
        return self._works(built, [out])

    def _reduce_scatter_base_desc(self, out, inp, opts):
        """reduce_scatter_tensor's desc, buffers and copy-backs (as _pair_op takes them)."""
        world = self._size
        _same_dtype(out, inp, "reduce_scatter_tensor")
        red, scale = reduce_op(opts.reduceOp)
        code, mult = reduce_types(out, red)
        n = out.numel()
        if inp.numel() != n * world:
            raise ValueError(f"gosym: reduce_scatter_tensor: input has {inp.numel()} "
                             f"elements, expected world size {world} x output {n}")
        src = _src(inp)
        cb = []
        dst = _dst(out, cb, False)
        desc = descriptors.reduce_scatter(dtype=code, red_op=red, scale=scale, count=n * mult,
                                          src=src.data_ptr(), dst=dst.data_ptr())
        return desc, src, dst, cb

    def _reduce_scatter_base(self, output, input, opts=_RS):  # noqa: A002
        idx = self._short_pair(output, input)
        if idx >= 0:
            code, n = _DTYPES.get(output.dtype), output.numel()
            if code is not None and input.numel() == n * self._size:
                red, scale = reduce_op(opts.reduceOp)
                return self._pair_now(output, input, idx, opts.asyncOp,
                                      descriptors.reduce_scatter_on, code, red, scale, n,
                                      input.data_ptr(), output.data_ptr())
        built = self._reduce_scatter_base_desc(output, input, opts)
        return self._pair_op(*built, [output], opts.asyncOp)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=_RS):
        if len(outputs) != len(inputs):
            raise ValueError(f"gosym: reduce_scatter_tensor_coalesced: {len(outputs)} "
                             f"outputs for {len(inputs)} inputs")
        built = [self._reduce_scatter_base_desc(o, i, opts) for o, i in zip(outputs, inputs)]
        return self._works(_as_works(built), outputs)

    # ---- all-to-all -------------------------------------------------------------

    def _splits(self, rows, splits, what):
        """splits (rows per rank along dim 0), checked against the rows of the tensor."""
        world = self._size
        if len(splits) != world:
            raise ValueError(f"gosym: all_to_all_single: {len(splits)} {what} splits for "
                             f"{world} ranks")
        if min(splits) < 0:
            raise ValueError(f"gosym: all_to_all_single: {what} splits {list(splits)} contain "
                             f"a negative size")
        if sum(splits) != rows:
            raise ValueError(f"gosym: all_to_all_single: {what} splits {list(splits)} do not "
                             f"sum to dim 0 ({rows})")
        return splits

    def _even_count(self, t, what):
        """Elements per rank of t split equally along dim 0."""
        world = self._size
        rows = t.size(0) if t.dim() else 1
        if rows % world:
            raise ValueError(f"gosym: all_to_all_single: {what} dim 0 ({rows}) is not "
                             f"divisible by the world size {world}")
        return t.numel() // world

    def _a2a_pieces(self, t, splits, what, mult):
        """all_to_all_single's pieces of t along dim 0 (equal when splits is empty)."""
        if not splits:
            n = self._even_count(t, what)
            return _even_pieces(t.data_ptr(), n * t.element_size(), n * mult, self._size)
        rows = t.size(0) if t.dim() else 1
        row = t.numel() // rows if rows else math.prod(t.shape[1:])  # elements per row
        isz = t.element_size()
        addr, pairs = t.data_ptr(), []
        for r in self._splits(rows, splits, what):
            pairs += (addr, r * row * mult)
            addr += r * row * isz
        return _pieces(pairs)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes,  # noqa: A002
                      opts=_A2A):
        idx = self._short_pair(output, input)
        code = _DTYPES.get(input.dtype) if idx >= 0 else None
        if code is not None:
            if not input_split_sizes and not output_split_sizes:
                world, n = self._size, input.numel()
                if (input.dim() and output.dim() and not input.size(0) % world
                        and not output.size(0) % world and output.numel() == n):
                    return self._pair_now(output, input, idx, opts.asyncOp,
                                          descriptors.all_to_all_on, code, n // world,
                                          input.data_ptr(), output.data_ptr())
            else:
                # Splits (MoE's dispatch): the same short path, the pieces built here; their
                # arrays live in this frame until the engine, which reads them, returns.
                in_arr, ip = self._a2a_pieces(input, input_split_sizes, "input", 1)
                out_arr, op = self._a2a_pieces(output, output_split_sizes, "output", 1)
                return self._pair_now(output, input, idx, opts.asyncOp,
                                      descriptors.all_to_all_v_on, code, ip, op, self._size)
        _same_dtype(input, output, "all_to_all_single")
        src = _src(input)
        cb = []
        dst = _dst(output, cb, False)
        code, mult = move_dtype(src)
        if not input_split_sizes and not output_split_sizes:
            n = self._even_count(src, "input")
            if self._even_count(dst, "output") == n:  # the engine splits both buffers
                desc = descriptors.all_to_all(dtype=code, count=n * mult, src=src.data_ptr(),
                                              dst=dst.data_ptr())
                return self._pair_op(desc, src, dst, cb, [output], opts.asyncOp)
        in_arr, ip = self._a2a_pieces(src, input_split_sizes, "input", mult)
        out_arr, op = self._a2a_pieces(dst, output_split_sizes, "output", mult)
        desc = descriptors.all_to_all_v(dtype=code, in_pieces=ip, out_pieces=op, world=self._size)
        return self._pair_op(desc, src, dst, cb, [output], opts.asyncOp, (in_arr, out_arr))

    def alltoall(self, output_tensors, input_tensors, opts=_A2A):
        world = self._size
        if len(output_tensors) != world or len(input_tensors) != world:
            raise ValueError(f"gosym: all_to_all: {len(output_tensors)} outputs and "
                             f"{len(input_tensors)} inputs for {world} ranks")
        first = input_tensors[0]
        code, mult = move_dtype(first)
        cb, srcs, dsts, ins, outs = [], [], [], [], []
        for t in input_tensors:
            _same_dtype(first, t, "all_to_all")
            s = _src(t)
            srcs.append(s)
            ins += (s.data_ptr(), s.numel() * mult)
        for t in output_tensors:
            _same_dtype(first, t, "all_to_all")
            d = _dst(t, cb, False)
            dsts.append(d)
            outs += (d.data_ptr(), d.numel() * mult)
        in_arr, ip = _pieces(ins)
        out_arr, op = _pieces(outs)
        desc = descriptors.all_to_all_v(dtype=code, in_pieces=ip, out_pieces=op, world=world)
        return self._work(desc, output_tensors, (srcs, dsts, in_arr, out_arr), cb, opts.asyncOp)

    # ---- rooted data movement -------------------------------------------------------

    def gather(self, output_tensors, input_tensors, opts=_GA):
        world = self._size
        root = self._root(opts.rootRank, "gather")
        src = _src(_one(input_tensors, "gather"))
        code, mult = move_dtype(src)
        n = src.numel()
        cb, bufs, arr, ap, n_out = [], [], None, 0, 0
        if self._rank == root:
            outs = _one(output_tensors, "gather")
            if len(outs) != world:
                raise ValueError(f"gosym: gather: gather list has {len(outs)} tensors, the "
                                 f"group has {world} ranks")
            pairs = []
            for o in outs:
                _same_dtype(src, o, "gather")
                if o.numel() != n:
                    raise ValueError(f"gosym: gather: output tensor has {o.numel()} "
                                     f"elements, the input has {n}")
                d = _dst(o, cb, False)
                bufs.append(d)
                pairs += (d.data_ptr(), n * mult)
            arr, ap = _pieces(pairs)
            n_out = world
        desc = descriptors.gather(dtype=code, root=root, count=n * mult, src=src.data_ptr(),
                                  out_pieces=ap, n_out=n_out)
        out = output_tensors[0] if self._rank == root else output_tensors  # as gloo's future
        return self._work(desc, out, (src, bufs, arr), cb, opts.asyncOp)

    def scatter(self, output_tensors, input_tensors, opts=_SC):
        world = self._size
        root = self._root(opts.rootRank, "scatter")
        out = _one(output_tensors, "scatter")
        cb = []
        dst = _dst(out, cb, False)
        code, mult = move_dtype(dst)
        n = dst.numel()
        srcs, arr, ip, n_in = [], None, 0, 0
        if self._rank == root:
            ins = _one(input_tensors, "scatter")
            if len(ins) != world:
                raise ValueError(f"gosym: scatter: scatter list has {len(ins)} tensors, the "
                                 f"group has {world} ranks")
            pairs = []
            for t in ins:
                _same_dtype(out, t, "scatter")
                if t.numel() != n:
                    raise ValueError(f"gosym: scatter: input tensor has {t.numel()} "
                                     f"elements, the output has {n}")
                s = _src(t)
                srcs.append(s)
                pairs += (s.data_ptr(), n * mult)
            arr, ip = _pieces(pairs)
            n_in = world
        desc = descriptors.scatter(dtype=code, root=root, count=n * mult, dst=dst.data_ptr(),
                                   in_pieces=ip, n_in=n_in)
        return self._work(desc, output_tensors, (srcs, dst, arr), cb, opts.asyncOp)

    # ---- point to point, barrier ------------------------------------------------------

    def send(self, tensors, dstRank, tag):  # noqa: N803 - torch's names
        peer = self._peer(dstRank, "send")
        t = _one(tensors, "send")
        if peer == self._rank:
            return self._to_self(False, t, tag, tensors)
        if isinstance(t, _Tensor) and t.is_cuda:
            return self._streams.p2p(False, t, peer, tag, tensors)
        src = _src(t)
        code, mult = move_dtype(src)
        desc = descriptors.send(dtype=code, peer=peer, tag=tag, count=src.numel() * mult,
                                src=src.data_ptr())
        return self._work(desc, tensors, src, None)

    def recv(self, tensors, srcRank, tag):  # noqa: N803
        peer = self._peer(srcRank, "recv")
        t = _one(tensors, "recv")
        if peer == self._rank:
            return self._to_self(True, t, tag, tensors)
        if isinstance(t, _Tensor) and t.is_cuda:
            return self._streams.p2p(True, t, peer, tag, tensors)
        cb = []
        dst = _dst(t, cb, False)
        code, mult = move_dtype(dst)
        desc = descriptors.recv(dtype=code, peer=peer, tag=tag, count=dst.numel() * mult,
                                dst=dst.data_ptr())
        return self._work(desc, tensors, dst, cb)

    def _to_self(self, recv, t, tag, out):
        """A send to or recv from this rank itself (gosym.selfp2p): a CUDA one goes with the
        group's other pending sends and receives, a host one is matched here."""
        if t.is_cuda:
            return self._streams.p2p(recv, t, None, tag, out)
        _check(t)
        if self._self is None:
            self._self = _selfp2p.HostSelf(self._timeout)
        return self._self.post(recv, t, tag, out)

    def recv_anysource(self, tensors, tag):
        """A host receive from any rank (gosym.anysource); its Work's _source_rank() is the sender."""
        return _anysource.recv_anysource(self, tensors, tag)

    def barrier(self, opts=_BA):
        """On a CUDA device (opts.device, else the device this group's CUDA ops run on, as
        ProcessGroupNCCL picks it) a stream-ordered barrier kernel whose wait() blocks until
        every rank's stream reached it; otherwise a host barrier."""
        idx = self._barrier_device(opts)
        if idx is None:
            return self._host_barrier(opts.asyncOp)
        raw = _raw_stream(idx)
        streams = self._streams
        if streams.pending:
            streams.flush()
        streams.post(descriptors.barrier(stream=raw, device=idx), streams.index(idx))
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(idx))  # the stream raw names
        return cuda_work([], idx, raw, ev, streams.device_error)

    def _device_error(self):
        """Raises the error this group's CUDA ops have on this rank (a peer that did not
        arrive in time, or was lost); call it after waiting on the GPU."""
        self._streams.device_error()

    def _barrier_device(self, opts):
        d = opts.device
        if d is not None and d.type == "cuda":
            idx = d.index if d.index is not None else torch.cuda.current_device()
            return self._streams.index(idx)
        if opts.device_ids:
            return self._streams.index(opts.device_ids[0])
        return self._streams.device

    def _host_barrier(self, async_op=True):
        return self._work(descriptors.barrier(), [], None, None, async_op)

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """gloo's monitored barrier over send/recv (gosym.monitored): fails once timeout
        (None: the group's) has passed, at once for 0, naming the ranks that did not arrive."""
        _monitored.monitored_barrier(self, timeout, wait_all_ranks)


_profiling.instrument(ProcessGroupGosym, skip=_forms.FORMS)  # forms' wrapper records their ranges
_forms.accept(ProcessGroupGosym, _profiling.hook)
