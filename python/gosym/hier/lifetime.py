"""A HierGroup's lifetime: creation (its local gosym group and its inter-host groups),
identity and stats, shutdown and abort, posting its ops, and what a failed op leaves: the
group broken, the failure reported through the store, the ranks that never report it named
as lost."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import re
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from .. import split as _split
from .._errors import DistBackendError
from .._streams import _raw_stream, record as _record
from .._tensors import _op_device
from ..backend import ProcessGroupGosym
from ..work import EventWork, cuda_work
from . import schedule
from .hosts import linked
from .runner import Runner
from .watch import Watch


class HierBase(ProcessGroupGosym):
    """A HierGroup's life (gosym.hier.group.HierGroup is the group, its ops): what it is made
    of, its inner groups, running its ops (host-side ones in post order on a worker thread,
    CUDA ones on the caller's current stream, as NCCL's), and what a failure leaves."""

    _watch = None  # the ranks' watch on each other (gosym.hier.watch), made with the group
    _news = None  # what the watch heard (a failure elsewhere, a rank gone), until an op reports it
    _dead = frozenset()  # ranks the watch saw exit without leaving (a set once one did)
    # The cells gosym._c10d.Hier reads and counts in (its flat path in C++: c10d.wrap), by
    # index: whether its flat path is open (1: not broken, no news, not shut down, not
    # DETAIL; closed for good), this group's worker's pending ops, the op sequence number,
    # the CUDA device (-1 before the first CUDA op), then its flat ops per schedule.FLAT_OPS.
    OPEN, PENDING, SEQ, DEVICE, COUNTS = range(5)

    def __init__(self, store, rank, size, timeout, name, global_ranks, hosts, hid, settings,
                 new_group, link):
        """new_group: the factory that made this group (gosym.factory.new_group), which makes
        its splits too; hosts: the group ranks on each host, in order; hid: this rank's host
        id; settings:
        the GOSYM_HIER_* values (gosym._settings.hier()), the same on every rank (the factory
        compared them; docs/TUNABLES.md): all_reduce, reduce_scatter and all_gather
        of at least GOSYM_HIER_RAIL_MIN bytes take the rails (every local index moves 1/n of
        the data between hosts) on hosts of equal rank counts, smaller ones and any on
        unequal hosts the hosts' leaders; the rails' all_reduce is pipelined in chunks of
        GOSYM_HIER_CHUNK bytes (one chunk's inter-host step overlaps the next one's
        intra-host reduce-scatter); GOSYM_HIER_CHOICE says whether those ops, broadcast and
        reduce take this schedule or run flat (gosym.hier.schedule); GOSYM_HIER_CPU_P2P
        whether CPU sends and receives between ranks of one host go through gosym (local) or,
        as every other pair's, through Gloo (gloo); after a failure, a rank
        waits GOSYM_HIER_REPORT_S seconds for every other rank to report it before naming
        those that did not as lost. The ranks watch each other around a ring on the flat
        Gloo group (gosym.hier.watch, _watched). link: what joins the hosts
        (gosym.hier.schedule.link, from every rank's boot id and GOSYM_HIER_LINK), whose
        measurements the choice takes."""
        dist.ProcessGroup.__init__(self, rank, size)
        self._rank, self._size, self._timeout, self._name = rank, size, timeout, name
        self._new_group = new_group
        self._rail_min = settings["GOSYM_HIER_RAIL_MIN"]
        self._chunk = settings["GOSYM_HIER_CHUNK"]
        self._swap_max = settings["GOSYM_HIER_SWAP_MAX"]
        self._report_s = settings["GOSYM_HIER_REPORT_S"]
        self._choice = settings["GOSYM_HIER_CHOICE"]
        self._link = link
        self._cpu_p2p_local = settings["GOSYM_HIER_CPU_P2P"] == "local"
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
        self._shape = schedule.shape(len(rs) for rs in hosts)
        # TORCH_DISTRIBUTED_DEBUG=DETAIL: every op's arguments compared across the ranks
        # first (_agree), as torch's wrapper does for Gloo and NCCL (it skips Python groups)
        self._check_args = dist.get_debug_level() == dist.DebugLevel.DETAIL
        if self._check_args:
            self._close_flat()
        self._paths = {}  # "op/hier" or "op/flat" -> ops that took it (stats)
        self._seq = 0
        self._split_count = 0
        self._broken = None
        self._dead = set()
        self._inner = {}
        self._p2p_peers = set()  # ranks whose CUDA send/recv communicators are made (_p2p_connect)
        # asynchronous host ops issued flat at the call (_flat_now) and not yet finished: a
        # barrier waits for them first, as Gloo's barrier waits for the work before it
        self._flat_host = {}  # EventWork -> (what, seq, keep)
        self._maps = {}  # mapped host buffers by key (HierAlgorithms._mapped)
        gen = store.add(f"gosym/hiergen/{rank}", 1)
        self._store = dist.PrefixStore(f"gosym/hier/{gen}/", store)
        mine = hosts[self._host]
        local_store = dist.PrefixStore(f"host{self._host}/", self._store)
        self._local = linked(local_store, self._lidx, self._n, timeout, f"{name}/host{self._host}",
                             [self._global_ranks[r] for r in mine], mine, hid)
        self._local._gosym_inner = True  # its ops are steps of this group's: no ranges of their own
        self._runner = Runner(name, self._cells, self.PENDING)
        try:
            self._group("rail", "cpu")
            self._watch = Watch(self._group("flat", "cpu"), rank, size, self._watched, name,
                                timeout)
        except BaseException:
            self._local.shutdown()
            raise

    # ---- what the C++ backend shares --------------------------------------------

    @functools.cached_property
    def _cells(self):
        c = (ctypes.c_int64 * (self.COUNTS + len(schedule.FLAT_OPS)))()
        c[self.OPEN], c[self.DEVICE] = 1, -1
        return c

    @functools.cached_property
    def _shared(self):
        """gosym._c10d.Group's cells: no endpoint, so its own short path never runs."""
        return (ctypes.c_int64 * 2)(0, -1)

    @property
    def _seq(self):
        """The collective sequence number (ops across hosts, the flat ones the C++ backend
        runs included): what failures name."""
        return self._cells[self.SEQ]

    @_seq.setter
    def _seq(self, v):
        self._cells[self.SEQ] = v

    @property
    def _cuda(self):
        d = self._cells[self.DEVICE]
        return None if d < 0 else d

    @_cuda.setter
    def _cuda(self, d):
        self._cells[self.DEVICE] = -1 if d is None else d

    def _close_flat(self):
        """Closes the C++ backend's flat path for good: every op takes the Python path,
        which raises what broke the group."""
        self._cells[self.OPEN] = 0

    def _flat_news(self, what, seq, keep):
        """For a flat host op (what, seq) still waiting once the flat path closed (the C++
        backend's and the Python path's slices): raises the group's failure where the
        watch's news or an earlier failure closed it; else returns (open, or closed by a
        shutdown: the op waits on)."""
        if self._cells[self.OPEN] or (self._news is None and self._broken is None):
            return
        raise self._failed(what, seq, self._news, keep)

    def _fail_flat_host(self):
        """Fails the asynchronous host ops issued flat and not finished with the watch's
        news, on the worker (their Gloo ops wait for peers that gave up until Gloo's
        timeout; nothing ends them sooner)."""
        for done in list(self._flat_host):
            op = self._flat_host.pop(done, None)
            if op is not None:
                def fail(what=op[0], seq=op[1], keep=op[2]):
                    raise self._failed(what, seq, self._news, keep)
                self._runner.submit(fail, done)

    def _flat_failed(self, what, seq, keep, kind, why):
        """Raises the error of a flat op the C++ backend issued (seq) that failed with
        kind: why, as the Python flat path's: the group's failure (_failed)."""
        e = (DistBackendError if kind == "DistBackendError" else RuntimeError)(why)
        raise self._failed(what, seq, e, keep) from e

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
                     "inner_groups": sorted(f"{k}/{d}" for k, d in self._inner),
                     "shape": self._shape, "choice": self._choice, "link": self._link,
                     "paths": self._all_paths()}
        return json.dumps(s)

    def _all_paths(self):
        """The ops by the path they took, the flat ones the C++ backend ran included."""
        paths = dict(self._paths)
        for i, op in enumerate(schedule.FLAT_OPS):
            n = self._cells[self.COUNTS + i]
            if n:
                paths[f"{op}/flat"] = paths.get(f"{op}/flat", 0) + n
        return paths

    def shutdown(self):
        """Drains the worker, tells the ring this rank leaves (the watch), then shuts the
        inner groups down. Idempotent."""
        self._close_flat()
        self._runner.close()
        self._watch.close()
        self._close_inner(abort=False)
        self._local.shutdown()
        self._maps = {}

    def abort(self):
        self._close_flat()
        self._runner.close()
        self._watch.close()
        self._close_inner(abort=True)
        self._local.shutdown()
        self._maps = {}

    def _close_inner(self, abort):
        inner, self._inner = self._inner, {}
        if abort:
            self._abort_inner(inner)
            return
        for pg in inner.values():
            try:
                pg.shutdown()
            except Exception:  # noqa: BLE001 - best effort: the group goes either way
                pass

    def split_group(self, ranks, timeout=None, opts=None, group_name=None, group_desc=None):
        """dist.split_group of a group across hosts: the members' group, made by the factory
        that made this one (their own inner groups where they span hosts, gosym.split)."""
        return _split.split(self, ranks, timeout, group_name, group_desc, self._new_group)

    # ---- inner groups ---------------------------------------------------------

    def _group(self, kind, dev):
        """This rank's inter-host group of kind "rail" (its local index's), or "flat" or
        "down" (every rank; "down" carries CUDA sends to lower ranks: _p2p_group), on Gloo
        (dev "cpu") or NCCL (dev "cuda")."""
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
                pg = _nccl_group(sub, me, len(ranks), opts)
            self._inner[(kind, dev)] = pg
        return pg

    def _dev(self, dev):
        return "cpu" if dev < 0 else "cuda"

    # ---- running ops -----------------------------------------------------------

    def _usable(self, what):
        """DistBackendError for op `what` on a group an earlier failure broke, or that the
        watch heard has failed (the op is then the failure this rank reports: _failed)."""
        if self._broken is not None:
            raise DistBackendError(f"gosym: {what}: the group is unusable after an earlier "
                                    f"failure: {self._broken}")
        if self._news is not None:
            raise self._failed(what, None, self._news)

    def _watched(self, pred, origin, dead, error):
        """The watch's news (gosym.hier.watch), on its thread, told by predecessor pred:
        the group failed at rank origin, or rank dead exited without leaving (pred itself
        where its connection closed: error). The news is passed on around the ring; a dead
        rank is not waited for in the reports (_lost); the news is kept for this rank's
        next op or CUDA Work's wait (_usable, which reports it and names the lost ranks);
        and this rank's NCCL groups are aborted: a CUDA op across hosts waits in NCCL's
        kernels, which nothing else ends before torch's watchdog does at the group's timeout
        (session 33: 70 s), so the caller's stream drains now (outputs of ops in flight
        undefined)."""
        if dead is not None:  # a failure reported meanwhile, here or anywhere, need not wait for it
            self._dead.add(dead)
            try:
                self._store.set(f"dead/{dead}", str(self._rank))
            except Exception:  # noqa: BLE001 - the store's host may be the dead one
                pass
        if self._broken is not None or self._runner.closed:
            return  # this rank's own failure, come around the ring, or the group is going
        self._close_flat()  # the next op, in Python, reports the news
        if dead is not None:
            how = f": {error}" if error is not None else f" (told by rank {pred})"
            self._news = RankLost(f"rank {dead} closed its connections without leaving the "
                                  f"group (it exited or was killed){how}")
            self._watch.tell_dead(dead)
        else:
            self._news = GroupFailed(f"the group failed on rank {origin} (told by rank {pred})")
            self._watch.tell_failed(origin)
        self._fail_flat_host()
        nccl = self._abort_inner({k: pg for k, pg in list(self._inner.items()) if k[1] == "cuda"})
        if nccl:  # said now, as NCCL's watchdog does: the caller may be blocked on the GPU
            print(f"gosym: group {self._name!r}, rank {self._rank}: {self._news}; its NCCL "
                  f"work across hosts is aborted, its next op or wait raises", file=sys.stderr,
                  flush=True)

    def _post(self, what, keep, out, fn, async_op=True):
        """Runs fn(dev) (the op's steps) as op `what`: CUDA ops (keep's tensors on a GPU)
        at once on the caller's stream, host ops on the worker thread (inline when called
        from it, by a future's callback, or when synchronous and none is pending: the
        runner's inline). Errors become gosym errors naming the op."""
        self._usable(what)
        dev = _op_device(keep)
        self._seq += 1
        seq = self._seq

        def run():
            try:
                if self._check_args:
                    self._agree(what, seq, keep)
                fn(self._dev(dev))
            except ArgumentsDiffer:
                raise  # no rank ran the op: the group stays usable
            except Exception as e:
                raise self._failed(what, seq, e, keep) from e

        if dev >= 0:
            self._runner.drain()  # host ops posted earlier go first on the inner groups
            self._cuda = dev
            run()
            # the op's tensors marked as used on this stream, as ProcessGroupNCCL marks its
            # own (its inner ops here run synchronously and mark nothing): a tensor the
            # caller drops, made on another stream, is not handed out again there before
            # the op read it (the fuzzer across hosts, session 33: async gathers' inputs
            # overwritten on the default stream while the op waited on a side stream)
            _record(keep, torch.cuda.current_stream(dev))
            if not async_op:
                return None
            return cuda_work(out, dev, _raw_stream(dev), check=lambda: self._usable(what))
        on_thread = self._runner.on_thread()
        if not async_op and not on_thread and self._runner.inline(run):
            return None  # no Work to make: creating one costs more than a small op here
        w = EventWork(out)
        if on_thread:
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

    def _agree(self, what, seq, keep):
        """Compares op what's arguments (fingerprint) across every rank before it runs, on
        the flat Gloo group: a digest each, and only where they differ the texts (through
        the store), so that every rank raises naming a rank whose differ and both. Without
        it, arguments that differ across hosts fail inside the inter-host step: Gloo aborts
        the process on a size that differs, NCCL may hang, as they do flat."""
        mine = fingerprint(what, keep)
        digest = hashlib.blake2b(mine.encode(), digest_size=8).digest()
        t = torch.tensor([int.from_bytes(digest, "little", signed=True)], dtype=torch.int64)
        every = torch.empty(self._size, dtype=torch.int64)
        self._group("flat", "cpu")._allgather_base(every, t).wait()
        other = next((r for r in range(self._size) if every[r] != t[0]), None)
        if other is None:
            return
        self._store.set(f"args/{seq}/{self._rank}", mine)
        theirs = self._store.get(f"args/{seq}/{other}").decode()
        raise ArgumentsDiffer(f"gosym: {what} (seq {seq}): the ranks posted different arguments "
                              f"(TORCH_DISTRIBUTED_DEBUG=DETAIL): rank {self._rank} {mine}, "
                              f"rank {other} {theirs}")

    def _abort_inner(self, inner):
        """Aborts the inner groups of inner ((name, device) -> group) all at once (_abort_all)
        and parks the NCCL ones, which it returns. Where there are NCCL groups, the host
        group's CUDA work is aborted beside them: NCCL's abort waits for the device, which a
        kernel of the host group left waiting for a host peer that has left the op keeps
        busy until the group's timeout (session 50, 2 x 2 ranks on one H200: the survivor
        whose rail peer had failed hung past it)."""
        nccl = [pg for (_, dev), pg in inner.items() if dev == "cuda"]
        aborts = [pg.abort for pg in inner.values()]
        if nccl:
            why = f"the group across hosts {self._name!r} failed" + (
                "" if self._news is None else f": {self._news}")
            aborts.append(lambda: self._local.abort_cuda(why))
        _abort_all(aborts)
        _park(nccl)
        return nccl

    def _failed(self, what, seq, e, keep=None):
        """The error of op what (seq) that failed with e: the inner groups are aborted (a
        peer in a gosym step with this rank fails at once, one in a Gloo step at the latest
        at its timeout), the failure is reported through the store with the op's signature
        (keep's tensors), and the ranks that do not report it within GOSYM_HIER_REPORT_S
        are named as lost; ranks that report a different op or different tensors are named
        with theirs (mismatched arguments across hosts fail in the inter-host step, which
        cannot say why). seq None: a send or receive (what names the peer), which takes no
        collective sequence number and whose peers post other ops by nature, or an op that
        met the watch's news (_usable): not compared."""
        label = what if seq is None else f"{what} (seq {seq})"
        self._close_flat()
        if self._broken is not None:
            return DistBackendError(f"gosym: {label}: {self._broken}")
        self._broken = "aborting"
        if self._watch is not None:  # every rank hears of it within a trip around the ring
            self._watch.tell_failed(self._rank)
        self._close_inner(abort=True)
        self._local.abort()
        lost = self._lost(_P2P + what if seq is None else f"{label} of {signature(keep)}")
        msg = (f"gosym: {label} across hosts failed on rank {self._rank} of "
               f"{self._size} (group {self._name!r}, host {self._host} of ranks "
               f"{self._hosts[self._host]}): {lost}; cause: {type(e).__name__}: {e}")
        self._broken = msg
        return DistBackendError(msg)

    def _lost(self, op):
        """Reports op (what this rank posted) as failed and waits for every rank's report
        (no longer than until only ranks some rank's watch saw exit are missing: they are
        in the store as dead/<rank>): who did not report, and who reported another op than
        this rank's."""
        try:
            keys = [f"failed/{r}" for r in range(self._size)]
            self._store.set(keys[self._rank], op)
            deadline = time.monotonic() + self._report_s
            while True:
                late = [r for r in range(self._size) if not self._store.check([keys[r]])]
                gone = [r for r in late if r in self._dead or self._store.check([f"dead/{r}"])]
                if len(gone) == len(late) or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            ops = {r: self._store.get(keys[r]).decode() for r in range(self._size) if r not in late}
        except Exception as e:  # noqa: BLE001 - the store's host may be the lost one
            return f"the store is unreachable to name the lost ranks ({e})"
        other = next((r for r, o in ops.items() if _differ(op, o)), None)
        differ = ("" if other is None else f"the ranks posted different ops: rank {self._rank} "
                  f"{op}, rank {other} {ops[other]}; ")
        if not late:
            return differ + "every rank reported the failure (no rank was lost)"
        glob = [self._global_ranks[r] for r in late]
        also = "" if glob == late else f" (global ranks {glob})"  # a subgroup's own numbers
        if len(gone) == len(late):
            return differ + (f"ranks {late}{also} were lost (they exited without leaving the "
                             f"group: the watch saw their connections close)")
        return differ + (f"ranks {late}{also} were lost or are blocked elsewhere (no report of "
                         f"the failure from them within {self._report_s:.0f} s)")


