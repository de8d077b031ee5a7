"""Failure scenarios: a rank that never arrives or dies, arguments that disagree
across ranks, and calls every rank makes wrongly. Each rank records what it
saw (exception type, message, how long it took); the test judges.

Scenarios (--scenario):
  skip         the last rank stays alive but skips an all_reduce
  skip-recv    the others recv from the last rank, which stays alive and never sends
  die-sigkill  the last rank SIGKILLs itself instead of joining an all_reduce
  die-exit     the last rank os._exit()s instead of joining
  die-during   the last rank is SIGKILLed while every rank loops on large all_reduces
  bystander-exit  (3 ranks) rank 1 leaves while rank 2 sends to rank 0, which is already
               waiting in its recv: the receives succeed; a collective afterwards fails
               naming rank 1
  mismatch     ranks disagree on sizes/dtypes/ops, one fresh group per case
  local        every rank makes the same invalid call; the group must stay usable
  devices      like local, with tensors of one call on different devices (CUDA)
"""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time

import torch
import torch.distributed as dist
import wcommon as wc


def describe(e: BaseException | None, elapsed: float) -> dict | None:
    if e is None:
        return None
    return {
        "type": f"{type(e).__module__}.{type(e).__name__}",
        "message": str(e),
        "is_runtime_error": isinstance(e, RuntimeError),
        "is_backend_error": isinstance(e, dist.DistBackendError),
        "is_clear": isinstance(e, wc.CLEAR_ERRORS),
        "elapsed": round(elapsed, 3),
    }


def attempt(fn) -> dict:
    """Runs fn; returns how it ended (error is None when it returned)."""
    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test inspects whatever came out
        return {"error": describe(e, time.monotonic() - t0)}
    return {"error": None, "elapsed": round(time.monotonic() - t0, 3)}


def subgroup(op_timeout: float):
    return dist.new_group(timeout=datetime.timedelta(seconds=op_timeout))


def check_sane(group, rank: int, world: int) -> None:
    """A plain all_reduce on ``group`` still gives the right answer."""
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t, group=group)
    if not bool((t == world * (world + 1) / 2).all()):
        raise AssertionError(f"all_reduce gave {t.tolist()}")


def teardown(res: dict, group) -> None:
    """Destroying broken groups must neither hang nor crash; record how it went."""
    res["destroy_group"] = attempt(lambda: dist.destroy_process_group(group))
    wc.write_result(res)
    res["destroy_default"] = attempt(dist.destroy_process_group)
    wc.write_result(res)


def missing_rank(args, rank, world) -> None:
    """skip* / die-*: the last rank does not take part in an all_reduce (or send)."""
    victim = world - 1
    g = subgroup(args.op_timeout)
    t = torch.ones(1025)
    dist.all_reduce(t, group=g)  # one good op first, so the failing one has seq > 0
    res = {"rank": rank, "victim": victim, "warmup_ok": bool((t == world).all())}
    wc.write_result(res)
    if rank == victim:
        if args.scenario.startswith("skip"):
            time.sleep(args.op_timeout + 8)  # alive, silent, until the others gave up
            res["skipped"] = True
            wc.write_result(res)
            os._exit(0)
        if args.scenario == "die-sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if args.scenario == "die-exit":
            os._exit(7)
        # die-during: killed from a timer while inside large collectives.
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGKILL)).start()

    big = torch.ones(wc.LARGE)

    def loop():
        if args.scenario == "skip-recv":
            dist.recv(t, src=victim, group=g)
            return
        if args.scenario != "die-during":
            dist.all_reduce(t, group=g)
            return
        for _ in range(10_000):
            dist.all_reduce(big, group=g)

    res.update(attempt(loop))
    teardown(res, g)


