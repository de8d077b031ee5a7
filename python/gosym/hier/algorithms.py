"""The paths of a HierGroup's reductions, broadcasts and gathers between hosts, and the
choice between them and the flat group (gosym.hier.schedule).

Flat: the inter-host engine's own op on the flat group of every rank. Hierarchical, through
the leaders (any hosts): a host's ranks meet at its local index 0, the leaders (rail 0) run
the inter-host step, and local index 0 hands the result on to its host; along the rails
(hosts of equal rank counts, at least GOSYM_HIER_RAIL_MIN bytes): every local index moves 1/n
of the data between hosts over its own rail, all_reduce pipelined in chunks of
GOSYM_HIER_CHUNK bytes.
"""

from __future__ import annotations

import datetime

import torch
from torch._C import _distributed_c10d as _c10d

from . import schedule
from .. import memory
from .lifetime import HierBase
from .._errors import DistBackendError
from .._tensors import _op_device
from ..work import EventWork
from .tensors import (_WIRE, _bytes, _divide, _fold, _fold_hosts, _opts, _red_wire, _rows,
                      _split_op, _wait)


GENERAL = object()  # _flat_now's answer where the op takes the general path
# how long a synchronous flat host op waits before it looks for the watch's news (_wait_flat;
# gosym._c10d.Hier's kHostSlice)
_SLICE = datetime.timedelta(milliseconds=100)
# the most bytes a rank keeps mapped for what its all_gather and all_to_all receive from the
# other hosts (_received): larger ops stage it, as before session 45
ROWS_MAPPED_MAX = 64 << 20


def _same(t):
    return t


def _flat(t):
    return t if t.dim() == 1 else t.view(-1)  # a view costs more than the test


def _raise(e):
    raise e


