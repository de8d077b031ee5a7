"""A fuzzer: one random program of collectives and point-to-point ops per seed, the same
on every rank, over the world and random subgroups (a member set drawn per group, a single
rank included), sync and async (waited later in random order, through wait() or the
future), in place or into fresh outputs, contiguous or strided, sizes from empty to a few
MiB (every path the engine picks by size), every dtype; on CUDA, ops issued on random side
streams as well. Each rank rebuilds every rank's input from the seed, so every result is
checked against a float64 (integers: exact, wrapping) reference computed locally, with
outputs poisoned first; results every member holds are compared bit for bit across the
group's ranks at the end (through a gloo group, not the group under test).

Threads (--threads T): T programs at once, one per thread, each over groups of its own (and
on CUDA on a stream of its own). On CUDA they take turns to post: a sequence drawn from
--seed, the same on every rank, says which program issues its next step, and a program
issues only on its turn. NCCL's rule for concurrent communicators is that their kernels
block waiting for peers, so every rank must launch the ops of different communicators in
one order; threads that post as they are scheduled interleave differently on each rank and
can hang the GPUs (measured: NCCL itself hangs on the unordered program at world 4). So a
turn covers exactly the calls that post to peers (the step's issue: every torch.distributed
call on a group under test, a synchronous op's own wait within it, the first use that
creates a communicator, the object calls' several collectives, barrier,
batch_isend_irecv), and nothing that blocks on the device or on a peer's later post
(waits, futures, stream synchronisations, the checks' copies to the host, the digest
comparison over the per-program gloo group) holds one: those run concurrently on each
program's thread. Each step is one turn on every rank, a rank outside the step's group
passing it on, so the sequence means the same everywhere; a program that ends (or fails)
gives up its remaining turns. Groups are all made before the threads start, in one order.
--free-threads posts unordered on CUDA as well (not a valid NCCL program: it may hang);
on the CPU the threads run free (Gloo allows concurrent groups) unless GOSYM_FUZZ_TURNS=1
asks for turns there too (how the turns are tested without a GPU).

Run (from the repository root):
    PYTHONPATH=python:tests/jobs/common torchrun --nproc-per-node N \
        tests/jobs/fuzz/fuzz_worker.py --seed S --ops K [--cuda] [--threads T [--free-threads]]
A failure names the seed and the step, so one program replays it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import random
import sys
import threading
import time

import torch
import torch.distributed as dist
import wcommon as wc

R = dist.ReduceOp
FLOAT_OPS = ["SUM", "AVG", "MAX", "MIN", "PRODUCT"]
INT_OPS = ["SUM", "MAX", "MIN", "PRODUCT", "BAND", "BOR", "BXOR"]
CUDA_INT_OPS = ["SUM", "MAX", "MIN", "PRODUCT"]  # NCCL has no bitwise reductions
KINDS = ["all_reduce", "broadcast", "reduce", "all_gather", "all_gather_v", "all_gather_into_tensor",
         "reduce_scatter", "reduce_scatter_v", "reduce_scatter_tensor", "all_to_all_single", "all_to_all", "gather",
         "scatter", "p2p", "p2p_all", "coalesced", "objects", "barrier"]
# the kinds that reduce (coalesced: some of its variants)
REDUCING = {"all_reduce", "reduce", "reduce_scatter", "reduce_scatter_v", "reduce_scatter_tensor", "coalesced"}
# element counts: mostly small, some past the staging and direct thresholds
SIZES = [(0.06, lambda r: r.choice([0, 1, 2])), (0.44, lambda r: r.randint(3, 600)),
         (0.3, lambda r: r.randint(600, 20000)), (0.15, lambda r: r.randint(20000, 300000)),
         (0.05, lambda r: r.randint(300000, 1200000))]


def add_args(p):
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ops", type=int, default=200)
    p.add_argument("--cuda", action="store_true")
    p.add_argument("--groups", type=int, default=3, help="random subgroups besides the world")
    p.add_argument("--threads", type=int, default=1, help="programs run at once, one per thread")
    p.add_argument("--print-program", type=int, default=0, metavar="WORLD",
                   help="print the programs' steps at this world size (with --cuda: as on CUDA; "
                        "--across-hosts: without int16, as across hosts) and exit, running nothing")
    p.add_argument("--across-hosts", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--free-threads", action="store_true",
                   help="on CUDA, threads post in any order instead of taking turns: not a valid NCCL program "
                        "(NCCL needs one order of ops across communicators on every rank), it may hang")


def draw_members(r: random.Random, world: int, groups: int) -> list[list[int]]:
    """The members of a program's random subgroups, drawn alike on every rank."""
    out = []
    for _ in range(groups):
        n = r.randint(1, world)
        out.append(sorted(r.sample(range(world), n)))
    return out


def draw_dtypes(cuda_across_hosts: bool) -> list[torch.dtype]:
    """The dtypes a program draws from: every one, but int16 for CUDA tensors across hosts
    (NCCL carries them there and has no int16)."""
    return [d for d in list(wc.ALL_DTYPES) + [torch.complex64]
            if not (cuda_across_hosts and d == torch.int16)]


