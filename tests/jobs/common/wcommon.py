"""Shared plumbing for the torchrun workers of the gosym test suites.

Workers run under torchrun (or tests/conftest.py's plain spawner), one process
per rank. They talk to the pytest side only through files in $GOSYM_TEST_OUT:
``pid.<rank>`` when they start, ``rank<rank>.json`` with their results, and
marker files the test creates (``wait_for_marker``). Checks are collected in a
``Checker`` so one launch reports every failing case at once instead of
stopping at the first.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import hashlib
import json
import os
import signal
import sys
import time
import traceback
import zlib

import torch
import torch.distributed as dist

# Larger than any sane staging buffer (3M+7 elements), so chunking runs.
LARGE = 3 * 1024 * 1024 + 7

ALL_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
]
FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]

# Errors a bad call may raise; anything else (or a hang) is a failure.
CLEAR_ERRORS = (ValueError, TypeError, RuntimeError)


def dname(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def out_dir() -> str:
    return os.environ["GOSYM_TEST_OUT"]


def rank_env() -> int:
    return int(os.environ["RANK"])


def setup(extra=None) -> argparse.Namespace:
    """Parses the common flags, installs stack dumps, announces our pid.

    SIGUSR1 dumps every thread's Python stack to stderr: the launcher sends it
    before killing a worker that ran past its deadline, so hangs are readable.
    """
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="gosym")
    parser.add_argument("--timeout", type=float, default=60.0, help="default group timeout, s")
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    every = float(os.environ.get("GOSYM_TEST_STACKS_EVERY", "0") or "0")
    if every > 0:  # where a hang waits, over time (the deadline's SIGUSR1 shows its end only)
        faulthandler.dump_traceback_later(every, repeat=True)
    _write_atomic(os.path.join(out_dir(), f"pid.{rank_env()}"), str(os.getpid()))
    return args


def init(backend: str, timeout_s: float) -> tuple[int, int]:
    """init_process_group from torchrun's env; imports gosym when asked for it."""
    if backend == "gosym":
        import gosym  # noqa: F401  (registers the backend)
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def cuda_device() -> torch.device:
    """This rank's GPU, made current: LOCAL_RANK's, modulo the machine's GPUs where ranks
    share them (tests/conftest.py's GOSYM_TEST_RANKS_PER_GPU). NCCL refuses two ranks of
    one host on one GPU, so a rank then shows NCCL a host of its own (NCCL_HOSTID, before
    any NCCL group): the reference groups go over NCCL's network transport, and gosym, which
    tells hosts apart by its own means, still sees one host."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    n = torch.cuda.device_count()
    shared = int(os.environ.get("GOSYM_TEST_RANKS_PER_GPU", "1") or "1") > 1 or local >= n
    if shared:
        import socket

        base = os.environ.get("NCCL_HOSTID") or socket.gethostname()
        os.environ["NCCL_HOSTID"] = f"{base}-rank{os.environ.get('RANK', local)}"
    dev = torch.device("cuda", local % n)
    torch.cuda.set_device(dev)
    return dev


def init_cuda(args) -> tuple[int, int, torch.device, object]:
    """This rank's GPU (cuda_device), the group from torchrun's env, and an NCCL group
    of the same ranks to compare with: (rank, world, device, nccl group)."""
    dev = cuda_device()
    rank, world = init(args.backend, args.timeout)
    return rank, world, dev, dist.new_group(backend="nccl")


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_result(obj: dict, rank: int | None = None) -> None:
    rank = rank_env() if rank is None else rank
    _write_atomic(os.path.join(out_dir(), f"rank{rank}.json"), json.dumps(obj, indent=1, default=str))


def announce(name: str) -> None:
    """Creates $GOSYM_TEST_OUT/<name>.<rank>, which the test may wait for (Job.wait_for)."""
    _write_atomic(os.path.join(out_dir(), f"{name}.{rank_env()}"), str(os.getpid()))


def wait_for_marker(name: str, timeout_s: float = 120.0) -> None:
    """Blocks until the test creates $GOSYM_TEST_OUT/<name>."""
    path = os.path.join(out_dir(), name)
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"marker {name} never appeared")
        time.sleep(0.02)


def seed_of(*parts) -> int:
    """Stable seed (unlike hash(), the same in every process)."""
    return zlib.crc32(repr(parts).encode())


def make_input(case: str, rank: int, n: int, dtype: torch.dtype, opname: str = "") -> torch.Tensor:
    """Rank ``rank``'s input for ``case``: deterministic, so any rank can rebuild it."""
    g = torch.Generator().manual_seed(seed_of(case, rank))
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        return torch.randint(info.min, info.max, (n,), generator=g, dtype=torch.int64).to(dtype)
    if opname == "PRODUCT":
        # Products of up to 4 of these need <= 7 mantissa bits: exact even in bf16.
        vals = torch.tensor([0.5, 0.75, 1.0, 1.5, 2.0], dtype=torch.float64)
        sign = torch.randint(0, 2, (n,), generator=g) * 2 - 1
        return (vals[torch.randint(0, len(vals), (n,), generator=g)] * sign).to(dtype)
    if dtype == torch.float16:
        # k/1024: sums of 4 are exact in fp32, so the once-rounded result is exact.
        return (torch.randint(-2048, 2049, (n,), generator=g) / 1024).to(dtype)
    if dtype == torch.bfloat16:
        return (torch.randint(-256, 257, (n,), generator=g) / 128).to(dtype)
    return torch.randn(n, generator=g, dtype=dtype) * 4