def bystander_exit(args, rank, world) -> None:
    assert world == 3, "bystander-exit is written for 3 ranks"
    g = subgroup(args.op_timeout)
    dist.barrier(group=g)
    res = {"rank": rank}
    wc.write_result(res)
    if rank == 1:  # leaves cleanly at once: destroys its groups and exits
        dist.destroy_process_group(g)
        dist.destroy_process_group()
        os._exit(0)
    ack = torch.zeros(1)
    if rank == 2:
        time.sleep(1.0)  # rank 1 is gone by now, rank 0 waits in its first recv

        def send2():
            for i in range(2):
                dist.send(torch.full((3,), 42.0 + i), dst=0, group=g)
            dist.recv(ack, src=0, group=g)

        res["p2p"] = attempt(send2)
    else:
        got = []

        def recv2():
            for _ in range(2):
                t = torch.zeros(3)
                dist.recv(t, src=2, group=g)
                got.append(t.tolist())
            dist.send(ack, dst=2, group=g)

        res["p2p"] = attempt(recv2)
        res["got"] = got
    wc.write_result(res)
    res["collective_after"] = attempt(lambda: dist.all_reduce(torch.ones(4), group=g))
    teardown(res, g)


MISMATCHES = {
    # name: fn(rank) performing the disagreeing call on group g
    "count": lambda r, g: dist.all_reduce(torch.ones(5 + 2 * r), group=g),
    "dtype": lambda r, g: dist.all_reduce(torch.ones(6, dtype=(torch.float32, torch.float64)[r % 2]), group=g),
    "dtype_same_size": lambda r, g: dist.all_reduce(torch.ones(6, dtype=(torch.float32, torch.int32)[r % 2]),
                                                    group=g),
    "reduce_op": lambda r, g: dist.all_reduce(torch.ones(6), op=(dist.ReduceOp.SUM, dist.ReduceOp.MAX)[r % 2],
                                              group=g),
    "op_kind": lambda r, g: (dist.all_reduce(torch.ones(6), group=g) if r % 2 == 0
                             else dist.broadcast(torch.ones(6), src=0, group=g)),
    "broadcast_root": lambda r, g: dist.broadcast(torch.ones(6), src=r % 2, group=g),
    "all_gather_count": lambda r, g: dist.all_gather_into_tensor(
        torch.empty(g.size() * (4 + 2 * r)), torch.ones(4 + 2 * r), group=g),
    "reduce_scatter_count": lambda r, g: dist.reduce_scatter_tensor(
        torch.empty(3 + r), torch.ones(g.size() * (3 + r)), group=g),
    # rank 0 sends 3 elements to rank 1, which expects 2
    "all_to_all_splits": lambda r, g: dist.all_to_all_single(
        torch.empty(2 * g.size()), torch.ones(2 * g.size() + (r == 0)), [2] * g.size(),
        [2, 3] + [2] * (g.size() - 2) if r == 0 else [2] * g.size(), group=g),
}


def mismatch(args, rank, world) -> None:
    res = {"rank": rank, "cases": {}}
    for name, fn in MISMATCHES.items():
        g = subgroup(args.op_timeout)
        res["cases"][name] = attempt(lambda: fn(rank, g))
        res["cases"][name]["destroy"] = attempt(lambda: dist.destroy_process_group(g))
        wc.write_result(res)
    fresh = subgroup(args.op_timeout)
    res["sane_after"] = attempt(lambda: check_sane(fresh, rank, world))
    wc.write_result(res)