def draw_size(r: random.Random) -> int:
    x, acc = r.random(), 0.0
    for w, f in SIZES:
        acc += w
        if x < acc:
            return f(r)
    return SIZES[-1][1](r)


def poisoned(n: int, dtype: torch.dtype) -> torch.Tensor:
    """n elements no correct op leaves as they are: NaN; for integers an unlikely value
    (a legitimate result equal to it would only hide an unwritten element)."""
    if dtype.is_floating_point or dtype.is_complex:
        return torch.full((n,), float("nan"), dtype=dtype)
    if dtype == torch.bool:
        return torch.ones(n, dtype=dtype)
    return torch.full((n,), torch.iinfo(dtype).min + 3, dtype=dtype)


def reduce64(xs: list[torch.Tensor], op: str, dtype: torch.dtype) -> torch.Tensor:
    """The reference reduction of every rank's input: float64 for floats, wrapping int64
    for integers (as the engines wrap), cast to the output dtype for integers only."""
    wide = torch.complex128 if dtype.is_complex else torch.float64 if dtype.is_floating_point else torch.int64
    s = torch.stack([x.to(wide) for x in xs])
    if op in ("SUM", "AVG"):
        out = s.sum(0)
        out = out / len(xs) if op == "AVG" else out
    elif op == "PRODUCT":
        out = s.prod(0)
    elif op == "MAX":
        out = s.max(0).values
    elif op == "MIN":
        out = s.min(0).values
    else:
        out = s[0].clone()
        for x in s[1:]:
            out = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op](out, x)
    if dtype == torch.bool:
        return out != 0
    return out if dtype.is_floating_point or dtype.is_complex else out.to(dtype)


def close(got: torch.Tensor, ref: torch.Tensor, xs: list[torch.Tensor], op: str) -> tuple[bool, str]:
    """got (any dtype) against the reference: exact for integers, MIN/MAX and bool; floats
    within the dtype's rounding over the number of terms."""
    got = got.detach().cpu()
    if got.shape != ref.shape:
        return False, f"shape {tuple(got.shape)}, want {tuple(ref.shape)}"
    if got.is_complex():  # (real, imaginary) pairs, each within the float bound
        got, ref = torch.view_as_real(got.resolve_conj()), torch.view_as_real(ref)
        xs = [torch.view_as_real(x) for x in xs]
    if got.numel() == 0:
        return True, ""
    if not got.dtype.is_floating_point:
        bad = got != ref
    else:
        g = got.double()
        if op in ("MAX", "MIN", None):
            tol = torch.zeros_like(ref)
        else:
            eps = torch.finfo(got.dtype).eps
            mag = torch.stack([x.double().abs() for x in xs]).sum(0) if op != "PRODUCT" else ref.abs()
            tol = eps * (len(xs) + 2) * mag + eps * ref.abs()
        bad = ~((g - ref).abs() <= tol)  # a NaN (the poison) compares False: bad
    if bool(bad.any()):
        i = int(bad.nonzero()[0][0]) if bad.dim() else 0
        flat_g, flat_r = got.reshape(-1), ref.reshape(-1)
        return False, (f"{int(bad.sum())} of {got.numel()} elements wrong, first at {i}: "
                       f"got {flat_g[i].item()}, want {flat_r[i].item()}")
    return True, ""


class Turns:
    """Which program of this process posts next: a sequence of program indices, each index
    once per step of its program, shuffled from the seed (the same on every rank). take(i)
    blocks until the head of the sequence is i, skipping the programs that left; the turn
    passes on when the with-block ends. Every grant is logged (the order the test compares
    across ranks)."""

    def __init__(self, programs: int, steps: int, seed: int, stall_s: float):
        self.seq = [i for i in range(programs) for _ in range(steps)]
        random.Random(seed * 7753 + 1).shuffle(self.seq)
        self.pos = 0
        self.gone: set[int] = set()
        self.cond = threading.Condition()
        self.stall_s = stall_s  # no turn passed on for this long: report a hang, not hang
        self.log: list[tuple[int, int]] = []

    def _skip(self):
        while self.pos < len(self.seq) and self.seq[self.pos] in self.gone:
            self.pos += 1

    @contextlib.contextmanager
    def take(self, i: int, step: int):
        with self.cond:
            while True:
                if self.pos >= len(self.seq) or i in self.gone:
                    raise RuntimeError(f"program {i} asked for a turn at step {step} and has none left")
                if self.seq[self.pos] == i:
                    break
                pos = self.pos
                if not self.cond.wait_for(lambda: self.pos != pos, timeout=self.stall_s):
                    raise RuntimeError(f"program {i} waited {self.stall_s:.0f} s for its turn at step {step}: "
                                       f"turn {pos} of {len(self.seq)}, program {self.seq[pos]}'s, never passed on")
            self.log.append((i, step))
        try:
            yield
        finally:
            with self.cond:
                self.pos += 1
                self._skip()
                self.cond.notify_all()

    def leave(self, i: int):
        """Program i takes no more turns (it ended, or it failed): the sequence skips it."""
        with self.cond:
            self.gone.add(i)
            self._skip()
            self.cond.notify_all()

    def digest(self) -> str:
        return hashlib.sha1(repr(self.log).encode()).hexdigest()