# torch's NCCL groups read how their watchdog handles an error from this variable when they
# are made; where the user left it unset, the inner ones clean up and raise (2) rather than
# take the process down (torch's default, 3): a failure across hosts is the HierGroup's to
# report, naming the lost ranks, as gosym does on one host. Session 34: NCCL's socket
# transport saw a killed peer's p2p connection close, and torch's watchdog took the survivor
# down before it could say who was lost.
_NCCL_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
_nccl_env = threading.Lock()


def _nccl_group(store, rank, size, opts):
    """An inner ProcessGroupNCCL that cleans up and raises on an error unless the user chose
    otherwise (_NCCL_HANDLING)."""
    with _nccl_env:
        if _NCCL_HANDLING in os.environ:
            return _c10d.ProcessGroupNCCL(store, rank, size, opts)
        os.environ[_NCCL_HANDLING] = "2"
        try:
            return _c10d.ProcessGroupNCCL(store, rank, size, opts)
        finally:
            del os.environ[_NCCL_HANDLING]


# Aborted NCCL inner groups, kept for the process's life: ProcessGroupNCCL's destructor joins
# its watchdog thread, which after a timeout still needs the GIL (it drops the failed Works'
# tensors, it dumps Python stacks), while the destructor, run by the release of the last
# Python reference, holds it. Released by the failed op that aborted them, it hung the
# process for good (session 35: a rank late past the timeout across hosts on CUDA, the
# survivor stopped between _close_inner's return and its next line); released by a later
# shutdown (destroy_process_group after the watch's news), it would. Gloo groups are not
# kept: releasing one closes its connections, which is how a peer blocked in a Gloo step
# with this rank learns of the failure at once (parked, such a peer waited until this
# process exited: 8 s, test_rank_lost[die-host1-long-timeout]).
_PARKED = []