def poison_like(exp: torch.Tensor) -> torch.Tensor:
    """An output buffer no correct collective leaves as is: NaN, or ~expected."""
    if exp.dtype.is_floating_point:
        return torch.full_like(exp, float("nan"))
    return torch.bitwise_not(exp)


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fills an output buffer in place with NaN (or an unlikely integer)."""
    return t.fill_(float("nan") if t.dtype.is_floating_point else -1234567)


def digest(t: torch.Tensor) -> str:
    # a fresh contiguous copy: contiguous() keeps a size-1 view's stride, which view() refuses
    t = t.detach().reshape(-1).cpu().clone(memory_format=torch.contiguous_format)
    return hashlib.sha1(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def memfd_counts() -> dict:
    """Live memfd file descriptors and mappings of this process."""
    fds = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:"):
                fds += 1
        except OSError:
            pass
    with open("/proc/self/maps") as f:
        maps = sum(1 for line in f if "/memfd:" in line)
    return {"memfd_fds": fds, "memfd_maps": maps, "fds": fd_count()}


def error_text(e: BaseException) -> str:
    return f"{type(e).__module__}.{type(e).__name__}: {e}"


class Checker:
    """Collects pass/fail per named case; exceptions become failures."""

    def __init__(self, rank: int):
        self.rank = rank
        self.failures: list[str] = []
        self.passed = 0
        self.info: dict = {}

    def fail(self, case: str, why: str) -> None:
        self.failures.append(f"[rank {self.rank}] {case}: {why}")

    def check(self, case: str, ok: bool, why: str = "") -> bool:
        if ok:
            self.passed += 1
        else:
            self.fail(case, why or "check failed")
        return ok

    def run(self, case: str, fn, *a, **kw):
        """Runs fn; an exception is recorded as a failure of ``case``."""
        t0 = time.monotonic()
        try:
            return fn(*a, **kw)
        except Exception as e:  # noqa: BLE001 - every error is a reported failure
            tb = traceback.format_exc(limit=4)
            self.fail(case, f"raised {error_text(e)}\n{tb}")
            return None
        finally:
            took = time.monotonic() - t0
            if took > 0.5:  # slow cases are worth a look in the report
                self.info.setdefault("slow_cases", {})[case] = round(took, 2)

    def expect_error(self, case: str, fn, *a, **kw) -> BaseException | None:
        """fn must raise a clear error (ValueError/TypeError/RuntimeError) with a reason."""
        try:
            fn(*a, **kw)
        except CLEAR_ERRORS as e:
            if self.check(case, len(str(e).strip()) >= 8, f"error without a reason: {error_text(e)}"):
                return e
            return None
        except Exception as e:  # noqa: BLE001
            self.fail(case, f"wrong exception type {error_text(e)}")
            return e
        self.fail(case, "did not raise")
        return None

    def result(self, **extra) -> dict:
        return {
            "rank": self.rank,
            "failures": self.failures,
            "passed": self.passed,
            "info": self.info,
            **extra,
        }


def compare(got: torch.Tensor, exp: torch.Tensor, tol: torch.Tensor | None = None) -> str | None:
    """None when equal (bitwise, NaN == NaN) or within the elementwise tol; else why not."""
    if got.dtype != exp.dtype:
        return f"dtype {got.dtype} != {exp.dtype}"
    if tuple(got.shape) != tuple(exp.shape):
        return f"shape {tuple(got.shape)} != {tuple(exp.shape)}"
    if got.numel() == 0:
        return None
    g = got.detach().reshape(-1)
    e = exp.reshape(-1)
    if tol is None:
        if g.dtype.is_floating_point:
            bad = ~((g == e) | (torch.isnan(g) & torch.isnan(e)))
        else:
            bad = g != e
    else:
        gd, ed = g.double(), e.double()
        bad = ~(((gd - ed).abs() <= tol.reshape(-1)) | (torch.isnan(gd) & torch.isnan(ed)))
    n = int(bad.sum())
    if n == 0:
        return None
    idx = torch.nonzero(bad).reshape(-1)[:4].tolist()
    sample = ", ".join(f"[{i}] got {g[i].item()!r} want {e[i].item()!r}" for i in idx)
    return f"{n}/{g.numel()} elements differ: {sample}"


def part_runner(ck: Checker, *args):
    """part(name, fn, *a) runs fn(ck, *args, *a) as case ``name`` and records it in
    info["parts_done"] when it ran to its end (a failed part does not stop the next)."""
    done = ck.info.setdefault("parts_done", [])

    def part(name, fn, *a):
        def body():
            fn(ck, *args, *a)
            done.append(name)
        ck.run(name, body)

    return part


def finish_cuda(ck: Checker, label: str, **extra) -> None:
    """The end of a CUDA worker: the device idle, the result written and summarised, the
    process group destroyed."""
    torch.cuda.synchronize()
    write_result(ck.result(**extra))
    print_summary(ck, label)
    dist.destroy_process_group()


def print_summary(ck: Checker, label: str) -> None:
    print(f"[rank {ck.rank}] {label}: {ck.passed} passed, {len(ck.failures)} failed", file=sys.stderr)
    for f in ck.failures[:20]:
        print(f, file=sys.stderr)


# -- registration counters (gosym only) --------------------------------------

# The lazy-registration counters of gosym.stats(group) (gobackend/bind.go).
BIND_KEYS = ("bindings_created", "bindings_reused", "bindings_released", "peer_maps",
             "peer_map_hits", "peer_map_misses", "peer_map_dropped", "peer_map_pins")


def bind_counters(group=None) -> dict:
    """gosym.stats(group)'s BIND_KEYS; absent ones (GOSYM_ENABLE_UBR=no: no binder) read 0."""
    import gosym

    s = gosym.stats(group)
    return {k: int(s.get(k, 0)) for k in BIND_KEYS}


