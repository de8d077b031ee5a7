"""Collective benchmark: gosym against gloo (CPU) or NCCL (CUDA), side by side in one job.

Run ``python -m gosym.bench`` (or ``python python/gosym/bench.py``; the script form works even
when ``import gosym`` fails, for gloo-only runs). Outside torchrun it relaunches itself under
``torch.distributed.run --standalone`` with a hard timeout; under torchrun every rank runs the
benchmark and rank 0 prints a table and writes JSON (and a PNG with --plot and matplotlib).

Method (see docs/BENCHMARKS.md):
- Every rank times every iteration on its own (perf_counter_ns around the synchronous collective,
  or a pair of CUDA events). After the timed block the per-rank series are all-gathered on a
  separate gloo control group (never a measured one: gloo's baseline is a group of its own),
  and the time of iteration i is the MAX over ranks; we report the median, p10 and p90 of
  those. One small gather per case, nothing inside the timed block.
- The iteration count is chosen from the warmup so a case takes about --target-time seconds
  (times --iters-scale), clamped to [--min-iters, --max-iters]; ranks agree on it through the
  control group.
- A case's backends run one after another, each warmed up and timed in one block, or with
  --interleave K in alternating turns of about K samples after every backend's warmup, each
  backend after each one alike (turn_order), so that the machine's drift over a case and what
  a turn leaves to the next fall on each backend alike (a turn starts at a barrier).
- Bus bandwidth follows nccl-tests; all_to_all uses bytes that leave the rank (equal to the
  nccl-tests formula for equal splits, and honest for the skewed variant).
- Correctness: once per (op, size), each measured backend other than the reference is checked
  against gloo on CPU copies of the same input, and the verdict is recorded.
"""

import os
import sys

if __name__ == "__main__" and not __package__:
    # Script form: drop the package directory from sys.path (its modules must not shadow
    # top-level ones) and put its parent there so that `import gosym` finds the package.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.path.insert(0, os.path.dirname(_here))

import argparse
import copy
import datetime
import json
import math
import platform
import subprocess
import time
import traceback

OPS = (
    "all_reduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "broadcast",
    "all_to_all_single",
    "all_to_all_single_skew",
)
DEFAULT_SIZES = "1K,4K,16K,64K,256K,1M,4M,16M,64M"
# Second gosym groups, made with settings of their own: backend -> (environment, CUDA only).
VARIANTS = {
    "gosym-sema": ({"GOSYM_GPU_SEMA_MIN": "1"}, True),  # every reduction by the semaphores
    "gosym-hier": ({"GOSYM_HIER_CHOICE": "hier"}, False),  # across hosts: always hierarchical
    "gosym-flat": ({"GOSYM_HIER_CHOICE": "flat"}, False),  # across hosts: always flat
    "gosym-defer": ({"GOSYM_GPU_DEFER": "1"}, True),  # host rounds on the queue's worker (gpu/defer.go)
}
ELEM = 4  # float32
SKEW_FRACTION = 8  # in the skewed all_to_all, each minor destination gets 1/(8*W) of the data
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
          "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_size(text):
    """'64K' -> 65536; units are binary (K = 1024)."""
    t = text.strip().upper()
    i = len(t)
    while i and not t[i - 1].isdigit():
        i -= 1
    if not i or t[i:] not in _UNITS:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (examples: 1024, 4K, 16M)")
    return int(t[:i]) * _UNITS[t[i:]]


def fmt_size(n):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def fmt_bw(gbps):
    """GB/s with enough digits for 1 KiB messages and few for HBM-scale numbers."""
    return f"{gbps:.1f}" if gbps >= 10 else f"{gbps:.3f}"


