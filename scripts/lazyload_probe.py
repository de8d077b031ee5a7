"""Does a CUDA module load on one thread hold back a kernel launch on another?

The question behind GOSYM_GPU_DEFER's hang (docs/ARCHITECTURE.md, "Deferred ops"): a deferred
op's caller stream waits on the GPU for a flag that another thread (the collective queue's
worker) writes after launching the op; if the caller then launches a kernel for the first time,
CUDA's lazy loading loads its module and may synchronize the context, i.e. wait for that
stream. The rank deadlocks if the other thread's launch (or flag write) waits for the load.

This reproduces it with no gosym and no peer, on one GPU: stream S waits for a flag word
(cuStreamWaitValue32); a second thread sleeps, then launches a torch kernel on its own stream
T and writes the flag on T (cuStreamWriteValue32); meanwhile the main thread launches on S a
kernel this process never ran (a first launch: a lazy load). Prints how long each part took
and exits 0 when everything finished, 3 when the main thread or the second thread was still
blocked after --limit seconds (the hazard is real on this machine and loading mode).

Usage: python3 scripts/lazyload_probe.py [--limit 20]   (CUDA_MODULE_LOADING=EAGER to compare)
"""

import argparse
import ctypes
import os
import sys
import threading
import time

import torch


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--limit", type=float, default=20.0)
    p.add_argument("--delay", type=float, default=2.0, help="seconds before the other thread launches")
    a = p.parse_args()
    cu = ctypes.CDLL("libcuda.so.1")
    torch.cuda.init()
    dev = torch.device("cuda", 0)
    flag = torch.zeros(1, dtype=torch.int32, device=dev)  # the word the streams wait on / write
    s, t = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    x = torch.randn(1 << 20, device=dev)
    torch.cuda.synchronize()
    wait_fn, write_fn = cu.cuStreamWaitValue32_v2, cu.cuStreamWriteValue32_v2
    for f in (wait_fn, write_fn):
        f.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        f.restype = ctypes.c_int
    rc = wait_fn(s.cuda_stream, flag.data_ptr(), 1, 0)  # GEQ 1
    assert rc == 0, f"cuStreamWaitValue32: {rc}"
    times = {}

    def other():
        time.sleep(a.delay)
        t0 = time.monotonic()
        with torch.cuda.stream(t):
            y = x * 2  # noqa: F841 - a launch (its kernel already loaded by the warm-up below)
        times["other_launch_s"] = time.monotonic() - t0
        rc = write_fn(t.cuda_stream, flag.data_ptr(), 1, 0)
        times["other_write_s"] = time.monotonic() - t0
        assert rc == 0, f"cuStreamWriteValue32: {rc}"

    with torch.cuda.stream(t):
        (x * 2).sum()  # the other thread's kernel loaded beforehand
    t.synchronize()
    th = threading.Thread(target=other, daemon=True)
    th.start()
    t0 = time.monotonic()
    done = threading.Event()

    def first_launch():
        with torch.cuda.stream(s):
            torch.special.zeta(x.abs() + 1.5, x.abs() + 2.0)  # a kernel not run before here
        times["main_launch_s"] = time.monotonic() - t0
        done.set()

    threading.Thread(target=first_launch, daemon=True).start()
    main_ok = done.wait(a.limit)
    th.join(a.limit)
    finished = main_ok and not th.is_alive() and "other_write_s" in times
    mode = os.environ.get("CUDA_MODULE_LOADING", "(default: lazy)")
    print(f"lazyload_probe: CUDA_MODULE_LOADING={mode}, other thread after {a.delay}s: {times}")
    if not finished:
        print("lazyload_probe: BLOCKED: a first launch behind a stream waiting for another "
              "thread's flag did not finish (the lazy-loading hazard)")
        sys.stdout.flush()
        os._exit(3)
    s.synchronize()
    print("lazyload_probe: finished (main's first launch returned "
          f"{'before' if times['main_launch_s'] < a.delay else 'after'} the other thread's launch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