def check_delta(ck: Checker, case: str, before: dict, after: dict, **want) -> dict:
    """Checks after - before per key of want: an int must match exactly, ">0" means grew."""
    d = {k: after[k] - before[k] for k in before}
    for k, w in want.items():
        ok = d[k] > 0 if w == ">0" else d[k] == w
        ck.check(f"{case}: {k}", ok, f"{k} changed by {d[k]}, want {w}; all changes {d}")
    return d


def expect_raise(ck: Checker, case: str, types, fn, *words, untouched=()) -> BaseException | None:
    """fn must raise one of types naming every word (case-insensitive) and leave
    the tensors in untouched as they were (the error came before any data moved)."""
    before = [t.clone() for t in untouched]
    err = None
    try:
        fn()
    except types as e:
        err = e
        missing = [w for w in words if w.lower() not in str(e).lower()]
        ck.check(case, not missing, f"message lacks {missing}: {error_text(e)}")
    except Exception as e:  # noqa: BLE001
        err = e
        ck.fail(case, f"wrong exception {error_text(e)}, want {[t.__name__ for t in types]}")
    else:
        ck.fail(case, "did not raise")
    for t, b in zip(untouched, before):
        why = compare(t, b)
        ck.check(f"{case}: no data moved", why is None, why or "")
    return err


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
