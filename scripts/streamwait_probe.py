"""Does a stream that waits for a host-written flag hold back another stream's work?

A question behind GOSYM_GPU_DEFER's hang (docs/ARCHITECTURE.md, "Deferred ops"; which driver
calls wait for the device is scripts/syncprobe.py's): a deferred op's caller stream X
waits on the GPU (cuStreamWaitValue32) for a flag that the op's own stream T writes after the
op, which another thread enqueues later. CUDA's documentation of the stream memory operations
warns that work ordered through them may be serialized by the scheduler in an order that
deadlocks: streams share the device's hardware work queues (CUDA_DEVICE_MAX_CONNECTIONS, 8 by
default), and a wait at the head of a queue holds back what follows it in that queue, another
stream's work included.

This reproduces it with no gosym and no peer, on one GPU: --gap + 1 raw streams are made in a
row (cuStreamCreate, non-blocking); X is the first, T the one --gap streams later. X waits for
the flag, then gets a kernel; a second thread then launches a kernel on T and writes the flag
on T. Prints whether X's kernel finished within --limit seconds; exits 3 when it did not
(T's work was held behind X's wait: the streams share a queue), 0 when it did.

Usage: python3 scripts/streamwait_probe.py --gap 8   (CUDA_DEVICE_MAX_CONNECTIONS=32 to compare)
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
    p.add_argument("--gap", type=int, default=8, help="T is made this many streams after X")
    p.add_argument("--limit", type=float, default=5.0)
    a = p.parse_args()
    cu = ctypes.CDLL("libcuda.so.1")
    torch.cuda.init()
    dev = torch.device("cuda", 0)
    torch.zeros(1, device=dev)  # the primary context, current on this thread
    create = cu.cuStreamCreate
    create.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
    raw = []
    for _ in range(a.gap + 1):
        h = ctypes.c_void_p()
        assert create(ctypes.byref(h), 1) == 0, "cuStreamCreate"  # CU_STREAM_NON_BLOCKING
        raw.append(h.value)
    x_s = torch.cuda.ExternalStream(raw[0], device=dev)
    t_s = torch.cuda.ExternalStream(raw[a.gap], device=dev)
    flag = torch.zeros(1, dtype=torch.int32, device=dev)
    x = torch.randn(1 << 20, device=dev)
    for h in raw:  # every stream has run a kernel: none is first at anything below
        with torch.cuda.stream(torch.cuda.ExternalStream(h, device=dev)):
            (x * 2).sum()
    torch.cuda.synchronize()
    wait_fn, write_fn = cu.cuStreamWaitValue32_v2, cu.cuStreamWriteValue32_v2
    for f in (wait_fn, write_fn):
        f.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        f.restype = ctypes.c_int
    assert wait_fn(raw[0], flag.data_ptr(), 1, 0) == 0, "cuStreamWaitValue32"  # GEQ 1
    with torch.cuda.stream(x_s):
        y = x * 3
        x_done = torch.cuda.Event()
        x_done.record()
    t_done = torch.cuda.Event()

    def other():
        time.sleep(0.5)
        with torch.cuda.stream(t_s):
            z = x * 2  # noqa: F841 - T's own work before the flag
            assert write_fn(raw[a.gap], flag.data_ptr(), 1, 0) == 0, "cuStreamWriteValue32"
            t_done.record()

    th = threading.Thread(target=other, daemon=True)
    th.start()
    th.join(a.limit)
    t0 = time.monotonic()
    while time.monotonic() - t0 < a.limit and not x_done.query():
        time.sleep(0.01)
    conns = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "(default 8)")
    ok = x_done.query()
    print(f"streamwait_probe: CUDA_DEVICE_MAX_CONNECTIONS={conns}, T made {a.gap} streams "
          f"after X: X's kernel {'finished' if ok else 'HELD'}, T's work "
          f"{'finished' if t_done.query() else 'held'}")
    sys.stdout.flush()
    if not ok:
        os._exit(3)  # X never runs: leave without waiting for it
    assert torch.equal(y, x * 3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