def _park(groups):
    _PARKED.extend(groups)


def _abort_all(aborts, limit_s=30):
    """Runs the inner groups' aborts (callables) all at once, each on a thread of its own,
    waiting at most limit_s in all. One at a time deadlocks: a NCCL communicator's abort
    waits for the device while another's kernel still spins there, never to end until that
    one is aborted too (session 34: the flat group's abort hung 60 s behind the "down"
    group's receive)."""
    def run(abort):
        try:
            abort()
        except Exception:  # noqa: BLE001 - best effort: the group goes either way
            pass

    threads = [threading.Thread(target=run, args=(a,), daemon=True, name="gosym-abort")
               for a in aborts]
    for t in threads:
        t.start()
    deadline = time.monotonic() + limit_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


# How a failed send or receive is reported through the store: its peers posted other ops.
_P2P = "point-to-point: "
_SEQ = re.compile(r"\(seq (\d+)\)")


def _differ(mine, theirs):
    """Whether two failure reports are ops posted differently: collectives of one sequence
    number with other names or tensors. A send or receive is compared with nothing (its
    peers post other ops by nature), nor are reports of other sequence numbers: a rank that
    finished an op before the failure (a broadcast's receiver, whose root then failed to
    send to a lost rank) failed in the next one, which is progress, not a mismatch."""
    if mine == theirs or mine.startswith(_P2P) or theirs.startswith(_P2P):
        return False
    a, b = _SEQ.search(mine), _SEQ.search(theirs)
    return a is None or b is None or a.group(1) == b.group(1)


