"""Host cost per call, layer by layer: where the host time of one small eager op goes, beside
torch's do-nothing process groups.

``python -m gosym.callcost [--device cuda] [--nproc N] [--numel 256] [--calls 200]
[--bursts 40] [--json F]`` runs one torchrun job. Every rank times bursts of back-to-back calls
of each layer (perf_counter_ns around a burst; on CUDA the device is synchronized between
bursts, untimed, so the launch queue never fills and only the host is timed) and takes the
median per call over the bursts; the table gives the slowest rank's median.

Layers, for all_reduce and broadcast (in place), all_gather_into_tensor, reduce_scatter_tensor
and all_to_all_single of --numel float32 per rank (a multiple of the world size):

- ``torch fake group``: dist.<op> on torch's FakeProcessGroup, a C++ group that does nothing:
  the floor of torch's Python wrapper and dispatcher.
- ``torch null Python group``: dist.<op> on a Python ProcessGroup whose methods return None
  (no Work: torch skips the wait), the floor for any backend written in Python.
- ``gosym dist.<op>``: what a user pays: torch's C++ group and gosym._c10d's backend where
  that is built (gosym.c10d), else the Python group.
- ``gosym dist.<op>, Python group``: the same on a group created with GOSYM_C10D=0, which
  torch calls through its Python methods; the layers below are that group's.
- ``gosym method``: the group's method called directly, without torch's wrapper.
- ``gosym method, bare``: the same without the wrapper every op method has (gosym.forms'
  call forms and gosym.profiling's check for a running profiler).
- ``native call``: the one gosym_op_run the method makes, replayed with the descriptor it
  passed: ctypes, the Go engine and the CUDA driver (and on the CPU the collective itself).
- ``ctypes floor``: a native call that does nothing (gosym_abi_version).
- ``driver``: host time inside CUDA driver calls during the native call, as the engine counts
  it while timing is on (gosym_driver_timing), and the driver calls per op.
- ``record_stream``: one Tensor.record_stream, which gosym's CUDA path makes per tensor.
- ``gosym method, bare, no native call``: the bare method with its native call replaced by a
  Python function that does nothing: gosym's Python measured alone, not as a difference
  (where it is well below the derived row, the native call costs more inside the method than
  replayed alone: caches, or the GIL that ctypes gives up and takes back).
- ``native call, GIL held``: the replay through a ctypes.PyDLL binding of the same export,
  which keeps the GIL across the call (ctypes.CDLL gives it up and takes it back).
- ``Python threads``: the threads alive in the rank while it measured (a thread that wants the
  GIL when ctypes gives it up can take it).

The derived rows split the Python group's total: torch's wrapper (dist.<op> on the Python
group - method), the entry wrapper (method - bare), gosym's Python (bare - native call), Go
(native call - ctypes floor - driver).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import inspect
import json
import os
import statistics
import sys
import tempfile
import threading
import time

from ._torchrun import module_job, run_job

_OUT_ENV = "GOSYM_CALLCOST_OUT"
OPS = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
       "all_to_all_single")


def _null_group_class(dist):
    """A Python ProcessGroup whose ops do nothing and return no Work."""

    class NullGroup(dist.ProcessGroup):
        def __init__(self, rank, size):
            super().__init__(rank, size)

        def _get_backend(self, device):
            return self

        def allreduce(self, tensors, opts=None):
            return None

        def broadcast(self, tensors, opts=None):
            return None

        def _allgather_base(self, output, input, opts=None):
            return None

        def _reduce_scatter_base(self, output, input, opts=None):
            return None

        def alltoall_base(self, output, input, output_split_sizes, input_split_sizes,
                          opts=None):
            return None

        def getBackendName(self):
            return "gosym-null"

    return NullGroup


def _per_call_ns(fn, calls, bursts, sync):
    """Median ns per call of fn over bursts of `calls` back-to-back calls (two untimed bursts
    first), with sync() between bursts."""
    samples = []
    for b in range(bursts + 2):
        sync()
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter_ns()
        if b >= 2:
            samples.append((t1 - t0) / calls)
    sync()
    return statistics.median(samples)


def _captured_native(gosym_backend, gosym_streams, call):
    """(endpoint, desc) of the one gosym_op_run that call() makes, recorded on its way through
    (the op runs)."""
    seen = []
    real_b, real_s = gosym_backend._run, gosym_streams._run

    def record(h, desc):
        seen.append((h, desc))
        real_b(h, desc)

    gosym_backend._run = gosym_streams._run = record
    try:
        call()
    finally:
        gosym_backend._run, gosym_streams._run = real_b, real_s
    if len(seen) != 1:
        raise RuntimeError(f"gosym.callcost: expected one native call per op, saw {len(seen)}")
    return seen[0]


@contextlib.contextmanager
def _no_native(gosym_backend, gosym_streams):
    """The group's native call replaced by a Python function that does nothing."""
    real_b, real_s = gosym_backend._run, gosym_streams._run
    gosym_backend._run = gosym_streams._run = lambda h, desc: None
    try:
        yield
    finally:
        gosym_backend._run, gosym_streams._run = real_b, real_s