def default_nproc(device):
    """One rank per GPU with CUDA (the world a user of the machine gets), 2 on the CPU.
    Asked in a child process: the launcher itself must not initialise CUDA."""
    if device != "cuda":
        return 2
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                         capture_output=True, text=True, check=False)
    try:
        n = int(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        n = 0
    if n < 1:
        raise SystemExit("gosym.bench: --device cuda found no GPU (pass --nproc to override)")
    return n


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m gosym.bench", description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=None,
                   help="ranks to launch (default: every GPU of the machine with --device cuda, "
                        "else 2); more ranks than GPUs share them in turn")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--backends", default=None,
                   help="comma list (default gosym,gloo on cpu, gosym,nccl on cuda); on cuda "
                        "also symm-1shot, symm-2shot: PyTorch symmetric memory's all_reduce, and "
                        "gosym-sema: gosym's all_reduce by the semaphore protocol; on both, "
                        "gosym-bound: gosym on buffers from gosym.empty, and across hosts "
                        "gosym-hier / gosym-flat: gosym with GOSYM_HIER_CHOICE=hier / flat")
    p.add_argument("--ops", default=",".join(OPS), help="comma list from: " + ",".join(OPS))
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help=f"comma list of per-rank input sizes in bytes (default {DEFAULT_SIZES})")
    p.add_argument("--target-time", type=float, default=0.25,
                   help="seconds of timed iterations per case before --iters-scale (default 0.25)")
    p.add_argument("--iters-scale", type=float, default=1.0, help="scales --target-time")
    p.add_argument("--min-iters", type=int, default=5)
    p.add_argument("--max-iters", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=5, help="warmup iterations per case")
    p.add_argument("--interleave", type=int, default=0, metavar="K",
                   help="time the backends of a case in alternating turns of about K samples "
                        "each (0: each backend's samples in one block, one backend after another)")
    p.add_argument("--barrier-every", type=int, default=0,
                   help="barrier on the measured group every K timed iterations (0: never; "
                        "back-to-back collectives keep ranks in step; the barrier is untimed)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (memcpy baseline)")
    p.add_argument("--no-check", action="store_true", help="skip the correctness checks")
    p.add_argument("--cuda-graph", type=int, default=0, metavar="N",
                   help="cuda only: capture N ops in a CUDA graph and time replays")
    p.add_argument("--batch", type=int, default=1, metavar="K",
                   help="cuda only: time K back-to-back ops between one pair of CUDA events and "
                        "report the time per op (the host's launch rate and the GPU overlap, as "
                        "in a training step); default 1: one op per pair of events")
    p.add_argument("--json", default=None, help="output path (default bench-<device>-<time>.json "
                                                "in $OUT if set, else the current directory)")
    p.add_argument("--plot", default=None, help="PNG path (needs matplotlib; skipped otherwise)")
    p.add_argument("--op-timeout", type=float, default=120.0,
                   help="process-group timeout in seconds (a hung op raises after this)")
    p.add_argument("--timeout", type=float, default=1200.0,
                   help="hard timeout in seconds for the whole torchrun job")
    p.add_argument("--pin", type=int, default=0, metavar="K",
                   help="pin rank r to CPUs [r*K, r*K+K) of those allowed (0: no pinning), so "
                        "that the host side of small ops is measured without scheduler noise")
    p.add_argument("--max-errors", type=int, default=3,
                   help="stop measuring a backend after this many failed cases")
    args = p.parse_args(argv)
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [o for o in args.ops if o not in OPS]
    if bad:
        p.error(f"unknown ops {bad}; choose from {list(OPS)}")
    args.sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if args.nproc is None:  # the launcher's question; a rank runs in a world of its own
        args.nproc = int(os.environ["WORLD_SIZE"]) if "WORLD_SIZE" in os.environ else \
            default_nproc(args.device)
    if args.nproc < 1:
        p.error(f"--nproc must be at least 1, got {args.nproc}")
    if args.backends is None:
        args.backends = "gosym,nccl,gosym-sema,symm-1shot,symm-2shot" if args.device == "cuda" else \
            "gosym,gosym-bound,gloo"
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if args.interleave < 0:
        p.error(f"--interleave must be 0 or more, got {args.interleave}")
    if args.cuda_graph and args.device != "cuda":
        p.error("--cuda-graph needs --device cuda")
    if args.batch < 1 or (args.batch > 1 and (args.device != "cuda" or args.cuda_graph)):
        p.error("--batch K needs K >= 1, and K > 1 needs --device cuda without --cuda-graph")
    return args


# --------------------------------------------------------------------------- launcher

def launch(args, argv):
    """Re-run this file under torchrun, with a hard timeout on the whole job."""
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun would pick, minus its banner
    # The script path, not `-m gosym.bench`: children import gosym only when asked to.
    # "--" keeps torchrun's parser from taking our options for abbreviations of its own.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={args.nproc}", "--", os.path.abspath(__file__), *argv]
    try:  # this file also runs as a script (the ranks): no package around it then
        from ._torchrun import run_job
    except ImportError:
        from _torchrun import run_job
    try:
        rc = run_job(cmd, env, args.timeout, capture=False).returncode
    except KeyboardInterrupt:  # the job was stopped
        return 130
    if rc == 124:
        print(f"gosym.bench: timed out after {args.timeout:.0f}s, the job stopped", file=sys.stderr)
    return rc


# --------------------------------------------------------------------------- cases