class RankLost(RuntimeError):
    """The watch's news: a rank's connection closed without its leaving the group."""


class GroupFailed(RuntimeError):
    """The watch's news: the group failed on another rank."""


class ArgumentsDiffer(ValueError):
    """An op whose arguments differ across the ranks (TORCH_DISTRIBUTED_DEBUG=DETAIL)."""


# Ops whose tensors have the same shapes on every rank; the others (the list forms, whose
# sizes may differ as NCCL's _v forms, all_to_all's splits, gather and scatter, whose lists
# only the root passes) are compared by their dtypes and devices alone.
_SAME_SHAPES = frozenset({"all_reduce", "all_reduce_coalesced", "reduce", "broadcast",
                          "all_gather_into_tensor", "reduce_scatter_tensor", "barrier"})


def fingerprint(what, keep) -> str:
    """What every rank must pass alike to op what on tensors keep."""
    return f"{what} of {signature(keep, shapes=what in _SAME_SHAPES)}"


def signature(keep, shapes=True) -> str:
    """An op's tensors as dtype[shape]@device (shapes False: the distinct dtype@device), for
    naming what each rank posted."""
    out = []

    def walk(x):
        if isinstance(x, (list, tuple)):
            for y in x:
                walk(y)
        elif hasattr(x, "dtype") and hasattr(x, "shape"):
            shape = list(x.shape) if shapes else ""
            out.append(f"{str(x.dtype).removeprefix('torch.')}{shape}@{x.device.type}")

    walk(keep)
    if not shapes:
        out = sorted(set(out))
    text = ", ".join(out) or "no tensors"
    return text if len(text) <= 400 else text[:400] + "..."