def _rank_main(device, numel, calls, bursts):
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed import fake_pg  # noqa: F401 (registers "fake")

    import gosym
    from gosym import _lib, _streams
    from gosym import backend as gosym_backend

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if device == "cuda":
        idx = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(idx)
        dev = torch.device("cuda", idx)

        def sync():
            torch.cuda.synchronize()
    else:
        dev = torch.device("cpu")

        def sync():
            pass

    null_cls = _null_group_class(dist)
    dist.Backend.register_backend("gosymnull", lambda store, r, s, timeout: null_cls(r, s),
                                  devices=["cpu", "cuda"])
    dist.init_process_group("gosym")
    pg = gosym.group()  # the Python group behind torch's (gosym._c10d's backend, if built)
    os.environ["GOSYM_C10D"] = "0"  # read at creation: this group is the Python one itself
    python_group = dist.new_group(backend="gosym")
    del os.environ["GOSYM_C10D"]
    fake = dist.new_group(backend="fake")
    null = dist.new_group(backend="gosymnull")
    ctrl = dist.new_group(backend="gloo")
    x = torch.zeros(numel, device=dev)
    out = torch.zeros(numel * world, device=dev)
    part = torch.zeros(numel // world, device=dev)  # reduce_scatter_tensor's output
    c10d = torch._C._distributed_c10d
    opts = {name: getattr(c10d, name)() for name in ("AllreduceOptions", "BroadcastOptions",
                                                      "AllgatherOptions", "ReduceScatterOptions",
                                                      "AllToAllOptions")}
    for o in opts.values():
        o.asyncOp = False  # as dist.<op>(async_op=False) passes them
    AR, BC, AG, RS, AA = opts.values()
    cls = type(pg)

    def forms(method, *args):
        """The op's group method called with args, with and without its wrappers."""
        wrapped, bare = getattr(cls, method), inspect.unwrap(getattr(cls, method))
        return dict(method=lambda: wrapped(pg, *args), bare=lambda: bare(pg, *args))

    ops = {
        "all_reduce": dict(dist=lambda g=None: dist.all_reduce(x, group=g),
                           **forms("allreduce", [x], AR)),
        "broadcast": dict(dist=lambda g=None: dist.broadcast(x, 0, group=g),
                          **forms("broadcast", [x], BC)),
        "all_gather_into_tensor": dict(
            dist=lambda g=None: dist.all_gather_into_tensor(out, x, group=g),
            **forms("_allgather_base", out, x, AG)),
        "reduce_scatter_tensor": dict(
            dist=lambda g=None: dist.reduce_scatter_tensor(part, x, group=g),
            **forms("_reduce_scatter_base", part, x, RS)),
        "all_to_all_single": dict(
            dist=lambda g=None: dist.all_to_all_single(out[:numel], x, group=g),
            **forms("alltoall_base", out[:numel], x, [], [], AA)),
    }
    rows = {}

    def timed(name, fn):
        dist.barrier(group=ctrl)
        rows[name] = _per_call_ns(fn, calls, bursts, sync) / 1e3

    # The native call must do what the method does: its data checked once, on fresh values.
    x.copy_(torch.arange(numel, device=dev) + rank)
    h, desc = _captured_native(gosym_backend, _streams, ops["all_reduce"]["method"])
    _lib.run(h, desc)  # the replay: a second all_reduce of the first's result
    want = (torch.arange(numel, device=dev, dtype=torch.float64) * world
            + world * (world - 1) / 2) * world
    if not torch.equal(x.double(), want):
        raise AssertionError(f"rank {rank}: the replayed native all_reduce gave a wrong result")
    x.zero_()

    held = ctypes.PyDLL(_lib.lib._name).gosym_op_run
    held.restype, held.argtypes = _lib.op_run.restype, _lib.op_run.argtypes
    rows["Python threads"] = threading.active_count()
    stats = _lib.process_stats_json
    n_timed = calls * (bursts + 2)  # the calls one timed() makes, its untimed bursts included
    for op, fns in ops.items():
        timed(f"{op}: torch fake group", lambda: fns["dist"](fake))
        timed(f"{op}: torch null Python group", lambda: fns["dist"](null))
        timed(f"{op}: gosym dist.{op}", fns["dist"])
        timed(f"{op}: gosym dist.{op}, Python group", lambda: fns["dist"](python_group))
        timed(f"{op}: gosym method", fns["method"])
        timed(f"{op}: gosym method, bare", fns["bare"])
        h, desc = _captured_native(gosym_backend, _streams, fns["method"])
        timed(f"{op}: native call", lambda: _lib.op_run(h, desc))
        timed(f"{op}: native call, GIL held", lambda: held(h, desc))
        with _no_native(gosym_backend, _streams):
            timed(f"{op}: gosym method, bare, no native call", fns["bare"])
        before = json.loads(stats())
        _lib.lib.gosym_driver_timing(1)
        timed(f"{op}: native call, driver timed", lambda: _lib.op_run(h, desc))
        _lib.lib.gosym_driver_timing(0)
        after = json.loads(stats())
        rows[f"{op}: driver"] = (after["driver_ns"] - before["driver_ns"]) / n_timed / 1e3
        rows[f"{op}: driver calls per op"] = (after["driver_calls"] - before["driver_calls"]) / n_timed
        x.zero_()
    abi = _lib.lib.gosym_abi_version
    timed("ctypes floor", abi)
    if device == "cuda":
        s = torch.cuda.current_stream()
        timed("record_stream", lambda: x.record_stream(s))
    if rank == 0 and gosym.stats()["gpu_ops" if device == "cuda" else "posted"] == 0:
        raise AssertionError("gosym.callcost: no op reached the engine's plane")
    with open(os.path.join(os.environ[_OUT_ENV], f"rank{rank}.json"), "w") as f:
        json.dump(rows, f)
    dist.destroy_process_group()


def derived(row):
    """The split of one op's total into torch's wrapper, gosym's Python, Go and the driver."""
    out = {}
    for op in OPS:
        r = {k.split(": ", 1)[1]: v for k, v in row.items() if k.startswith(op + ": ")}
        if not r:
            continue
        out[f"{op}: = torch's wrapper"] = r[f"gosym dist.{op}, Python group"] - r["gosym method"]
        out[f"{op}: = entry wrapper"] = r["gosym method"] - r["gosym method, bare"]
        out[f"{op}: = gosym's Python"] = r["gosym method, bare"] - r["native call"]
        out[f"{op}: = ctypes"] = row["ctypes floor"]
        out[f"{op}: = Go"] = r["native call"] - row["ctypes floor"] - r["driver"]
        out[f"{op}: = driver"] = r["driver"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gosym.callcost",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--nproc", type=int, default=None, help="ranks (default: every GPU on CUDA, "
                                                           "2 on CPU)")
    p.add_argument("--numel", type=int, default=256, help="float32 elements per rank (1 KiB)")
    p.add_argument("--calls", type=int, default=200, help="back-to-back calls per burst")
    p.add_argument("--bursts", type=int, default=40, help="timed bursts per layer")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds the job may take")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--rank-of", nargs=4, metavar=("DEVICE", "NUMEL", "CALLS", "BURSTS"),
                   help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.rank_of:
        d, n, c, b = a.rank_of
        _rank_main(d, int(n), int(c), int(b))
        return 0
    if a.numel < 1 or a.calls < 1 or a.bursts < 1:
        p.error("--numel, --calls and --bursts must be at least 1")
    nproc = a.nproc
    if nproc is None:
        import torch

        nproc = torch.cuda.device_count() if a.device == "cuda" else 2
    if a.numel % nproc:
        p.error(f"--numel must be a multiple of the {nproc} ranks (reduce_scatter_tensor)")
    with tempfile.TemporaryDirectory(prefix="gosym-callcost-") as tmp:
        cmd, env = module_job(nproc, "gosym.callcost", "--rank-of", a.device, str(a.numel),
                              str(a.calls), str(a.bursts), env=dict(os.environ, **{_OUT_ENV: tmp}))
        res = run_job(cmd, env, a.timeout)
        if res.returncode != 0:
            print(res.stdout[-4000:], res.stderr[-8000:], sep="\n", file=sys.stderr)
            return res.returncode or 1
        ranks = [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(nproc)]
    row = {k: max(r[k] for r in ranks) for k in ranks[0]}
    row.update(derived(row))
    print(f"host cost per call, {a.device}, {nproc} ranks, {a.numel} float32 per rank "
          f"(slowest rank's median over {a.bursts} bursts of {a.calls} calls), us")
    for k, v in row.items():
        print(f"  {k:58} {v:8.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": a.device, "nproc": nproc, "numel": a.numel, "calls": a.calls,
                       "bursts": a.bursts, "us": row}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