class Case:
    """One (op, size): deterministic per-rank inputs and the op as a closure over a group.

    Buffers are made once and shared by all backends; in-place ops are restored from the
    pristine input before each correctness run (timed runs just keep going in place).
    """

    def __init__(self, torch, op, nbytes, rank, world, device):
        self.torch, self.op, self.rank, self.world = torch, op, rank, world
        n = max(world, nbytes // ELEM) // world * world  # divisible by world for the split ops
        self.n = n
        self.bytes = n * ELEM
        gen = torch.Generator().manual_seed(0x5EED + 1000003 * rank + n)
        self.input = torch.randn(n, generator=gen, dtype=torch.float32).to(device)
        self.in_splits = self.out_splits = None
        self.symm = None  # (algo, group name) on PyTorch symmetric memory, see symmetric()
        if op == "all_reduce":
            self.bus_bytes = self.bytes * 2 * (world - 1) / world
        elif op == "all_gather_into_tensor":
            self.output = torch.empty(n * world, dtype=torch.float32, device=device)
            self.bus_bytes = self.bytes * world * (world - 1) / world
        elif op == "reduce_scatter_tensor":
            self.output = torch.empty(n // world, dtype=torch.float32, device=device)
            self.bus_bytes = self.bytes * (world - 1) / world
        elif op == "broadcast":
            self.bus_bytes = self.bytes
        elif op == "all_to_all_single":
            self.output = torch.empty(n, dtype=torch.float32, device=device)
            self.bus_bytes = self.bytes * (world - 1) / world
        elif op == "all_to_all_single_skew":
            # Rank r sends the bulk to (r+1) % W and a sliver to everyone else (itself too);
            # so it receives the bulk from (r-1) % W. Each rank sends n - minor off-rank.
            minor = n // (SKEW_FRACTION * world)
            major = n - (world - 1) * minor
            self.in_splits = [major if d == (rank + 1) % world else minor for d in range(world)]
            self.out_splits = [major if s == (rank - 1) % world else minor for s in range(world)]
            self.output = torch.empty(n, dtype=torch.float32, device=device)
            self.bus_bytes = (n - minor) * ELEM if world > 1 else 0
        else:
            raise ValueError(op)
        if op in ("all_reduce", "broadcast"):
            self.output = self.input.clone()  # the in-place buffer

    def run(self, group, inp=None, out=None):
        """The synchronous collective on `group` (optionally on other buffers, for checks)."""
        dist = self.torch.distributed
        inp = self.input if inp is None else inp
        out = self.output if out is None else out
        op = self.op
        if self.symm is not None:
            algo, name = self.symm
            if algo == "2shot":
                self.torch.ops.symm_mem.two_shot_all_reduce_(out, "sum", name)
            else:
                self.torch.ops.symm_mem.one_shot_all_reduce_out(out, "sum", name, self.symm_out)
        elif op == "all_reduce":
            dist.all_reduce(out, group=group)
        elif op == "broadcast":
            dist.broadcast(out, src=dist.get_global_rank(group, 0), group=group)
        elif op == "all_gather_into_tensor":
            dist.all_gather_into_tensor(out, inp, group=group)
        elif op == "reduce_scatter_tensor":
            dist.reduce_scatter_tensor(out, inp, group=group)
        else:
            dist.all_to_all_single(out, inp, self.out_splits, self.in_splits, group=group)

    def result(self, group, device):
        """Run once on fresh copies of the input and return the output on the CPU."""
        inp = self.input.to(device)
        if self.symm is not None:  # the symmetric buffer is the only one it can use
            self.output.copy_(inp)
            self.run(group)
            return (self.output if self.symm[0] == "2shot" else self.symm_out).cpu()
        out = inp.clone() if self.op in ("all_reduce", "broadcast") else \
            self.torch.empty_like(self.output, device=device)
        self.run(group, inp, out)
        return out.cpu()

    def bound(self, gosym):
        """The same case on buffers from gosym.empty, which peers read in place."""
        c = copy.copy(self)
        c.input = gosym.empty_like(self.input).copy_(self.input)
        c.output = gosym.empty_like(self.output).copy_(self.output)
        return c

    def symmetric(self, backend, group):
        """The all_reduce case on a PyTorch symmetric-memory buffer of group, run by its
        one_shot (backend "symm-1shot") or two_shot ("symm-2shot") kernel."""
        import torch.distributed._symmetric_memory as symm_mem

        c = copy.copy(self)
        name = group.group_name
        c.output = symm_mem.empty(self.n, dtype=self.torch.float32, device=self.input.device)
        symm_mem.rendezvous(c.output, name)
        c.output.copy_(self.output)
        c.symm_out = self.torch.empty_like(c.output)
        c.symm = (backend.removeprefix("symm-"), name)
        return c

    @property
    def exact(self):
        """Data-movement ops must match bit for bit; reductions may differ in order."""
        return self.op not in ("all_reduce", "reduce_scatter_tensor")


# --------------------------------------------------------------------------- timing

class Timer:
    """Per-iteration timings: host clock on CPU, CUDA events on the current stream on GPU."""

    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device == "cuda"

    def series(self, fn, iters, between=None):
        """Return a list of `iters` durations in ns of fn(); between(i) runs untimed before i."""
        if self.cuda:
            return self._series_cuda(fn, iters, between)
        out = [0] * iters
        clock = time.perf_counter_ns
        for i in range(iters):
            if between is not None:
                between(i)
            t0 = clock()
            fn()
            out[i] = clock() - t0
        return out

    def _series_cuda(self, fn, iters, between):
        cuda = self.torch.cuda
        ev = [(cuda.Event(enable_timing=True), cuda.Event(enable_timing=True))
              for _ in range(iters)]
        for i, (a, b) in enumerate(ev):
            if between is not None:
                between(i)
            a.record()
            fn()
            b.record()
        cuda.synchronize()
        return [int(a.elapsed_time(b) * 1e6) for a, b in ev]


def graph_op(torch, fn, n_ops):
    """CUDA-graph hook: capture n_ops calls of fn in one graph; return a replay callable.

    Timing a replay and dividing by n_ops gives the per-op time without launch overhead. NCCL
    captures today; gosym's collectives are stream-ordered by design, so this becomes live when
    the CUDA data plane lands. Backends that cannot be captured raise here and the case records
    the error.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # first call outside capture: lazy communicator and registration setup
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n_ops):
            fn()
    return graph.replay


# gosym's counters of the CUDA paths (gosym.stats); the rest of an op's launches are staged.
PATH_COUNTERS = ("gpu_ops", "gpu_direct_ops", "gpu_reg_direct_ops", "gpu_ll_moves", "gpu_paced_all_to_all",
                 "gpu_ce_beside", "gpu_dependent_launch")


def path_of(before, after):
    """Which CUDA path a case's ops took, from the counters' growth over its run: 'll' (one
    LL launch), 'direct' (the peers' own buffers), 'relay' (a broadcast by scatter and relay on
    them), 'paced' (gs_a2av), else 'staged', with the
    reduction algorithms that ran (gpu_algo_*) and 'beside' where the copy engines moved this
    rank's own piece on a second stream (GOSYM_GPU_CE_OVERLAP_MIN), and 'pdl' where the kernels
    launched as programmatic dependents (GOSYM_GPU_PDL). Mixed paths are joined with '+'."""
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after if isinstance(after.get(k), int)}
    ops = d.get("gpu_ops", 0)
    if ops <= 0:
        return "none"
    relay = d.get("gpu_relay_ops", 0)  # direct ops that ran gs_bcast_relay
    parts = {"ll": d.get("gpu_ll_moves", 0), "relay": relay, "direct": d.get("gpu_direct_ops", 0) - relay,
             "paced": d.get("gpu_paced_all_to_all", 0)}
    named = sum(parts.values())
    if named < ops:
        parts["staged"] = ops - named
    out = [k for k, v in parts.items() if v > 0]
    algos = sorted(k[len("gpu_algo_"):] for k, v in d.items() if k.startswith("gpu_algo_") and v > 0)
    if d.get("gpu_ce_beside", 0) > 0:
        algos.append("beside")
    if after.get("gpu_dependent_launch") is True:
        algos.append("pdl")
    return "+".join(out) + (f" ({','.join(algos)})" if algos else "")


def stats_us(ns):
    s = sorted(ns)

    def q(p):  # nearest-rank quantile
        return s[min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))] / 1e3
    return {"median_us": q(0.5), "p10_us": q(0.1), "p90_us": q(0.9),
            "min_us": s[0] / 1e3, "mean_us": sum(s) / len(s) / 1e3}


# --------------------------------------------------------------------------- rank side

def turn_order(n):
    """The order in which n backends take their turns (indices, n * n of them, n each): every
    backend follows every backend, itself included, exactly once as the order repeats. A
    turn pays for the one before it (its threads idled, another's woke), and not alike: after
    gosym-hier's turn the next backend's op of 1 KiB was up to 10% slower than after its own
    (session 48; docs/BENCHMARKS.md), where a fixed or rotating order left gosym-flat after
    gosym-hier in most turns. The order is an Euler circuit of the complete directed graph
    with a loop at each vertex (Hierholzer), so every ordered pair is an edge once."""
    if n <= 1:
        return [0] * n
    left = {u: list(range(n - 1, -1, -1)) for u in range(n)}  # edges not yet walked, popped
    stack, circuit = [0], []
    while stack:
        u = stack[-1]
        if left[u]:
            stack.append(left[u].pop())
        else:
            circuit.append(stack.pop())
    circuit.reverse()  # closed: it ends where it starts
    return circuit[:-1]


class Plan:
    """One backend's timed samples of one case: what runs them, how many, and what they took."""

    def __init__(self, backend, case, per_sample):
        self.backend, self.case, self.per_sample = backend, case, per_sample
        self.error = None  # the warmup failed (on some rank): nothing timed
        self.fn, self.iters, self.between = None, 0, None
        self.times = []  # ns per sample, this rank's, over the turns so far
        self.err = None  # this rank's failure in a timed turn
        self.failed = False  # some rank's, as the ranks agreed before a turn
        self.counters = None  # the path counters' growth over the timed turns (gosym on CUDA)

    def count(self, before, after):
        if self.counters is None:
            self.counters = {}
        for k, v in after.items():
            if isinstance(v, bool):  # a setting the run reports, not a count
                self.counters[k] = v
            elif isinstance(v, int):
                self.counters[k] = self.counters.get(k, 0) + v - before.get(k, 0)


class Bench:
    def __init__(self, args):
        import torch
        import torch.distributed as dist
        self.torch, self.dist, self.args = torch, dist, args
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.set_num_threads(args.threads)
        if args.device == "cuda":
            # more ranks than GPUs share them in turn (gosym only: NCCL refuses a shared GPU)
            gpu = self.local_rank % torch.cuda.device_count()
            torch.cuda.set_device(gpu)
            self.device = torch.device("cuda", gpu)
        else:
            self.device = torch.device("cpu")
        self.timer = Timer(torch, args.device)
        self.errors = []  # {"where", "backend", "error"} records for the JSON
        self.gosym = None
        self.groups = {}  # measured backend -> group
        self.failures = {}
        self.ctrl = None
        self.hosts = None  # ranks per host where the gosym group spans hosts
        self.hier_ops = None  # then, the ops that have a schedule across hosts
        self.link = None  # and the link between its hosts (gosym.hier.schedule.link)

    # ---- setup

    def _err(self, where, backend, exc):
        msg = f"{type(exc).__name__}: {exc}"
        self.errors.append({"where": where, "backend": backend, "rank": self.rank, "error": msg,
                            "traceback": traceback.format_exc(limit=8)})
        print(f"[rank {self.rank}] {where} ({backend}) failed: {msg}", file=sys.stderr, flush=True)

    def _all_ok(self, ok):
        """True on every rank iff ok on every rank (control group collective)."""
        t = self.torch.tensor([0 if ok else 1], dtype=self.torch.int32)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=self.ctrl)
        return int(t.item()) == 0

    def setup(self):
        dist, args = self.dist, self.args
        timeout = datetime.timedelta(seconds=args.op_timeout)
        want_gosym = any(b.startswith("gosym") for b in args.backends)
        if want_gosym:
            try:
                import gosym  # registers the backend with torch.distributed
                self.gosym = gosym
            except Exception as e:  # the library may be missing or broken: still run baselines
                self._err("import", "gosym", e)
        # The default group is gosym (the way users run it); if that fails, gloo is the default
        # and gosym gets one more try as a sub-group, which the ranks then agree on. We assume
        # import and default-group failures are symmetric (same library, same host); a rank
        # that fails alone leaves the others to the group timeout and the job's hard timeout.
        default = None
        if self.gosym is not None:
            try:
                dist.init_process_group("gosym", timeout=timeout)
                default = "gosym"
            except Exception as e:
                self._err("init_process_group", "gosym", e)
        if default is None:
            dist.init_process_group("gloo", timeout=timeout)
            default = "gloo"
        self.default_backend = default
        self.ctrl = dist.group.WORLD if default == "gloo" else \
            dist.new_group(backend="gloo", timeout=timeout)
        if default == "gosym":
            self.groups["gosym"] = dist.group.WORLD
        elif self.gosym is not None:
            try:
                g, ok = dist.new_group(backend="gosym", timeout=timeout), True
            except Exception as e:
                self._err("new_group", "gosym", e)
                g, ok = None, False
            if self._all_ok(ok):
                self.groups["gosym"] = g
        if "gosym-bound" in args.backends and "gosym" in self.groups:
            self.groups["gosym-bound"] = self.groups["gosym"]
        for b, (env, cuda_only) in VARIANTS.items():
            if b in args.backends and "gosym" in self.groups and (
                    args.device == "cuda" or not cuda_only):
                self.groups[b] = self._variant(env, timeout)
        st = _try(lambda: self.gosym.stats(self.groups["gosym"]))
        if isinstance(st, dict) and "hier" in st:
            from .hier import schedule

            self.hosts = [len(h) for h in st["hier"]["hosts"]]
            self.link = st["hier"]["link"]
            self.hier_ops = schedule.ops_for(args.device)
        for b in args.backends:
            if b.startswith("gosym"):
                continue
            # every baseline a group of its own, gloo too: the control group's own collectives
            # (the barrier that starts each turn) left it 3-7% faster than a second Gloo group
            # of the same ranks at 1 KiB (1+1 simulated hosts, session 47)
            if b.startswith("symm-"):  # PyTorch symmetric memory rendezvous on an NCCL group
                if "_symm" not in self.groups:
                    self.groups["_symm"] = dist.new_group(backend="nccl", timeout=timeout)
                self.groups[b] = self.groups["_symm"]
            else:
                self.groups[b] = dist.new_group(backend=b, timeout=timeout)

    def _variant(self, env, timeout):
        """A second gosym group made, and set up by a first op, with env set: the group's
        settings (GOSYM_HIER_*) are read at creation, the CUDA tunables at its first CUDA op."""
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            g = self.dist.new_group(backend="gosym", timeout=timeout)
            self.dist.all_reduce(self.torch.zeros(1, device=self.device), group=g)
            if self.args.device == "cuda":
                self.torch.cuda.synchronize()
            return g
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    # ---- one case

    def _agree_max(self, values):
        t = self.torch.tensor(values, dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=self.ctrl)
        return t.tolist()

    def _plan(self, backend, case):
        """Warm up and pick the count of timed samples: a Plan, with its error where the warmup
        failed on any rank; every rank runs the same control collectives."""
        args, group = self.args, self.groups[backend]
        fn = lambda: case.run(group)  # noqa: E731
        graph_ops = args.cuda_graph
        plan = Plan(backend, case, graph_ops or args.batch)  # ops in one timed sample
        if args.batch > 1:
            def fn(one=fn, k=args.batch):
                for _ in range(k):
                    one()
        err = None
        est = 0.0
        try:
            if graph_ops:
                fn = graph_op(self.torch, fn, graph_ops)
            w = self.timer.series(fn, max(1, args.warmup))
            est = sorted(w)[len(w) // 2]
        except Exception as e:
            self._err(f"warmup {case.op} {case.bytes}", backend, e)
            err = e
        est, failed = self._agree_max([est, 1.0 if err else 0.0])
        if failed:
            plan.error = str(err) if err else "failed on another rank"
            return plan
        target_ns = args.target_time * args.iters_scale * 1e9
        plan.iters = int(min(args.max_iters, max(args.min_iters, target_ns // max(est, 1.0))))
        plan.fn = fn
        if args.barrier_every > 0:
            def between(i, k=args.barrier_every):
                if i and i % k == 0:
                    self.dist.barrier(group=group)
            plan.between = between
        return plan

    def _turn(self, plan, n):
        """n more timed samples of plan, after every rank agreed that none failed before (the
        agreement is the turn's barrier); the path counters' growth over them is added up."""
        plan.failed = plan.failed or bool(self._agree_max([1.0 if plan.err else 0.0])[0])
        if plan.failed:
            return
        before = self._path_counters(plan.backend)
        try:
            plan.times += self.timer.series(plan.fn, n, plan.between)
        except Exception as e:
            self._err(f"timed {plan.case.op} {plan.case.bytes}", plan.backend, e)
            plan.err = e
        if before is not None:
            plan.count(before, self._path_counters(plan.backend))

    def measure(self, cases):
        """Time each backend's case (cases: backend -> case) and return backend -> record.

        Without --interleave a backend is warmed up and timed in one turn, then the next. With
        --interleave K every backend is warmed up first, then its samples are spread over the
        same number of turns (about K samples each for the backend with the most) in the order
        of turn_order: a drift of the machine over the case (another tenant, a clock, the page
        cache) then falls on every backend alike, where back to back it fell on whichever ran
        at the time, and so does what a turn leaves to the next."""
        k = self.args.interleave
        if not k:
            plans = []
            for b, case in cases.items():
                plans.append(self._plan(b, case))
                if plans[-1].error is None:
                    self._turn(plans[-1], plans[-1].iters)
            return {p.backend: self._record(p) for p in plans}
        plans = [self._plan(b, case) for b, case in cases.items()]
        live = [p for p in plans if p.error is None]
        if not live:
            return {p.backend: self._record(p) for p in plans}
        need = max(-(-p.iters // k) for p in live)  # turns of the one with the most
        passes = -(-need // len(live))  # a pass of turn_order gives each backend n turns
        turns = passes * len(live)
        done = [0] * len(live)
        for i in turn_order(len(live)) * passes:
            p, t = live[i], done[i]
            done[i] += 1
            n = p.iters * (t + 1) // turns - p.iters * t // turns  # the same on every rank
            if n:
                self._turn(p, n)
        return {p.backend: self._record(p) for p in plans}

    def _record(self, plan):
        """A plan's record from every rank's samples (the max over ranks per sample)."""
        if plan.error is not None:
            return {"error": plan.error}
        times = plan.times + [0] * (plan.iters - len(plan.times))  # the same length everywhere
        t = self.torch.tensor([1 if plan.err or plan.failed else 0] + times, dtype=self.torch.int64)
        allt = [self.torch.empty_like(t) for _ in range(self.world)]
        self.dist.all_gather(allt, t, group=self.ctrl)
        if any(int(x[0]) for x in allt):
            return {"error": str(plan.err) if plan.err else "failed on another rank"}
        per_iter = self.torch.stack(allt)[:, 1:].max(dim=0).values.tolist()
        if plan.per_sample > 1:  # one timed replay or batch holds per_sample collectives
            per_iter = [v / plan.per_sample for v in per_iter]
            times = [v / plan.per_sample for v in times]
        rec = {"iters": plan.iters, "warmup": self.args.warmup, **stats_us(per_iter),
               "rank0_median_us": stats_us(times)["median_us"]}
        t_s = rec["median_us"] / 1e6
        rec["algbw_GBps"] = plan.case.bytes / t_s / 1e9
        rec["busbw_GBps"] = plan.case.bus_bytes / t_s / 1e9
        if plan.counters is not None:
            rec["path"] = path_of({}, plan.counters)
        return rec

    def check(self, backend, case):
        """Compare one run on `backend` with gloo on CPU copies of the same input."""
        torch = self.torch
        rec, ok, err = {}, True, None
        ref = case.result(self.ctrl, "cpu")
        try:
            got = case.result(self.groups[backend], self.device)
            if case.exact:
                ok = torch.equal(got, ref)
            else:
                ok = torch.allclose(got, ref, rtol=1e-5, atol=1e-5 * self.world)
            rec["max_abs_err"] = (got - ref).abs().max().item() if got.numel() else 0.0
        except Exception as e:
            self._err(f"check {case.op} {case.bytes}", backend, e)
            ok, err = False, e
        bad, failed = self._agree_max([0.0 if ok else 1.0, 1.0 if err else 0.0])
        rec["ok"] = not bad
        if failed:
            rec["error"] = str(err) if err else "failed on another rank"
        return rec

    def memcpy(self, nbytes):
        """Rank 0 alone: median dst.copy_(src) of nbytes between preallocated tensors."""
        n = max(1, nbytes // ELEM)
        src = self.torch.randn(n).to(self.device)
        dst = self.torch.empty_like(src)
        fn = lambda: dst.copy_(src)  # noqa: E731
        w = self.timer.series(fn, max(1, self.args.warmup))
        est = max(1, sorted(w)[len(w) // 2])
        iters = int(min(self.args.max_iters, max(self.args.min_iters,
                                                 0.1 * self.args.iters_scale * 1e9 // est)))
        st = stats_us(self.timer.series(fn, iters))
        return {"bytes": n * ELEM, "iters": iters, **st,
                "GBps": n * ELEM / (st["median_us"] / 1e6) / 1e9}

    # ---- the run

    def run(self):
        args = self.args
        t_start = time.time()
        self.setup()
        measured = [b for b in args.backends if b in self.groups]
        baselines = [b for b in args.backends if not b.startswith("gosym")]
        main = next((b for b in measured if b.startswith("gosym")), "gosym")
        base = baselines[0] if baselines else None
        table = Table(self.rank == 0, main, base, "gosym-bound" if "gosym-bound" in measured else None)

        memcpy = {}
        for size in args.sizes:
            if self.rank == 0:
                memcpy[size] = self.memcpy(size)
            self.dist.barrier(group=self.ctrl)

        results, checks = [], []
        for op in args.ops:
            for size in args.sizes:
                case = Case(self.torch, op, size, self.rank, self.world, self.device)
                row = {"op": op, "size": size, "bytes": case.bytes}
                backends = [b for b in measured if self.failures.get(b, 0) < args.max_errors and
                            (op == "all_reduce" or not b.startswith(("symm-", "gosym-sema")))]
                # measured together: every backend where they take turns, else one at a time
                for together in [backends] if args.interleave else [[b] for b in backends]:
                    cases = {}
                    for b in together:
                        bc = case.bound(self.gosym) if b == "gosym-bound" else case
                        if b.startswith("symm-"):  # all-reduce algorithms only (above)
                            bc = case.symmetric(b, self.groups[b])
                        if not args.no_check and b != "gloo":  # gloo is the reference
                            c = {"backend": b, "op": op, "size": size, **self.check(b, bc)}
                            checks.append(c)
                            row[b + "_ok"] = c["ok"]
                        cases[b] = bc
                    for b, rec in self.measure(cases).items():
                        r = {"backend": b, "op": op, "size": size, "bytes": case.bytes,
                             "bus_bytes": case.bus_bytes, **rec}
                        if "error" in r:
                            self.failures[b] = self.failures.get(b, 0) + 1
                        results.append(r)
                        row[b] = r
                    del cases
                if self.rank == 0:
                    table.row(row, memcpy.get(size))
                del case

        errors = self._gather_errors()
        if self.rank == 0:
            report = {
                "machine": machine_info(self.torch, self.world, self.gosym, args.device),
                "config": dict(vars(args)),
                # what the run set (a table of choices reads which variant a report measured)
                "settings": {k: v for k, v in sorted(os.environ.items()) if k.startswith("GOSYM_")},
                "default_backend": self.default_backend,
                "hosts": self.hosts,
                "link": self.link,
                # the ops with a schedule across hosts in this build: what a hierarchical
                # backend (gosym-hier) measured as itself (scripts/hier_table.py)
                "hier_ops": self.hier_ops,
                "measured_backends": measured,
                "method": {
                    "latency": "per-iteration wall time (perf_counter_ns, or CUDA events), max "
                               "over ranks per iteration, then median/p10/p90 over iterations",
                    "busbw": "nccl-tests conventions; all_to_all: bytes leaving the rank / t",
                    "memcpy": "rank 0 alone, dst.copy_(src), bytes/t (one direction)",
                    "check": "gloo on CPU copies of the same inputs is the reference",
                    "order": f"backends in alternating turns of about {args.interleave} samples"
                             if args.interleave else "one backend's samples after another's",
                },
                "memcpy": [{"size": s, **m} for s, m in memcpy.items()],
                "results": results,
                "checks": checks,
                "errors": errors,
                "elapsed_s": time.time() - t_start,
            }
            path = args.json or default_json_path(args.device)
            with open(path, "w") as f:
                json.dump(report, f, indent=1)
            table.footer(report)
            print(f"wrote {path}", flush=True)
            if args.plot:
                plot(report, args.plot, main, baselines)
        self.dist.destroy_process_group()
        # Checks are agreed on by all ranks, so every rank exits alike.
        return 1 if any(not c["ok"] for c in checks) else 0

    def _path_counters(self, backend):
        """This rank's gosym counters that tell which path a CUDA op took (None for other
        backends and host ops)."""
        if not backend.startswith("gosym") or self.args.device != "cuda" or self.gosym is None:
            return None
        st = self.gosym.stats(self.groups[backend])
        return {k: v for k, v in st.items() if k in PATH_COUNTERS or k.startswith("gpu_algo_")}

    def _gather_errors(self):
        """Every rank's error records, for rank 0's JSON."""
        out = [None] * self.world
        self.dist.all_gather_object(out, self.errors, group=self.ctrl)
        return [e for part in out for e in part]


# --------------------------------------------------------------------------- output

class Table:
    """Rank 0's streaming table: one row per (op, size) as soon as it is measured."""

    def __init__(self, enabled, main, base, bound=None):
        self.enabled, self.main, self.base, self.bound = enabled, main, base, bound
        bn = base or "-"
        self.cols = [("op", 24), ("size", 6), (f"{main} us", 11), (f"{bn} us", 11),
                     (f"{bn}/{main}", 10), (f"{main} GB/s", 11), (f"{bn} GB/s", 11),
                     ("memcpy GB/s", 11), ("check", 5), ("path", 1)]
        if bound:
            self.cols[5:5] = [("bound us", 10), (f"{bn}/bound", 10), ("bound GB/s", 10)]
        if enabled:
            print(self._fmt([c for c, _ in self.cols]))
            print(self._fmt(["-" * w for _, w in self.cols]), flush=True)

    def _fmt(self, cells):
        last = len(self.cols) - 1  # the path: left-aligned, as wide as it is
        return "  ".join(f"{c:<{w}}" if i < 2 or i == last else f"{c:>{w}}"
                         for i, (c, (_, w)) in enumerate(zip(cells, self.cols))).rstrip()

    def row(self, row, memcpy):
        def val(b, key, fmt):
            r = row.get(b)
            if not r:
                return "-"
            return "ERR" if "error" in r else fmt(r[key])
        us = "{:.1f}".format
        m, b = row.get(self.main), row.get(self.base)
        ratio = "-"
        if m and b and "error" not in m and "error" not in b:
            ratio = f"{b['median_us'] / m['median_us']:.2f}x"
        oks = [row.get(k + "_ok") for k in (self.main, self.bound) if k]
        ok = None if all(o is None for o in oks) else all(o is not False for o in oks)
        cells = [row["op"], fmt_size(row["size"]), val(self.main, "median_us", us),
                 val(self.base, "median_us", us), ratio, val(self.main, "busbw_GBps", fmt_bw),
                 val(self.base, "busbw_GBps", fmt_bw), fmt_bw(memcpy["GBps"]) if memcpy else "-",
                 "-" if ok is None else ("ok" if ok else "BAD"), (m or {}).get("path", "")]
        if self.bound:
            bd = row.get(self.bound)
            bratio = "-"
            if bd and b and "error" not in bd and "error" not in b:
                bratio = f"{b['median_us'] / bd['median_us']:.2f}x"
            cells[5:5] = [val(self.bound, "median_us", us), bratio, val(self.bound, "busbw_GBps", fmt_bw)]
        print(self._fmt(cells), flush=True)

    def footer(self, report):
        mach = report["machine"]
        print(f"\n{mach['world_size']} ranks on {mach['cpu_model']} ({mach['nproc']} cpus), "
              f"torch {mach['torch']}, gosym {mach.get('gosym_version')}, "
              f"{report['elapsed_s']:.0f}s")
        bad = [c for c in report["checks"] if not c["ok"]]
        if bad:
            print(f"CORRECTNESS FAILURES: {len(bad)} case(s): " +
                  ", ".join(f"{c['backend']} {c['op']} {fmt_size(c['size'])}" for c in bad))
        seen = {}  # the same failure usually happens on every rank: print it once
        for e in report["errors"]:
            seen.setdefault((e["where"], e["backend"], e["error"]), []).append(e["rank"])
        for (where, backend, msg), ranks in seen.items():
            print(f"error: {where} ({backend}) on rank(s) {ranks}: {msg}")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _try(fn):
    try:
        return fn()
    except Exception as e:  # informational only: never fail the report over it
        return f"unavailable ({type(e).__name__})"


def machine_info(torch, world, gosym, device):
    info = {
        "hostname": platform.node(),
        "nproc": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "world_size": world,
        "gosym_version": getattr(gosym, "__version__", None) if gosym else None,
        "gosym_engine": _try(lambda: gosym.engine_version()) if gosym else None,
        "device": device,
    }
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    return info


def default_json_path(device):
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return os.path.join(os.environ.get("OUT") or os.getcwd(), f"bench-{device}-{stamp}.json")


def plot(report, path, main, baselines):
    """Bus bandwidth against size, one panel per op; silently skipped without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return
    ops = list(dict.fromkeys(r["op"] for r in report["results"]))
    if not ops:
        return
    cols = min(3, len(ops))
    rows = math.ceil(len(ops) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    mem = sorted((m["size"], m["GBps"]) for m in report["memcpy"])
    for ax, op in zip(axes.flat, ops):
        for b in [main, *baselines]:
            pts = sorted((r["size"], r["busbw_GBps"]) for r in report["results"]
                         if r["op"] == op and r["backend"] == b and r.get("busbw_GBps", 0) > 0)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=b)
        if mem:
            ax.plot(*zip(*mem), linestyle="--", color="grey", label="memcpy")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")  # small and large messages differ by orders of magnitude
        ax.set_title(op)
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel("bus GB/s")
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(ops):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}", flush=True)


def pin(k, local_rank):
    """Pins this rank to k CPUs of its own (--pin); applies to threads started after it."""
    if k <= 0 or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    mine = cpus[local_rank * k:(local_rank + 1) * k]
    if len(mine) == k:
        os.sched_setaffinity(0, mine)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return launch(args, argv)
    pin(args.pin, int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))
    return Bench(args).run()


if __name__ == "__main__":
    sys.exit(main())