def local_cases(rank: int, world: int) -> dict:
    """Invalid calls made identically on every rank: must raise before any exchange."""
    f32 = torch.ones(6)

    def bad_dtype(dtype):
        return lambda: dist.all_reduce(torch.ones(6).to(dtype))

    cases = {
        # complex reduce/reduce_scatter reach the backend as complex: SUM and AVG work, not these
        "complex64_reduce_max": lambda: dist.reduce(torch.ones(6, dtype=torch.complex64), dst=0,
                                                    op=dist.ReduceOp.MAX),
        "complex64_reduce_scatter_tensor_product": lambda: dist.reduce_scatter_tensor(
            torch.empty(6, dtype=torch.complex64), torch.ones(world * 6, dtype=torch.complex64),
            op=dist.ReduceOp.PRODUCT),
        "sparse_max": lambda: dist.all_reduce(torch.eye(3).to_sparse(), op=dist.ReduceOp.MAX),
        "uint16": bad_dtype(torch.uint16),
        "uint32": bad_dtype(torch.uint32),
        "uint64": bad_dtype(torch.uint64),
        "float8_e4m3fn": bad_dtype(torch.float8_e4m3fn),
        "avg_int32": lambda: dist.all_reduce(torch.ones(6, dtype=torch.int32), op=dist.ReduceOp.AVG),
        "avg_bool": lambda: dist.all_reduce(torch.ones(6, dtype=torch.bool), op=dist.ReduceOp.AVG),
        "premul_int64": lambda: dist.all_reduce(torch.ones(6, dtype=torch.int64), op=dist._make_nccl_premul_sum(2.0)),
        "band_float32": lambda: dist.all_reduce(torch.ones(6), op=dist.ReduceOp.BAND),
        "all_gather_into_tensor_wrong_size": lambda: dist.all_gather_into_tensor(torch.empty(world * 6 + 1), f32),
        "all_gather_wrong_dtype": lambda: dist.all_gather([torch.empty(6, dtype=torch.float64)] * world, f32),
        "all_gather_wrong_list_len": lambda: dist.all_gather([torch.empty(6) for _ in range(world + 1)], f32),
        "reduce_scatter_tensor_wrong_size": lambda: dist.reduce_scatter_tensor(torch.empty(6),
                                                                               torch.ones(world * 6 + 2)),
        "reduce_scatter_wrong_dtype": lambda: dist.reduce_scatter(torch.empty(6),
                                                                  [torch.ones(6, dtype=torch.float64)] * world),
        "all_to_all_single_bad_splits": lambda: dist.all_to_all_single(torch.empty(world * 6), torch.ones(world * 6),
                                                                       [6] * world, [7] * world),
        "all_to_all_single_indivisible": lambda: dist.all_to_all_single(torch.empty(world * 6 + 1),
                                                                        torch.ones(world * 6 + 1)),
    }
    out = {}
    for name, fn in cases.items():
        out[name] = attempt(fn)
        out[name]["sane_after"] = attempt(lambda: check_sane(None, rank, world))
    return out


def device_cases(rank: int, world: int) -> dict:
    """Tensors of one call on different devices (needs CUDA)."""
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    cases = {
        "all_gather_into_tensor_cpu_out_cuda_in": lambda: dist.all_gather_into_tensor(
            torch.empty(world * 6), torch.ones(6, device=dev)),
        "reduce_scatter_tensor_cuda_out_cpu_in": lambda: dist.reduce_scatter_tensor(
            torch.empty(6, device=dev), torch.ones(world * 6)),
        "all_to_all_single_mixed": lambda: dist.all_to_all_single(torch.empty(world * 6, device=dev),
                                                                  torch.ones(world * 6)),
    }
    out = {}
    for name, fn in cases.items():
        out[name] = attempt(fn)
        out[name]["sane_after"] = attempt(lambda: check_sane(None, rank, world))
    return out


def main():
    def extra(p):
        p.add_argument("--scenario", required=True)
        p.add_argument("--op-timeout", type=float, default=5.0, help="timeout of the group under test, s")

    args = wc.setup(extra)
    rank, world = wc.init(args.backend, args.timeout)
    if args.scenario in ("skip", "skip-recv", "die-sigkill", "die-exit", "die-during"):
        missing_rank(args, rank, world)
    elif args.scenario == "bystander-exit":
        bystander_exit(args, rank, world)
    elif args.scenario == "mismatch":
        mismatch(args, rank, world)
    elif args.scenario == "local":
        wc.write_result({"rank": rank, "cases": local_cases(rank, world)})
    elif args.scenario == "devices":
        wc.write_result({"rank": rank, "cases": device_cases(rank, world)})
    else:
        raise SystemExit(f"unknown scenario {args.scenario}")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
