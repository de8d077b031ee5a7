"""Where a group's CUDA ops go on this rank: collectives on the caller's current stream,
sends and receives on the group's internal streams, each enqueued when it is posted, as
NCCL enqueues them.

The launch policy stays in Python: it needs torch's Stream and Event objects, the caching
allocator's record_stream, and the order of the caller's posts, none of which the engine sees.
"""

from __future__ import annotations

import collections
import weakref

import torch

from . import _lib, descriptors
from . import selfp2p as _selfp2p
from ._dtypes import move_dtype
from ._tensors import _check
from .work import CudaSideWork, cuda_work

_run = _lib.run
_STREAM_AT = _lib.STREAM_AT
_tail = _lib.stream_tail
SelfPost = collections.namedtuple("SelfPost", "recv tag")  # a pending op with this rank itself
_capturing = torch.cuda.is_current_stream_capturing
# The caller's current CUstream of a device, as an int (no Stream object built). Looked up,
# not called, at import: querying CUDA here would initialise it before a fork.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


_by_raw = {}  # (raw stream, device) -> a torch Stream object of it, for record_stream


def stream_of(raw, idx):
    """A torch Stream object of raw stream raw on device idx (cached: built once): torch's
    own object when raw is the current stream, else an ExternalStream. To the caching
    allocator an ExternalStream of a stream it knows is another stream: a tensor allocated
    on the current stream and recorded on such an object is held back until an event on it
    completes (an event recorded per tensor at its free), where recording it on its own
    stream costs nothing."""
    s = _by_raw.get((raw, idx))
    if s is None:
        s = torch.cuda.current_stream(idx)
        if s.cuda_stream != raw:
            s = torch.cuda.ExternalStream(raw, device=idx)
        _by_raw[(raw, idx)] = s
    return s


_loaded = set()  # devices whose copy kernels load_copies has loaded in this process


def load_copies(idx) -> None:
    """Loads, once per process and device, torch's copy kernels that gosym launches around
    its own: a non-contiguous tensor's contiguous copy and its copy-back (the strided
    kernel), and plain copies, aligned and not (each an instantiation per dtype). Under
    CUDA's lazy loading (torch's default) a kernel's first launch loads it, and loading
    waits for the device: with a receive already spinning there until its peer sends, and
    the peer in the same place, the pair deadlocks (the GPU suite's strided send/recv did,
    once receives were enqueued at the call). The engine loads its own modules at setup;
    these are torch's, so they are run once here, before this process's first send or
    receive on the device. Collectives need not wait for it: every rank launches a group's
    collectives in one order, so a kernel that waits for its peers' is never waiting for a
    launch that a load on this rank holds back; a posted receive is."""
    if _capturing():
        return  # the copies would join the graph being captured: a later op loads them
    _loaded.add(idx)
    for dt in _COPY_DTYPES:
        a = torch.empty((4, 3), dtype=dt, device=idx)
        a[:, 0].contiguous()  # strided source, contiguous destination
        a[1:, 0].copy_(a[0])  # contiguous source, strided destination
        flat = a.view(-1)
        flat[:4].copy_(flat[4:8])  # aligned
        flat[1:5].copy_(flat[7:11])  # one element off: the unvectorised instantiation


_COPY_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
                torch.int16, torch.int32, torch.int64, torch.bool, torch.float8_e4m3fn,
                torch.float8_e5m2, torch.complex64, torch.complex128)


def record(tensors, stream) -> None:
    """Marks every CUDA tensor in tensors (nested in lists and tuples) as used on stream,
    as ProcessGroupNCCL does for its collectives' tensors: the caching allocator then
    reuses a block whose tensor the caller drops only once what stream holds now has
    run. Without it, a tensor allocated on another stream (the caller's default stream,
    with the op on a side stream, say) could be handed to a new tensor there, and
    written, while the op still waits for a peer before reading it (the fuzzer found
    this at world 4: a gather's inputs overwritten)."""
    todo = [tensors]
    for x in todo:  # grows as nested lists and tuples are met
        c = x.__class__
        if c is tuple or c is list:
            todo += x
        elif isinstance(x, torch.Tensor) and x.is_cuda:
            x.record_stream(stream)


