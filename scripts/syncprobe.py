"""Which CUDA driver calls wait for the device, and which hold back another thread's launch?

The question behind GOSYM_GPU_DEFER's hang (docs/ARCHITECTURE.md, "Deferred ops"): a deferred
op's caller stream S waits on the GPU (cuStreamWaitValue32) for a flag that another thread
(the collective queue's worker) writes on its own stream T after launching the op. A driver
call that waits for the device (for S) deadlocks the rank when the worker makes it, and also
when the caller's thread makes it while holding a lock the worker's launch needs.

No torch here (ctypes calls release the GIL, so only the driver can couple the threads), no
gosym, no peer, one GPU. For --case C: S waits for the flag; the main thread makes call C; a
second thread sleeps --delay seconds, then enqueues a memset and the flag write on T. Prints
one line: how long C took (about --delay or more: C waited for S, i.e. for the device) and
whether the second thread's calls returned while C was still running (they were not held
back). Exits 3 when C or the second thread had not returned after --limit seconds (deadlock:
C holds what the second thread needs, or waits for what never comes).

Usage: python3 scripts/syncprobe.py --case NAME   (--case list prints the names; run each in
a fresh process: a deadlocked case leaves its context unusable)
"""

import argparse
import ctypes
import os
import sys
import threading
import time

PTX = """.version 7.0
.target sm_52
.address_size 64
.visible .entry {name}(.param .u64 p)
{{
  .reg .u64 %rd<3>;
  .reg .u32 %r<2>;
  ld.param.u64 %rd1, [p];
  cvta.to.global.u64 %rd2, %rd1;
  mov.u32 %r1, 7;
  st.global.u32 [%rd2], %r1;
  ret;
}}
"""

SPIN = """.version 7.0
.target sm_52
.address_size 64
.visible .entry spin(.param .u64 p)
{
  .reg .u64 %rd<3>;
  .reg .u32 %r<2>;
  .reg .pred %p1;
  ld.param.u64 %rd1, [p];
  cvta.to.global.u64 %rd2, %rd1;
SPIN:
  ld.volatile.global.u32 %r1, [%rd2];
  setp.eq.u32 %p1, %r1, 0;
  @%p1 bra SPIN;
  ret;
}
"""

cu = ctypes.CDLL("libcuda.so.1")
u64, vp = ctypes.c_uint64, ctypes.c_void_p


def ck(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: CUDA error {rc}")


def load(name, ptx=None):
    mod, fn = vp(), vp()
    src = ptx if ptx is not None else PTX.format(name=name)
    ck(cu.cuModuleLoadData(ctypes.byref(mod), src.encode() + b"\0"), "cuModuleLoadData")
    ck(cu.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()), "cuModuleGetFunction")
    return mod, fn


def launch(fn, stream, ptr):
    arg = u64(ptr)
    args = (vp * 1)(vp(ctypes.addressof(arg)))
    ck(cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, vp(stream), args, None), "cuLaunchKernel")