class Program:
    """Draws and runs the ops; checks each when its result is due."""

    def __init__(self, args, rank, world, dev, seed, own_world=False, turns=None, index=0):
        """own_world: the program's "world" is a group of its own (programs run at once on
        several threads share no group, as torch requires). turns: the Turns its steps
        post by (program index in it), or None to post freely."""
        self.args, self.rank, self.world, self.dev, self.seed = args, rank, world, dev, seed
        self.turns, self.index = turns, index
        self.r = random.Random(seed)  # the program: drawn alike on every rank
        self.local = random.Random(seed * 1009 + rank)  # this rank's own order of waits
        self.ck = wc.Checker(rank)
        self.pending: list = []  # (case, work, check)
        self.digests: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        self.side = [torch.cuda.Stream(dev) for _ in range(2)] if args.cuda else []
        # the world, then subgroups: every rank calls new_group for each, in the same order
        self.groups = [(dist.new_group(list(range(world))) if own_world else None, list(range(world)))]
        self.groups += [(dist.new_group(m), m) for m in draw_members(self.r, world, args.groups)]
        self.checker_pg = dist.new_group(backend="gloo")
        across = False
        if args.cuda and args.backend == "gosym":
            import gosym

            across = "hier" in gosym.stats()
        self.dtypes = draw_dtypes(args.cuda and across)
        self.cur = dev  # the device of the op being drawn (a CUDA program runs some on the CPU)

    # -- data ---------------------------------------------------------------------------
    def inp(self, step, r, n, dtype, op=None, tag="x") -> torch.Tensor:
        """Rank r's input of a step, rebuilt identically anywhere (on the CPU)."""
        if dtype.is_complex:
            parts = wc.make_input(f"fuzz/{self.seed}/{step}/{tag}", r, 2 * n, torch.float32)
            return torch.view_as_complex(parts.view(n, 2))
        x = wc.make_input(f"fuzz/{self.seed}/{step}/{tag}", r, n, dtype, op or "")
        if not dtype.is_floating_point and dtype != torch.bool and op == "PRODUCT":
            return x % 4 + 1  # small factors keep the wrapping product interesting, not zero
        return x

    def put(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of t on the op's device: the reference's inputs stay as drawn."""
        return t.to(self.cur, copy=True)

    def buffer(self, n, dtype, strided):
        """An output of n elements, poisoned; strided: every other element of a buffer twice
        the size, whose other half must stay as it is. (tensor, its base or None)"""
        if not strided:
            return self.put(poisoned(n, dtype)), None
        base = self.put(poisoned(2 * n, dtype))
        return base[::2], base

    def holder(self, x: torch.Tensor, strided: bool):
        """x placed on the device, as a strided view when asked: (tensor, its base or None)."""
        if not strided:
            return self.put(x.clone()), None
        t, base = self.buffer(x.numel(), x.dtype, True)
        t.copy_(self.put(x))
        return t, base

    # -- running ------------------------------------------------------------------------
    def turn(self, step):
        """Held while the step posts (see the module's docstring): nothing in it may wait
        for the device or for another program's later post."""
        return self.turns.take(self.index, step) if self.turns else contextlib.nullcontext()

    def run(self):
        slow = float(os.environ.get("GOSYM_FUZZ_SLOW_S", "0"))  # report steps slower than this
        for step in range(self.args.ops):
            t0 = time.monotonic()
            self.step(step)
            if self.pending and self.local.random() < 0.3:
                self.settle(self.local.randint(1, len(self.pending)))
            dt = time.monotonic() - t0
            if slow and (dt > slow or step % 100 == 0):
                print(f"fuzz rank {self.rank}: {dt:.3f} s: {getattr(self, 'last_case', step)}", file=sys.stderr,
                      flush=True)
        self.settle(len(self.pending))
        self.compare_digests()

    def settle(self, k):
        """Waits for k pending ops, in random order, by wait() or through the future; on
        CUDA some collectives by a device synchronisation alone before the check (an NCCL
        collective is enqueued at its call, so that completes it; wait() comes after)."""
        order = self.local.sample(range(len(self.pending)), k)
        # With programs on other threads, no device synchronisation completes an op: a
        # device-wide one would also wait for another program's kernels, whose peers may wait
        # for this thread's next post (a deadlock on NCCL as well), and a stream's does not
        # cover an async op on a side stream (the caller's stream is joined to it only by
        # wait(); NCCL runs it on its own stream). Seed 202 at world 4, threads 2 checked such
        # ops' outputs before they were written.
        ways = ("wait", "future", "device") if self.args.threads == 1 else ("wait", "future")
        how = [self.local.choices(ways, (0.6, 0.25, 0.15)[:len(ways)])[0] for _ in order]
        done = [self.pending[i] for i in order]
        self.pending = [p for i, p in enumerate(self.pending) if i not in set(order)]
        for (case, work, check), via in zip(done, how):
            if work is None:
                self.ck.fail(case, "async_op=True returned no Work")
                continue
            try:
                if via == "device" and self.args.cuda and " cpu" not in case:  # host ops: only wait
                    # sends and receives too: NCCL enqueues every op at its call
                    torch.cuda.synchronize()
                    self.ck.run(case + " (after a device synchronize)", check)
                    work.wait()
                    continue
                if via == "future":
                    work.get_future().wait()
                    if self.args.cuda:
                        # a future's value is ready for the current stream once wait() returned
                        torch.cuda.current_stream().synchronize()
                else:
                    work.wait()
            except Exception as e:  # noqa: BLE001 - reported
                self.ck.fail(case, f"wait raised {wc.error_text(e)}")
                continue
            self.ck.run(case, check)

    def draw(self, step):
        """The step's op, drawn from the program's generator alike on every rank: its case
        (the name every report uses) and its parameters."""
        r = self.r
        gi = r.randrange(len(self.groups))
        group, members = self.groups[gi]
        kind = r.choice(KINDS)
        dtype = r.choice(self.dtypes)
        if self.args.cuda and dtype == torch.int16 and kind in REDUCING:
            dtype = torch.int32  # NCCL reduces no int16 (gosym refuses it on CUDA, as NCCL)
        n = draw_size(r)
        is_async = r.random() < 0.5
        strided = r.random() < 0.2
        stream = r.randrange(len(self.side) + 1) if self.side else 0
        ops = FLOAT_OPS if dtype.is_floating_point else (CUDA_INT_OPS if self.args.cuda else INT_OPS)
        if dtype == torch.bool:
            ops = ["MAX", "MIN"]
        if dtype.is_complex:  # as NCCL: complex sums only
            ops = ["SUM", "AVG"]
        op = r.choice(ops)
        root = r.randrange(len(members))
        shift = r.randint(1, max(1, len(members) - 1))
        splits = [[r.randint(0, max(1, n // max(1, len(members)))) for _ in members] for _ in members]
        sizes = [r.randint(0, max(1, n)) for _ in members]
        batch = r.random() < 0.5
        variant = r.randrange(4)  # coalesced: which op; objects: which call
        count = r.randint(1, 4)
        on_cpu = bool(self.side) and r.random() < 0.15
        if kind == "objects":
            is_async = False  # the object calls have no async form
        case = f"seed {self.seed} step {step} {kind} {wc.dname(dtype)} n={n} op={op} group={gi}{members}" \
               f"{' async' if is_async else ''}{' strided' if strided else ''}{f' stream{stream}' if stream else ''}" \
               f"{' cpu' if on_cpu else ''} variant={variant} count={count}"
        return case, dict(step=step, group=group, members=members, kind=kind, dtype=dtype, n=n, op=op,
                          root=root, shift=shift, splits=splits, sizes=sizes, strided=strided, batch=batch,
                          variant=variant, count=count, is_async=is_async, stream=stream, on_cpu=on_cpu)

    def step(self, step):
        case, d = self.draw(step)
        kind, members, is_async, stream = d["kind"], d["members"], d["is_async"], d["stream"]
        self.last_case = case
        if os.environ.get("GOSYM_FUZZ_TRACE") == "1":  # every step named as it starts
            sys.stderr.write(f"fuzz rank {self.rank}: begins {case}\n")  # one write: threads
            sys.stderr.flush()  # of one process cannot split a line
        if self.rank not in members:
            with self.turn(step):  # the step's turn on every rank: passed on here
                return
        self.counts[kind] = self.counts.get(kind, 0) + 1
        me = members.index(self.rank)
        ctx = dict(d, case=case, me=me)  # the op builders take what they use (**_)
        self.cur = torch.device("cpu") if d["on_cpu"] else self.dev
        # inputs and outputs made (host-to-device copies that wait for this thread's stream)
        # before the turn; the turn covers the post alone: a synchronous op's wait within
        # issue() needs only the peers' posts of this same turn
        issue, check = getattr(self, "op_" + kind)(**ctx)
        with self.turn(step):
            try:
                if stream:
                    s = self.side[stream - 1]
                    s.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(s):
                        work = issue(is_async)
                    if not is_async:
                        torch.cuda.current_stream().wait_stream(s)
                else:
                    work = issue(is_async)
            except Exception as e:  # noqa: BLE001 - reported
                self.ck.fail(case, f"raised {wc.error_text(e)}")
                return
        if is_async:
            self.pending.append((case, work, check))
        else:
            self.ck.run(case, check)

    def record(self, key, t):
        """A result every member of the group holds: compared across them at the end."""
        self.digests[key] = wc.digest(t)

    def expect(self, case, got, ref, xs, op=None):
        ok, why = close(got, ref, xs, op)
        self.ck.check(case, ok, why)

    def untouched(self, case, base):
        """The other half of a strided output's buffer kept its fill."""
        if base is not None:
            rest = base[1::2].cpu()
            fill = poisoned(rest.numel(), rest.dtype)
            same = rest.isnan() if rest.dtype.is_floating_point or rest.is_complex() else rest == fill
            self.ck.check(case + " (strided gaps kept)", bool(same.all()), "an element between the view's was written")

    @staticmethod
    def _call(fn, is_async, *a, **kw):
        w = fn(*a, async_op=is_async, **kw)
        return w if is_async else None

    # -- the ops: each returns (issue(is_async) -> Work|None, check()) ----------------------
    def op_all_reduce(self, step, case, group, members, me, dtype, n, op, strided, **_):
        xs = [self.inp(step, m, n, dtype, op) for m in members]
        t, base = self.holder(xs[me], strided)
        ref = reduce64(xs, op, dtype)

        def check():
            self.expect(case, t, ref, xs, op)
            self.untouched(case, base)
            self.record(f"{step}", t)
        return (lambda a: self._call(dist.all_reduce, a, t, op=getattr(R, op), group=group)), check

    def op_broadcast(self, step, case, group, members, me, dtype, n, root, strided, **_):
        x = self.inp(step, members[root], n, dtype)
        if me == root:
            t, base = self.holder(x, strided)
        else:
            t, base = self.buffer(n, dtype, strided)

        def check():
            self.expect(case, t, x, [x])
            self.untouched(case, base)
            self.record(f"{step}", t)
        return (lambda a: self._call(dist.broadcast, a, t, src=members[root], group=group)), check

    def op_reduce(self, step, case, group, members, me, dtype, n, op, root, strided, **_):
        xs = [self.inp(step, m, n, dtype, op) for m in members]
        t, base = self.holder(xs[me], strided)
        ref = reduce64(xs, op, dtype)

        def check():
            if me == root:
                self.expect(case, t, ref, xs, op)
            self.untouched(case, base)
        return (lambda a: self._call(dist.reduce, a, t, dst=members[root], op=getattr(R, op), group=group)), check

    def _gather_list(self, step, case, members, dtype, sizes, strided):
        xs = [self.inp(step, m, sizes[i], dtype) for i, m in enumerate(members)]
        outs = [self.buffer(sizes[i], dtype, strided) for i in range(len(members))]

        def check():
            for i, (o, base) in enumerate(outs):
                self.expect(f"{case} from {members[i]}", o, xs[i], [xs[i]])
                self.untouched(case, base)
            self.record(f"{step}", torch.cat([o.cpu() for o, _ in outs]) if outs else torch.empty(0))
        return xs, [o for o, _ in outs], check

    def op_all_gather(self, step, case, group, members, me, dtype, n, strided, sizes=None, **_):
        xs, outs, check = self._gather_list(step, case, members, dtype, sizes or [n] * len(members), strided)
        t = self.put(xs[me])
        return (lambda a: self._call(dist.all_gather, a, outs, t, group=group)), check

    def op_all_gather_v(self, sizes, **kw):
        """all_gather of unequal sizes (NCCL's _v form)."""
        return self.op_all_gather(sizes=sizes, **kw)

    def op_all_gather_into_tensor(self, step, case, group, members, me, dtype, n, **_):
        xs = [self.inp(step, m, n, dtype) for m in members]
        out, _ = self.buffer(n * len(members), dtype, False)
        t = self.put(xs[me])
        ref = torch.cat(xs) if xs else torch.empty(0, dtype=dtype)

        def check():
            self.expect(case, out, ref, [ref])
            self.expect(f"{case} input kept", t, xs[me], [xs[me]])
            self.record(f"{step}", out)
        return (lambda a: self._call(dist.all_gather_into_tensor, a, out, t, group=group)), check

    def op_reduce_scatter_tensor(self, step, case, group, members, me, dtype, n, op, **_):
        k = len(members)
        xs = [self.inp(step, m, n * k, dtype, op) for m in members]
        out, _ = self.buffer(n, dtype, False)
        t = self.put(xs[me])
        part = [x[me * n:(me + 1) * n] for x in xs]
        ref = reduce64(part, op, dtype)

        def check():
            self.expect(case, out, ref, part, op)
            self.expect(f"{case} input kept", t, xs[me], [xs[me]])
        return (lambda a: self._call(dist.reduce_scatter_tensor, a, out, t, op=getattr(R, op), group=group)), check

    def op_reduce_scatter(self, step, case, group, members, me, dtype, n, op, strided, sizes=None, **_):
        k = len(members)
        sizes = sizes or [n] * k
        xs = [[self.inp(step, m, sizes[j], dtype, op, tag=f"to{j}") for j in range(k)] for m in members]
        ins = [self.put(x) for x in xs[me]]
        out, base = self.buffer(sizes[me], dtype, strided)
        part = [xs[i][me] for i in range(k)]
        ref = reduce64(part, op, dtype)

        def check():
            self.expect(case, out, ref, part, op)
            self.untouched(case, base)
            for j, x in enumerate(ins):  # the inputs are left as they were
                self.expect(f"{case} input {j} kept", x, xs[me][j], [xs[me][j]])
        return (lambda a: self._call(dist.reduce_scatter, a, out, ins, op=getattr(R, op), group=group)), check

    def op_reduce_scatter_v(self, sizes, **kw):
        """reduce_scatter into outputs of unequal sizes (NCCL's _v form)."""
        return self.op_reduce_scatter(sizes=sizes, **kw)

    def op_all_to_all_single(self, step, case, group, members, me, dtype, splits, **_):
        k = len(members)
        xs = [self.inp(step, m, sum(splits[i]), dtype) for i, m in enumerate(members)]
        ins = [splits[me][j] for j in range(k)]
        outs = [splits[i][me] for i in range(k)]
        out, _ = self.buffer(sum(outs), dtype, False)
        t = self.put(xs[me])
        offs = [[sum(splits[i][:j]) for j in range(k)] for i in range(k)]
        ref = torch.cat([xs[i][offs[i][me]:offs[i][me] + splits[i][me]] for i in range(k)])

        def check():
            self.expect(case, out, ref, [ref])
            self.expect(f"{case} input kept", t, xs[me], [xs[me]])
        return (lambda a: self._call(dist.all_to_all_single, a, out, t, output_split_sizes=outs,
                                     input_split_sizes=ins, group=group)), check

    def op_all_to_all(self, step, case, group, members, me, dtype, splits, strided, **_):
        k = len(members)
        xs = [[self.inp(step, m, splits[i][j], dtype, tag=f"to{j}") for j in range(k)] for i, m in enumerate(members)]
        ins = [self.put(x) for x in xs[me]]
        outs = [self.buffer(splits[i][me], dtype, strided) for i in range(k)]

        def check():
            for i, (o, base) in enumerate(outs):
                self.expect(f"{case} from {members[i]}", o, xs[i][me], [xs[i][me]])
                self.untouched(case, base)
        return (lambda a: self._call(dist.all_to_all, a, [o for o, _ in outs], ins, group=group)), check

    def op_gather(self, step, case, group, members, me, dtype, n, root, **_):
        xs = [self.inp(step, m, n, dtype) for m in members]
        t = self.put(xs[me])
        outs = [self.buffer(n, dtype, False)[0] for _ in members] if me == root else None

        def check():
            for i, o in enumerate(outs or []):
                self.expect(f"{case} from {members[i]}", o, xs[i], [xs[i]])
        return (lambda a: self._call(dist.gather, a, t, gather_list=outs, dst=members[root], group=group)), check

    def op_scatter(self, step, case, group, members, me, dtype, n, root, strided, **_):
        xs = [self.inp(step, members[root], n, dtype, tag=f"to{j}") for j in range(len(members))]
        ins = [self.put(x) for x in xs] if me == root else None
        out, base = self.buffer(n, dtype, strided)

        def check():
            self.expect(case, out, xs[me], [xs[me]])
            self.untouched(case, base)
        return (lambda a: self._call(dist.scatter, a, out, scatter_list=ins, src=members[root], group=group)), check

    def op_p2p(self, step, case, group, members, me, dtype, n, shift, batch, **_):
        """Every member sends to the one shift places on and receives from the one shift back
        (itself in a group of one), as one batch or as isend/irecv pairs; on the CPU every
        third step's receive names no source (gloo's receive from any source: the one sender
        of its tag), and its Work must name the sender."""
        k = len(members)
        to, frm = members[(me + shift) % k], members[(me - shift) % k]
        x = self.put(self.inp(step, self.rank, n, dtype))
        want = self.inp(step, frm, n, dtype)
        out, _ = self.buffer(n, dtype, False)
        batch = batch or k == 1  # torch's isend refuses the rank itself
        anysrc = self.cur.type == "cpu" and not batch and step % 3 == 0
        posted = []

        def issue(is_async):
            if batch:
                works = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, to, group=group, tag=step),
                                                dist.P2POp(dist.irecv, out, frm, group=group, tag=step)])
            else:
                pair = [(dist.isend, x, to), (dist.irecv, out, None if anysrc else frm)]
                if self.args.cuda and me % 2:
                    # NCCL's pairs: one side receives first (two sends first on one pair's
                    # stream wait for each other), as NCCL's users must order them
                    pair.reverse()
                works = [f(t, peer, group=group, tag=step) for f, t, peer in pair]
                posted.extend(w for (f, _, _), w in zip(pair, works) if f is dist.irecv)
            if not is_async:
                for w in works:
                    w.wait()
                return None
            return Both(works)

        def check():
            self.expect(case, out, want, [want])
            if anysrc:
                got = posted[0]._source_rank()
                if group is not None:
                    got = dist.get_global_rank(group, got)
                self.ck.check(f"{case}: any source names the sender", got == frm, f"{got}, want {frm}")
        return issue, check

    def op_p2p_all(self, step, case, group, members, me, dtype, n, **_):
        """One batch: every member sends to and receives from every other member."""
        x = self.inp(step, self.rank, n, dtype)
        peers = [m for m in members if m != self.rank]
        outs = {p: self.buffer(n, dtype, False)[0] for p in peers}
        ins = {p: self.put(x) for p in peers}  # here, not in issue(): the copies wait for the stream

        def issue(is_async):
            ops = [o for p in peers for o in (dist.P2POp(dist.isend, ins[p], p, group=group),
                                              dist.P2POp(dist.irecv, outs[p], p, group=group))]
            works = dist.batch_isend_irecv(ops) if ops else []
            if is_async:
                return Both(works)
            for w in works:
                w.wait()
            return None

        def check():
            for p in peers:
                want = self.inp(step, p, n, dtype)
                self.expect(f"{case} from {p}", outs[p], want, [want])
        return issue, check

    def op_coalesced(self, step, case, group, members, me, dtype, n, op, variant, count, **_):
        """count ops of one kind in torch's coalescing manager: all_reduce,
        all_gather_into_tensor or reduce_scatter_tensor (variant), sizes n, n/2, n/3..."""
        k, which = len(members), ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")[variant % 3]
        ns = [n // (i + 1) for i in range(count)]
        calls, checks = [], []
        for i, m in enumerate(ns):
            c = f"{case} {which} #{i}"
            if which == "all_reduce":
                xs = [self.inp(step, q, m, dtype, op, tag=f"c{i}") for q in members]
                t = self.put(xs[me])
                calls.append(lambda t=t: dist.all_reduce(t, op=getattr(R, op), group=group))
                checks.append(lambda c=c, t=t, xs=xs: self.expect(c, t, reduce64(xs, op, dtype), xs, op))
            elif which == "all_gather_into_tensor":
                xs = [self.inp(step, q, m, dtype, tag=f"c{i}") for q in members]
                t, out = self.put(xs[me]), self.buffer(m * k, dtype, False)[0]
                calls.append(lambda t=t, out=out: dist.all_gather_into_tensor(out, t, group=group))
                ref = torch.cat(xs)
                checks.append(lambda c=c, out=out, ref=ref: self.expect(c, out, ref, [ref]))
            else:
                xs = [self.inp(step, q, m * k, dtype, op, tag=f"c{i}") for q in members]
                t, out = self.put(xs[me]), self.buffer(m, dtype, False)[0]
                calls.append(lambda t=t, out=out: dist.reduce_scatter_tensor(out, t, op=getattr(R, op), group=group))
                part = [x[me * m:(me + 1) * m] for x in xs]
                checks.append(lambda c=c, out=out, part=part: self.expect(c, out, reduce64(part, op, dtype), part, op))

        def issue(is_async):
            with dist._coalescing_manager(group=group, async_ops=is_async) as cm:
                for call in calls:
                    call()
            return Both(cm.works) if is_async else None

        def check():
            for c in checks:
                c()
        return issue, check

    def op_objects(self, step, case, group, members, me, root, variant, **_):
        """The object calls (pickled through the group's tensors): all_gather_object,
        broadcast_object_list, gather_object, scatter_object_list (variant)."""
        k, src = len(members), members[root]

        def obj(q, j=0):
            return {"rank": q, "step": step, "to": j, "data": list(range((step * 7 + q) % 50)), "s": "x" * (q + j)}
        got = {}

        def issue(_):
            if variant == 0:
                got["v"] = [None] * k
                dist.all_gather_object(got["v"], obj(self.rank), group=group)
            elif variant == 1:
                got["v"] = [obj(src, 1), obj(src, 2)] if self.rank == src else [None, None]
                dist.broadcast_object_list(got["v"], src=src, group=group)
            elif variant == 2:
                got["v"] = [None] * k if self.rank == src else None
                dist.gather_object(obj(self.rank), got["v"], dst=src, group=group)
            else:
                got["v"] = [None]
                dist.scatter_object_list(got["v"], [obj(src, j) for j in range(k)] if self.rank == src else None,
                                         src=src, group=group)
            return None

        def check():
            want = {0: [obj(q) for q in members], 1: [obj(src, 1), obj(src, 2)],
                    2: [obj(q) for q in members] if self.rank == src else None, 3: [obj(src, me)]}[variant]
            self.ck.check(case, got["v"] == want, f"got {str(got['v'])[:200]}, want {str(want)[:200]}")
        return issue, check

    def op_barrier(self, group, **_):
        return (lambda a: self._call(dist.barrier, a, group=group)), (lambda: None)

    # -- the end ------------------------------------------------------------------------
    def compare_digests(self):
        """Every member of a group got the same bits for its replicated results."""
        every = [None] * self.world
        dist.all_gather_object(every, self.digests, group=self.checker_pg)
        for key, mine in self.digests.items():
            others = [(r, d[key]) for r, d in enumerate(every) if key in d and d[key] != mine]
            self.ck.check(f"seed {self.seed} step {key}: same bits on every member", not others,
                          f"ranks {[r for r, _ in others]} differ from rank {self.rank}")


class Both:
    """The Works of one p2p step, waited together (a Work-like for the pending list)."""

    def __init__(self, works):
        self.works = works

    def wait(self):
        for w in self.works:
            w.wait()
        return True

    def get_future(self):
        return self

    def value(self):
        return None


def run_all(progs):
    """Runs the programs, at once on threads of their own when there are several."""
    # Turns on CUDA (progs' Turns) for NCCL's rule on concurrent communicators: its kernels
    # block waiting for their peers, so ops of different communicators launched in an order
    # that differs between ranks (threads scheduled differently on each) can hang the GPUs.
    def run(p):
        try:
            if p.args.cuda:
                torch.cuda.set_device(p.dev)
                if len(progs) > 1:
                    # each program on a stream of its own, as a threaded program must: on
                    # one shared stream the programs' ops interleave in another order on
                    # each rank, and each waits behind another group's op that waits for
                    # a peer still behind this one (NCCL deadlocks there too)
                    torch.cuda.set_stream(torch.cuda.Stream(p.dev))
            p.run()
        except Exception as e:  # noqa: BLE001 - reported
            p.ck.fail(f"seed {p.seed}", f"the program raised {wc.error_text(e)}")
        finally:
            if p.turns:  # the others must not wait for turns of a program that ended
                p.turns.leave(p.index)
    if len(progs) == 1:
        return run(progs[0])
    threads = [threading.Thread(target=run, args=(p,), name=f"fuzz-{p.seed}") for p in progs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def print_program(args):
    """--print-program: every program's steps as its ranks would draw them (the cases a run's
    reports and GOSYM_FUZZ_TRACE name), with no process group, device or op: where a failing
    step of a run sits in its program, and what ran before it."""
    world = args.print_program
    for i in range(args.threads):
        p = Program.__new__(Program)
        p.args, p.seed = args, args.seed + 7919 * i
        p.r = random.Random(p.seed)
        p.side = [None, None] if args.cuda else []
        p.groups = [(None, list(range(world)))] + [(None, m) for m in draw_members(p.r, world, args.groups)]
        p.dtypes = draw_dtypes(args.cuda and args.across_hosts)
        print(f"program {i} (seed {p.seed}): groups {[m for _, m in p.groups]}")
        for step in range(args.ops):
            print(p.draw(step)[0])


def _cpp_flat_ops(dev):
    """The ops the world group's C++ backend (gosym._c10d.Hier) ran flat, where the world
    spans hosts and torch calls it through that backend; else None."""
    import gosym
    from gosym import c10d
    from gosym.hier import schedule

    m, g = c10d.module(), gosym.group()
    if m is None or not hasattr(g, "_cells") or \
            not isinstance(dist.group.WORLD._get_backend(dev), m.Hier):
        return None
    return sum(g._cells[g.COUNTS + i] for i in range(len(schedule.FLAT_OPS)))


def main():
    if "--print-program" in sys.argv:  # no process, group or result file to set up
        parser = argparse.ArgumentParser()
        add_args(parser)
        return print_program(parser.parse_known_args()[0])
    args = wc.setup(add_args)
    if os.environ.get("GOSYM_FUZZ_STACKS_S"):  # every thread's Python stack, if still running then
        import faulthandler

        after = float(os.environ["GOSYM_FUZZ_STACKS_S"])
        faulthandler.dump_traceback_later(after, exit=False)
        if args.backend == "gosym":  # and the engine's goroutines: where a native call waits
            from gosym import _lib

            def engine():
                print(f"engine stacks of pid {os.getpid()}:\n{_lib.engine_stacks()}", file=sys.stderr, flush=True)
            timer = threading.Timer(after, engine)
            timer.daemon = True  # a run that ends first does not wait for it
            timer.start()
    if args.cuda:
        rank, world, dev, _ = wc.init_cuda(args)
    else:
        rank, world = wc.init(args.backend, args.timeout)
        dev = torch.device("cpu")
    # turns: on CUDA (NCCL's rule, see run_all); on the CPU only when asked (a test of the turns)
    ordered = args.threads > 1 and not args.free_threads and (
        args.cuda or os.environ.get("GOSYM_FUZZ_TURNS") == "1")
    turns = Turns(args.threads, args.ops, args.seed, stall_s=max(120.0, 3 * args.timeout)) if ordered else None
    # groups are made here, program by program, in the same order on every rank
    progs = [Program(args, rank, world, dev, args.seed + 7919 * i, own_world=args.threads > 1, turns=turns,
                     index=i) for i in range(args.threads)]
    run_all(progs)
    if args.cuda:
        torch.cuda.synchronize()
    ck = wc.Checker(rank)
    for p in progs:
        ck.failures += p.ck.failures
        ck.passed += p.ck.passed
        ck.info.setdefault("ops_run", {})[p.seed] = p.counts
    if turns:  # the order the turns were granted in: the same on every rank
        ck.info["turns"] = {"taken": len(turns.log), "order": turns.digest()}
    cpp = _cpp_flat_ops(dev) if args.backend == "gosym" else None
    if cpp is not None:
        ck.info["cpp_flat_ops"] = cpp
    wc.write_result(ck.result(digests={f"{p.seed}/{k}": v for p in progs for k, v in p.digests.items()}))
    wc.print_summary(ck, f"fuzz seed {args.seed}" + (f" x{args.threads} threads" if args.threads > 1 else ""))
    dist.destroy_process_group()
    # a failed check fails the process too (the result file says which): loops over seeds
    # outside pytest (device_cuda.sh fuzz-seeds, campaigns) see it in the exit code
    sys.exit(3 if ck.failures else 0)


if __name__ == "__main__":
    main()