class CudaStreams:
    """The CUDA side of one ProcessGroupGosym, which holds it: the one device its CUDA ops
    run on (`device`, set by the first), its internal send and receive streams, and the
    sends and receives posted but not launched yet (`pending`)."""

    __slots__ = ("h", "device", "pending", "_pairs", "_group", "_selfq", "_shared")

    def __init__(self, h, group, shared):
        self.h = h  # the group's endpoint; the group zeroes it at shutdown
        self.device = None
        self._shared = shared  # the group's cells for gosym._c10d: [1] is device
        self.pending = []
        self._selfq = {}  # sends to and receives from this rank itself not matched yet
        self._pairs = {}  # (device index, peer) -> (send stream, recv stream)
        # Weak: a dropped group must not wait for the cycle collector to destroy its endpoint.
        self._group = weakref.ref(group)

    def device_error(self):
        """Raises the group's error that the engine holds for its CUDA ops on this rank: a
        peer lost (its watchdog), a kernel's timeout. Host memory only; nothing once the
        group is shut down. Every CUDA Work's wait() calls it."""
        h = self.h
        if h:
            st = _lib.endpoint_device_error(h)
            if st:
                raise _lib.error(st)

    def index(self, idx):
        """idx, checked against the device this group's CUDA ops already run on."""
        if self.device is not None and idx != self.device:
            raise ValueError(f"gosym: group {self._group()._name!r} runs on cuda:{self.device} "
                             f"on this rank; got a tensor on cuda:{idx} (one device per rank "
                             f"and group)")
        return idx

    def post(self, desc, idx):
        """Enqueues a CUDA op: one native call (post, wait, release), since a CUDA op is
        done on the host once it is enqueued on its stream."""
        _run(self.h, desc)
        self.device = self._shared[1] = idx

    def stream(self, idx):
        """The caller's current stream on CUDA device idx (checked against the group's
        device), once the pending sends and receives are launched: where a CUDA
        collective goes. The engine asks the driver whether it is being captured."""
        if idx != self.device:
            self.index(idx)
        if self.pending:
            self.flush()
        return _raw_stream(idx)

    def op(self, desc, out, idx, cb, async_op=True, keep=None):
        """Enqueues one op (its host desc) on CUDA device idx, on the caller's current
        stream; its tensors (keep, out and the copy-backs' temporaries) are recorded on
        that stream, so that none is reused before the op ran (record). Copy-backs into
        non-contiguous outputs are enqueued right after the op. A synchronous caller gets
        None (see ProcessGroupGosym._work)."""
        raw = self.stream(idx)
        self.post(desc[:_STREAM_AT] + _tail(raw, idx, 0), idx)
        record((keep, out, cb), stream_of(raw, idx))
        if cb:
            for t, tmp in cb:
                t.copy_(tmp)
        return cuda_work(out, idx, raw, None, self.device_error) if async_op else None

    def ops(self, built, out, idx):
        """Enqueues several (desc, keep, cb) on CUDA device idx as one Work (see op)."""
        for desc, keep, cb in built:
            self.op(desc, None, idx, cb, False, keep)
        return cuda_work(out, idx, _raw_stream(idx), None, self.device_error)

    def _side(self, idx, recv, peer):
        """The group's internal send (recv False) or receive stream with peer on device
        idx. Sends and receives run there, each after the caller's current stream, not on
        it, one stream per peer and direction, as NCCL's per-pair streams and grouped
        p2p let any order of posts complete: on one stream, the ring isend(next);
        irecv(prev) posted by every rank would queue each receive behind a send that
        waits for the peer's receive once the message outgrows the channel's slots, and
        on one send stream for all peers, all-pairs exchanges posted in rotated orders
        would wait on each other in a cycle."""
        pair = self._pairs.get((idx, peer))
        if pair is None:
            pair = self._pairs[(idx, peer)] = (torch.cuda.Stream(idx), torch.cuda.Stream(idx))
        return pair[recv]

    def p2p(self, recv, t, peer, tag, out):
        """A CUDA send (recv False) or recv, to run on the group's internal stream for it
        after the caller's current stream as it is now (an event: capture-legal). Its
        Work's wait() makes the caller's current stream wait for it, as
        ProcessGroupNCCL's do.

        The kernel is enqueued here, before this returns, as NCCL enqueues at the call:
        a caller that posts and then only synchronises the device (or drops the Work)
        gets the transfer. A launched receive spins on the GPU until its peer sends, so
        nothing of gosym's may load a module while one runs (CUDA's lazy loading waits
        for the device there): the engine loads every module of its own at group setup,
        and torch's copy kernels are loaded here before the first (load_copies).
        Posts that wait on each other (a ring of isend/irecv) complete in any order,
        each pair and direction on its own stream.

        A non-contiguous source is copied on the current stream first; a non-contiguous
        destination is received into a temporary that the internal stream copies back.
        The tensors are recorded on that stream, so the caching allocator does not reuse
        them before it ran."""
        _check(t)
        idx = self.index(t.get_device())
        if idx not in _loaded:
            load_copies(idx)
        if peer is None:  # this rank itself: matched at the flush (gosym.selfp2p)
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(idx))
            w = CudaSideWork(out, idx, self._side(idx, recv, None), self._group())
            self.pending.append((w, SelfPost(recv, tag), ready, t, None))
            self.flush()
            return w
        if not recv:
            buf = t if t.is_contiguous() else t.contiguous()
        else:
            buf = t if t.is_contiguous() else torch.empty_like(
                t, memory_format=torch.contiguous_format)
        code, mult = move_dtype(buf)
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(idx))
        fields = {"dtype": code, "peer": peer, "tag": tag, "count": buf.numel() * mult}
        desc = (descriptors.recv(dst=buf.data_ptr(), **fields) if recv
                else descriptors.send(src=buf.data_ptr(), **fields))
        # The Work holds the group, not this: a pending op keeps the group alive.
        w = CudaSideWork(out, idx, self._side(idx, recv, peer), self._group())
        self.pending.append((w, desc, ready, buf, t if recv and buf is not t else None))
        self.flush()
        return w

    def _to_self(self, w, post, ready, t):
        """Matches a send to or recv from this rank itself with its partner (gosym.selfp2p),
        and copies on the receive's internal stream once both posters' streams reached
        their posts; unmatched, it waits for its partner's flush."""
        other = _selfp2p.pair_up(self._selfq, post.recv, (w, ready, t), post.tag)
        if other is None:
            return
        mine = (w, ready, t)
        (sw, sready, src), (rw, rready, dst) = (other, mine) if post.recv else (mine, other)
        sw._err = rw._err = _selfp2p.mismatch(src, dst, post.tag)
        if sw._err is not None:
            return
        side = rw._side
        side.wait_event(sready)
        side.wait_event(rready)
        with torch.cuda.stream(side):
            dst.copy_(src.reshape(dst.shape))
        src.record_stream(side)
        dst.record_stream(side)
        sw._done = rw._done = side.record_event()

    def flush(self):
        """Launches the pending sends and receives (see p2p), then the copy-backs, and
        gives each Work the event its wait() joins. If a launch fails, it and the ops
        after it fail with that error: their wait() raises it, not the caller that
        happened to flush."""
        pending, self.pending = self.pending, []
        if not pending:
            return
        flags = _lib.OP_CAPTURING if _capturing() else 0
        copies = []
        for i, (w, desc, ready, buf, dst) in enumerate(pending):
            if desc.__class__ is SelfPost:
                self._to_self(w, desc, ready, buf)
                continue
            side = w._side
            side.wait_event(ready)
            try:
                self.post(_lib.on_stream(desc, side.cuda_stream, w._idx, flags), w._idx)
            except Exception as e:  # noqa: BLE001 - raised by the failed works' wait()
                for x in pending[i:]:
                    x[0]._err = e
                break
            buf.record_stream(side)
            if dst is None:
                w._done = side.record_event()
            else:
                copies.append((w, buf, dst))
        for w, buf, dst in copies:
            with torch.cuda.stream(w._side):
                dst.copy_(buf)
            dst.record_stream(w._side)
            w._done = w._side.record_event()