def alloc(n):
    p = u64()
    ck(cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)), "cuMemAlloc")
    return p.value


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True)
    ap.add_argument("--delay", type=float, default=2.0)
    ap.add_argument("--limit", type=float, default=15.0)
    ap.add_argument("--wait", choices=("stream", "kernel"), default="stream",
                    help="how S waits: cuStreamWaitValue32 on a device word the other thread's "
                    "stream writes (the deferral as built), or a kernel spinning on a pinned host "
                    "word the other thread stores to with no driver call (the way on)")
    ap.add_argument("--driver-first", action="store_true",
                    help="with --wait kernel: the other thread enqueues a memset (a driver call) "
                    "before its store, as a worker that maps or launches before releasing would")
    a = ap.parse_args()
    ck(cu.cuInit(0), "cuInit")
    dev, ctx = ctypes.c_int(), vp()
    ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    s, t = vp(), vp()
    ck(cu.cuStreamCreate(ctypes.byref(s), 1), "cuStreamCreate")
    ck(cu.cuStreamCreate(ctypes.byref(t), 1), "cuStreamCreate")
    flag, buf, victim = alloc(4), alloc(64 << 20), alloc(64 << 20)
    ck(cu.cuMemsetD32_v2(u64(flag), 0, ctypes.c_size_t(1)), "cuMemsetD32")
    mod, warm = load("warm")  # loaded and launched before: the second thread's own kernel
    launch(warm, t.value, buf)
    _, fresh = load("fresh")  # loaded, never launched: under lazy loading its code loads at launch
    ck(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    ev = vp()
    ck(cu.cuEventCreate(ctypes.byref(ev), 2), "cuEventCreate")  # CU_EVENT_DISABLE_TIMING
    _, spin = load("spin", SPIN)
    word = vp()  # pinned, mapped: with unified addressing its host address is its device one
    ck(cu.cuMemHostAlloc(ctypes.byref(word), ctypes.c_size_t(4), 2), "cuMemHostAlloc")  # DEVICEMAP
    hostword = ctypes.c_uint32.from_address(word.value)
    hostword.value = 0

    def do_case():
        c = a.case
        if c == "first-launch":
            launch(fresh, s.value, buf)
        elif c == "module-load":
            load("later")
        elif c == "mem-alloc":
            alloc(64 << 20)
        elif c == "mem-free":
            ck(cu.cuMemFree_v2(u64(victim)), "cuMemFree")
        elif c == "host-alloc":
            p = vp()
            ck(cu.cuMemAllocHost_v2(ctypes.byref(p), ctypes.c_size_t(64 << 20)), "cuMemAllocHost")
        elif c == "ipc-handle":
            h = (ctypes.c_char * 64)()
            ck(cu.cuIpcGetMemHandle(h, u64(buf)), "cuIpcGetMemHandle")
        elif c == "event-wait":
            ck(cu.cuEventRecord(ev, s), "cuEventRecord")
            ck(cu.cuStreamWaitEvent(t, ev, 0), "cuStreamWaitEvent")
        elif c == "ctx-sync":
            ck(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        else:
            raise SystemExit(f"unknown case {c}")

    if a.case == "list":
        print("first-launch module-load mem-alloc mem-free host-alloc ipc-handle event-wait ctx-sync")
        return 0
    times = {}
    wait = cu.cuStreamWaitValue32_v2
    wait.argtypes = [vp, u64, ctypes.c_uint32, ctypes.c_uint]
    write = cu.cuStreamWriteValue32_v2
    write.argtypes = [vp, u64, ctypes.c_uint32, ctypes.c_uint]
    if a.wait == "stream":
        ck(wait(s.value, flag, 1, 0), "cuStreamWaitValue32")  # GEQ 1
    else:
        launch(spin, s.value, word.value)
    t0 = time.monotonic()

    def other():
        ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        time.sleep(a.delay)
        if a.wait == "kernel":
            if a.driver_first:
                ck(cu.cuMemsetD32Async(u64(buf), 1, ctypes.c_size_t(16 << 20), t), "cuMemsetD32Async")
            hostword.value = 1  # a plain store: no driver call
            times["other_memset_s"] = times["other_write_s"] = time.monotonic() - t0
            return
        ck(cu.cuMemsetD32Async(u64(buf), 1, ctypes.c_size_t(16 << 20), t), "cuMemsetD32Async")
        times["other_memset_s"] = time.monotonic() - t0
        ck(write(t.value, flag, 1, 0), "cuStreamWriteValue32")
        times["other_write_s"] = time.monotonic() - t0

    def main_case():
        ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        do_case()
        times["case_s"] = time.monotonic() - t0

    th_o = threading.Thread(target=other, daemon=True)
    th_c = threading.Thread(target=main_case, daemon=True)
    th_c.start()
    th_o.start()
    th_c.join(a.limit)
    th_o.join(max(0.0, a.limit - (time.monotonic() - t0)))
    done = not th_c.is_alive() and not th_o.is_alive()
    mode = os.environ.get("CUDA_MODULE_LOADING", "lazy (default)")
    got = {k: round(v, 3) for k, v in sorted(times.items())}
    if done:
        waited = times["case_s"] >= 0.9 * a.delay
        held = times["other_write_s"] - a.delay > 0.5
        verdict = ("waited for the device" if waited else "returned at once") + (
            "; the other thread's calls were held back" if held else "")
    else:
        verdict = "DEADLOCK: " + " and ".join(
            w for w, th in (("the case", th_c), ("the other thread", th_o)) if th.is_alive()
        ) + f" still running after {a.limit}s"
    how = a.wait + (" (a driver call before the store)" if a.driver_first else "")
    print(f"syncprobe: CUDA_MODULE_LOADING={mode} wait {how} case {a.case}: {verdict} {got}")
    sys.stdout.flush()
    if not done:
        os._exit(3)
    ck(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    return 0


if __name__ == "__main__":
    sys.exit(main())