class HierAlgorithms(HierBase):
    """The rail and leader algorithms of a HierGroup, on contiguous 1-D buffers, run as an
    op's steps (on the worker thread, or at once for CUDA ops)."""

    # ---- the choice -----------------------------------------------------------------

    def _path(self, op, nbytes, dev):
        """schedule.choose for op of nbytes on dev on this group (its shape, GOSYM_HIER_CHOICE
        and link)."""
        return schedule.choose(dev, op, nbytes, self._shape, self._choice, link_key=self._link)

    def _hier(self, op, nbytes, dev):
        """Whether op (gosym.hier.schedule.OPS) of nbytes (one rank's input) on dev takes the
        hierarchical schedule, else the flat group's op; counted by path for stats."""
        path = self._path(op, nbytes, dev)
        key = f"{op}/{path}"
        self._paths[key] = self._paths.get(key, 0) + 1
        return path == schedule.HIER

    def _flat_now(self, what, nbytes, keep, issue, out=None, async_op=True, gloo_red=True,
                  choice=True, nccl_red=True):
        """The flat group's own op `what` (its schedule name, asked of the choice unless
        choice is False: an op whose hierarchical schedule does not apply to these
        arguments; nbytes of one rank's input; keep its tensor, or its (output, input)),
        issued at once by issue(pg, flat) with the caller's tensors and options, as a plain
        NCCL or Gloo group would run it; GENERAL where the op must take _post instead:
        non-contiguous or empty tensors, a dtype the inner engines do not move as itself
        (the general path moves it as bytes), arguments compared across ranks (DETAIL
        debug), host ops still pending (they go first), the choice is hierarchical, or
        (host tensors) a reduction that is not Gloo's own (gloo_red False: AVG, PREMUL_SUM,
        from the caller's _split_op, made once per call), or (CUDA tensors) one NCCL would
        get wrong (nccl_red False: PREMUL_SUM, whose bf16 NCCL 2.28 through torch 2.11 returns
        as zeros with a host factor; the general path applies the factor in its local step
        and sums across hosts; gosym._c10d.Hier leaves it to Python). Flat then
        costs what the inner engine's own op does: no byte views, copies or hand-off to the
        worker over it (session 26: 12-37 µs an op on CUDA; an asynchronous host op's two
        hand-offs, session 27).

        CUDA: NCCL's Work. Host: Gloo's op, waited for here when synchronous, else an
        EventWork its future finishes (out: the Work's result); a failure either way is the
        group's (_failed), so a lost rank is named as on the general path. issue's flat
        turns a two-buffer op's tensor into the 1-D view Gloo's tensor ops take (NCCL: the
        tensor itself). On the path of every small op across hosts, where it is all that
        gosym adds to Gloo's or NCCL's own op: one pass of cheap tests, no frame it can
        spare (3-5 us over torch's wrapper on a 2-core VM, 4-9 before: scripts/hier_flat_cost.py)."""
        if self._check_args or self._runner.pending:  # read unlocked: at worst GENERAL
            return GENERAL
        dev = _op_device(keep)  # first: it refuses tensors on two devices
        if keep.__class__ is tuple:
            t = keep[-1]
            if not keep[0].is_contiguous():
                return GENERAL
        else:
            t = keep
        if not t.numel() or not t.is_contiguous() or t.dtype not in _WIRE:
            return GENERAL  # the general path moves other dtypes as bytes
        where = "cpu" if dev < 0 else "cuda"
        if not (gloo_red if where == "cpu" else nccl_red):
            return GENERAL
        chosen = choice and what in schedule.OPS
        if chosen and self._path(what, nbytes, where) != schedule.FLAT:
            return GENERAL
        if self._broken is not None or self._news is not None:
            self._usable(what)
        self._seq += 1
        seq = self._seq
        if chosen:
            key = f"{what}/flat"
            self._paths[key] = self._paths.get(key, 0) + 1
        if dev >= 0:
            self._cuda = dev
            try:
                return issue(self._group("flat", "cuda"), _same)
            except Exception as e:
                raise self._failed(what, seq, e, keep) from e
        try:
            w = issue(self._group("flat", "cpu"), _flat)
        except Exception as e:
            raise self._failed(what, seq, e, keep) from e
        if not async_op:
            self._wait_flat(w, what, seq, keep)
            return None  # torch's wrapper has nothing left to wait for
        done = EventWork(out)
        try:
            fut = w.get_future()
        except RuntimeError:
            # Gloo's reduce_scatter_tensor Work has no future (torch 2.11: "Work::getFuture
            # not implemented"): the worker waits for it, so the ops after it wait too (the
            # worker is not idle) and issue on the flat group in post order all the same
            def finish():
                try:
                    w.wait()
                except Exception as e:
                    raise self._failed(what, seq, e, keep) from e
            self._runner.submit(finish, done)
            return done
        self._flat_host[done] = (what, seq, keep)

        def settle(fut):
            if self._flat_host.pop(done, None) is None:
                return  # the watch's news failed it first (_fail_flat_host)
            try:
                fut.value()
            except Exception as e:  # noqa: BLE001 - named on the worker, which may wait
                if self._runner.closed:  # torn down under it: no worker, no report to ask for
                    done._finish(DistBackendError(f"gosym: {what} (seq {seq}) across hosts "
                                                  f"failed as the group was shut down: {e}"))
                else:
                    self._runner.submit(lambda e=e: _raise(self._failed(what, seq, e, keep)),
                                        done)
                return
            done._finish(None)

        fut.add_done_callback(settle)
        return done

    def _wait_flat_host(self):
        """Waits for the asynchronous host ops issued flat so far (a barrier's first step)."""
        for w in list(self._flat_host):
            w.wait()

    def _wait_flat(self, w, what, seq, keep):
        """Waits for the Gloo Work w of a synchronous host op issued flat (what, seq), in
        slices: a peer that gave up leaves Gloo's op waiting until its own timeout, and no
        abort of Gloo's ends it, so where the watch's news (a rank lost, the group failed
        elsewhere) closes the flat path meanwhile, the wait ends in the group's failure
        (_flat_news). A failure of the op itself is the group's (_failed)."""
        while True:
            try:
                w.wait(_SLICE)
                return
            except Exception:  # noqa: BLE001 - the slice's end, or the op's failure
                if w.is_completed():
                    try:
                        w.wait()
                        return
                    except Exception as e:
                        raise self._failed(what, seq, e, keep) from e
            self._flat_news(what, seq, keep)

    # ---- reductions -------------------------------------------------------------

    def _inter_allreduce(self, pg, buf, op):
        """Starts the inter-host engine's all_reduce of buf with op on pg and returns what
        finishes it (waits, and leaves the result in buf)."""
        w, back = _red_wire(buf)
        work = pg.allreduce([w], _opts(_c10d.AllreduceOptions, True, reduceOp=op))

        def finish():
            work.wait()
            if back:
                buf.copy_(w)
        return finish

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
            self._rail_allreduce(buf, iop, dev, self._swaps(buf))()
        self._local_bcast(buf, 0)

    def _ar_rails(self, buf, lop, iop, dev):
        """all_reduce on hosts of n ranks each, in chunks: intra-host reduce-scatter, then
        all_reduce of each rank's 1/n among the ranks of its local index (async, so it
        overlaps the next chunk's reduce-scatter), then intra-host all_gather."""
        n, total = self._n, buf.numel()
        step = max(n, self._chunk // buf.element_size() // n * n)
        swap, prev = self._swaps(buf), None
        for i, a in enumerate(range(0, total, step)):
            seg = buf.narrow(0, a, min(step, total - a))
            pad = -seg.numel() % n
            segp = seg
            if pad:
                segp = buf.new_zeros(seg.numel() + pad)
                segp[:seg.numel()].copy_(seg)
            shard = self._shard(i % 2, segp.numel() // n, buf)
            _wait(self._local._reduce_scatter_base(
                shard, segp, _opts(_c10d.ReduceScatterOptions, reduceOp=lop)))
            finish = self._rail_allreduce(shard, iop, dev, swap)
            if prev is not None:
                self._ar_gather(*prev)
            prev = (seg, segp, shard, finish)
        if prev is not None:
            self._ar_gather(*prev)

    def _shard(self, i, numel, like):
        """A chunk's shard of numel elements like `like` for _ar_rails: on the CPU, mapped
        buffer i (0 or 1: the chunk whose rail step is in flight, and the next; _mapped), so
        that the host's all_gather reads every rank's shard in place (the direct path, from
        GOSYM_DIRECT_MIN) instead of staging it: 2/n of the op's bytes fewer through memory,
        where on hosts simulated on one machine the op is bound by memory (BENCHMARKS.md,
        session 43). A whole chunk's shard is mapped at once (any dtype's), so the buffer
        is bound once."""
        return self._mapped(i, numel, like, self._chunk // self._n + 64)

    def _mapped(self, key, numel, like, least=0):
        """numel elements like `like` in buffer `key` of memory this host's ranks map
        (gosym.empty), kept for the group's later ops and grown to the largest asked for
        (at least `least` bytes): a host step's input there is read by the host's ranks in
        place. A plain tensor for device tensors. The caller writes the buffer again only
        after the host op that read it returned, and that returns on every rank once all
        have read (the direct path's completion barrier); ops run one at a time (the op's
        thread), so one key serves one step of one op."""
        if like.device.type != "cpu":
            return like.new_empty(numel)
        nbytes = numel * like.element_size()
        buf = self._maps.get(key)
        if buf is None or buf.numel() < nbytes:
            buf = self._maps[key] = memory.empty(max(nbytes, least), dtype=torch.uint8)
        return buf[:nbytes].view(like.dtype)

    def _ar_gather(self, seg, segp, shard, finish):
        finish()
        _wait(self._local._allgather_base(segp, shard, _opts(_c10d.AllgatherOptions)))
        if segp is not seg:
            seg.copy_(segp[:seg.numel()])

    def _swaps(self, buf):
        """Whether an all_reduce of buf moves along the rails as swaps (_rail_allreduce): its
        bytes times the other hosts' count at most GOSYM_HIER_SWAP_MAX (what a rank sends
        per op's buffer). On the 16-core host (session 28, scripts/hier_steps.py) a swap and
        a fold between two hosts took 0.55 / 1.8 / 9.7 ms at 1 / 4 / 16 MiB against Gloo's
        all_reduce's 0.77 / 2.05 / 8.5, and Gloo's all_reduce, whose reduction runs on its
        own threads, kept 64 MiB ops 15-20% faster than swaps, whose folds are the op
        thread's."""
        others = len(self._hosts) - 1
        return buf.numel() * buf.element_size() * others <= self._swap_max

    def _rail_allreduce(self, buf, op, dev, swap):
        """Starts the all_reduce of buf with op among this rank's rail and returns what
        finishes it (waits, and leaves the result in buf). With swap, host tensors: the
        rail's ranks send their buffers to each other point to point and each reduces them
        in host order (_fold_hosts: one message each way per pair, where Gloo's all_reduce
        takes two rounds between two hosts and more between more; every host ends with the
        same bits). Else Gloo's or NCCL's all_reduce."""
        fold = _fold(op, buf, self._n) if swap and dev == "cpu" else None
        if fold is not None:
            got = buf.new_empty(len(self._hosts), *buf.shape)
            works = self._rail_swap(dev, [buf] * len(self._hosts), got)

            def finish():
                for w in works:
                    w.wait()
                _fold_hosts(fold, buf, self._host, got)
            return finish
        return self._inter_allreduce(self._group("rail", dev), buf, op)

    def _use_rails(self, nbytes, numel):
        return self._balanced and self._n > 1 and nbytes >= self._rail_min and numel >= self._n

    def _allreduce(self, buf, op, dev):
        """all_reduce of a contiguous 1-D buffer in place, on the path the choice gives."""
        lop, iop, avg, scale = _split_op(op, buf)
        if not buf.numel():
            return
        if self._hier("all_reduce", buf.numel() * buf.element_size(), dev):
            self._allreduce_hier(buf, lop, iop, scale, dev)
        else:
            if scale is not None:
                buf.mul_(scale)
            self._inter_allreduce(self._group("flat", dev), buf, iop)()
        if avg:
            _divide(buf, self._size)

    def _allreduce_hier(self, buf, lop, iop, scale, dev):
        if self._use_rails(buf.numel() * buf.element_size(), buf.numel()):
            self._ar_rails(buf, lop, iop, dev)
        else:
            self._ar_leaders(buf, lop, iop, scale, dev)

    def _reduce(self, buf, root, lop, iop, avg, scale, dev):
        """reduce to group rank root: on the flat group, or through the leaders (local index 0
        gathers its host, the leaders reduce to the root's host's one, which hands the result
        on to its host, the root among them)."""
        if not self._hier("reduce", buf.numel() * buf.element_size(), dev):
            self._inter_reduce(self._group("flat", dev), buf if scale is None else buf * scale,
                               buf, root, iop)
        else:
            hr, _ = self._where[root]
            self._host_reduce(buf, lop, scale)
            if self._lidx == 0:
                self._inter_reduce(self._group("rail", dev), buf, buf, hr, iop)
            if self._host == hr:
                self._local_bcast(buf, 0)
        if avg and self._rank == root:
            _divide(buf, self._size)

    def _inter_reduce(self, pg, src, buf, root, op):
        """reduce of src to pg's rank root, whose buf (src itself, or where src goes after)
        takes the result."""
        w, back = _red_wire(src)
        _wait(pg.reduce([w], _opts(_c10d.ReduceOptions, reduceOp=op, rootRank=root)))
        if pg.rank() == root:
            if back:
                src.copy_(w)
            if src is not buf:
                buf.copy_(src)

    def _broadcast(self, buf, root, dev):
        """broadcast from group rank root: on the flat group, or along the root's rail (its
        local index's ranks, one per host, where every host has that index): the root sends
        to its rail while its host's broadcast runs, and every other host's rail rank hands
        the bytes on inside its host (two steps on the way, as the inner engine's one op
        takes at least one inter-host message). Where a host lacks the root's local index,
        through the leaders: inside the root's host first, then rail 0, then the others."""
        if not self._hier("broadcast", buf.numel() * buf.element_size(), dev):
            _wait(self._group("flat", dev).broadcast(
                [_bytes(buf)], _opts(_c10d.BroadcastOptions, rootRank=root)))
            return
        hr, lr = self._where[root]
        buf = _bytes(buf)
        via = lr if all(len(rs) > lr for rs in self._hosts) else 0
        rail = None
        if self._host == hr:
            if via != lr:
                self._local_bcast(buf, lr)
            if self._lidx == via:
                rail = self._group("rail", dev).broadcast(
                    [buf], _opts(_c10d.BroadcastOptions, rootRank=hr))
            if via == lr:
                self._local_bcast(buf, lr)
            if rail is not None:
                _wait(rail)
            return
        if self._lidx == via:
            _wait(self._group("rail", dev).broadcast(
                [buf], _opts(_c10d.BroadcastOptions, rootRank=hr)))
        self._local_bcast(buf, via)

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
        if not self._hier("all_gather_into_tensor", m * inp.element_size(), dev):
            _wait(self._group("flat", dev)._allgather_base(out, inp, _opts(_c10d.AllgatherOptions)))
            return
        if self._blocks(dev):
            self._gather_blocks(out, inp, dev)
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

    def _blocks(self, dev):
        """Whether the hierarchical all_gather and reduce_scatter take host blocks along the
        rails (_gather_blocks, _scatter_blocks), at any size (measured faster than the
        leaders' path from 1 KiB): host tensors (the p2p steps are Gloo's; NCCL's would need
        its group calls, and CUDA keeps the paths measured for it) on hosts of equal rank
        counts, more than one each, host h holding ranks h*n to h*n+n-1 in local-index order
        (torchrun's layout), so that host h's rows of a gathered tensor are its block h."""
        n = self._n
        return (dev == "cpu" and self._balanced and n > 1
                and all(rs == list(range(h * n, h * n + n)) for h, rs in enumerate(self._hosts)))

    def _rail_swap(self, dev, sends, recvs):
        """Posts on this rank's rail a receive into recvs[h] from, and (sends not None) a send
        of sends[h] to, the rank of every other host h (rail rank h): the Works. Sends and
        receives of one pair keep their order (one tag; only the op's thread uses the rail)."""
        rail = self._group("rail", dev)
        works = []
        for h in range(len(self._hosts)):
            if h != self._host:
                works.append(rail.recv([recvs[h]], h, 0))
                if sends is not None:
                    works.append(rail.send([sends[h]], h, 0))
        return works

    def _gather_blocks(self, out, inp, dev):
        """all_gather along the rails into host blocks: each rank swaps its row with its
        rail (point to point: Gloo's allgather moves bytes several times slower than its
        sends), gathers its own host's rows into that host's block of out while the rows
        travel, then each other host's rows into its block. No staging of the whole output,
        no reordering copy: every byte of out is written once, by the local group, and the
        received rows are read where they arrived."""
        m, opts = inp.numel(), _opts(_c10d.AllgatherOptions)
        blocks = out.view(len(self._hosts), self._n * m)
        got = self._received(len(self._hosts), m, inp)
        works = self._rail_swap(dev, [inp] * len(self._hosts), got)
        _wait(self._local._allgather_base(blocks[self._host], inp, opts))
        for w in works:
            w.wait()
        for h in range(len(self._hosts)):
            if h != self._host:
                _wait(self._local._allgather_base(blocks[h], got[h], opts))

    def _received(self, rows, cols, like):
        """rows x cols elements like `like` for what the rails bring from the other hosts
        and a host op then reads (_gather_blocks' rows, _a2a_blocks' blocks): mapped
        (_mapped, one buffer for both: ops run one at a time) up to ROWS_MAPPED_MAX bytes,
        so the host's ranks read it in place instead of staging it again; larger, a plain
        tensor."""
        if rows * cols * like.element_size() > ROWS_MAPPED_MAX:
            return like.new_empty(rows, cols)
        return self._mapped("recv", rows * cols, like).view(rows, cols)

    def _scatter_blocks(self, out, inp, lop, fold, dev):
        """reduce_scatter along the rails from host blocks: the host's reduce_scatter of each
        host's block of inp gives this rank its host's partial of its rail's row there; it
        sends that to the host's rail rank (the other hosts' blocks first, so they travel
        while the own block is reduced), receives the other hosts' partials of its own row,
        and folds them in (fold: the inter-host step's, tensors._fold)."""
        m, opts = out.numel(), _opts(_c10d.ReduceScatterOptions, reduceOp=lop)
        hosts = len(self._hosts)
        blocks = inp.view(hosts, self._n * m)
        part = out.new_empty(hosts, m)
        got = out.new_empty(hosts, m)
        works = self._rail_swap(dev, None, got)
        rail = self._group("rail", dev)
        for h in [h for h in range(hosts) if h != self._host] + [self._host]:
            target = out if h == self._host else part[h]
            _wait(self._local._reduce_scatter_base(target, blocks[h], opts))
            if h != self._host:
                works.append(rail.send([part[h]], h, 0))
        for w in works:
            w.wait()
        rows = _rows(got)
        fold(out, [out.data_ptr()] + [rows[h] for h in range(hosts) if h != self._host])

    def _a2a_applies(self, t, split_sizes):
        """Whether all_to_all_single of t may take host blocks (_a2a_blocks): host tensors,
        the host-blocks layout (_blocks), equal splits by contract (no split sizes given on
        any rank: whether sizes that happen to be equal on one rank are on another is not
        known there), something to move, and at most _a2a_blocks_max bytes."""
        return (_op_device(t) < 0 and not any(split_sizes)
                and 0 < t.numel() * t.element_size() <= self._a2a_blocks_max())

    def _a2a_blocks_max(self):
        """The most bytes of one rank's input for which all_to_all_single takes host blocks
        (0: none, where the layout has none): while the blocks from the other hosts fit the
        mapped buffer (_received). Beyond it they are a plain tensor, staged again by the
        host's all_to_all, and the op measured 2x slower than flat (2x2 on the 16-core host,
        256 MiB: 238 ms against 121, session 46), so it runs flat; the table's points end
        below it (64 MiB)."""
        hosts = len(self._hosts)
        if not self._blocks("cpu"):
            return 0
        return ROWS_MAPPED_MAX * hosts // (hosts - 1)

    def _a2a_blocks(self, out, inp, dev):
        """all_to_all_single of equal splits along the rails from host blocks (out, inp:
        contiguous bytes, one equal block per rank): this rank's input rows for host h's
        ranks, contiguous in the host-blocks layout, go to its rail's rank on h, one message
        per other host where the flat op sends one per rank; each host's block, this host's
        own at once while the others travel, the others' as they arrive, is spread among the
        host's ranks by one all_to_all of the local group, straight into this rank's output
        rows from that host (rank l of host h receives from its rail's rank of host h' the
        rows that h''s ranks of local index l send to host h, in local-index order: the
        local all_to_all gives local rank l' its row and this rank the rows of h''s ranks for
        it, row l of that host's block). No copy beyond the received blocks."""
        hosts, me = len(self._hosts), self._host
        ins, outs = inp.view(hosts, -1), out.view(hosts, -1)
        others = [h for h in range(hosts) if h != me]
        got = dict(zip(others, self._received(len(others), ins.shape[1], inp)))
        works = iter(self._rail_swap(dev, ins, got))  # a receive and a send per other host
        opts = _opts(_c10d.AllToAllOptions)
        _wait(self._local.alltoall_base(outs[me], ins[me], [], [], opts))
        for h in others:  # in host order on every rank: the local group's ops match
            next(works).wait()
            next(works).wait()
            _wait(self._local.alltoall_base(outs[h], got[h], [], [], opts))

    def _scatter_rows(self, out, inp, op, dev):
        """out (m) <- the reduction of every rank's row `rank` of inp (size x m, contiguous)."""
        lop, iop, avg, scale = _split_op(op, out)
        m = out.numel()
        if not m:
            return  # nothing moves (as an empty all_reduce)
        if not self._hier("reduce_scatter_tensor", inp.numel() * inp.element_size(), dev):
            self._inter_reduce_scatter(self._group("flat", dev), out,
                                       inp if scale is None else inp * scale, iop)
        elif self._blocks(dev) and (fold := _fold(iop, out, self._n)) is not None:
            self._scatter_blocks(out, inp, lop, fold, dev)
        elif self._use_rails(inp.numel() * inp.element_size(), inp.numel()):
            # rows in (local index, host) order: the host's reduce-scatter gives each rank
            # its local index's rows (one per host), the rail's reduce-scatter its own row
            y = inp.view(self._size, m).index_select(0, self._order(dev)).view(-1)
            shard = out.new_empty(len(self._hosts) * m)
            _wait(self._local._reduce_scatter_base(
                shard, y, _opts(_c10d.ReduceScatterOptions, reduceOp=lop)))
            self._inter_reduce_scatter(self._group("rail", dev), out, shard, iop)
        else:
            tmp = inp.clone()
            self._allreduce_hier(tmp, lop, iop, scale, dev)
            out.copy_(tmp.view(self._size, m)[self._rank])
        if avg:
            _divide(out, self._size)

    def _inter_reduce_scatter(self, pg, out, src, op):
        """out (m) <- the reduction over pg's ranks of their src's block of pg's rank."""
        ws, back = _red_wire(src)
        wo = out.new_empty(out.numel(), dtype=ws.dtype) if back else _red_wire(out)[0]
        _wait(pg._reduce_scatter_base(wo, ws, _opts(_c10d.ReduceScatterOptions, reduceOp=op)))
        if back:
            out.copy_(wo)
