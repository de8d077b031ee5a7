"""Start-up benchmark: how long a fresh job takes to its first collectives, gosym against the
reference backend (NCCL on CUDA, gloo on CPU), in the same run.

``python -m gosym.startbench [--device cuda] [--nproc N] [--backends gosym,nccl] [--json F]``
launches one torchrun job per backend and repeat, each in fresh processes with an empty gosym
kernel cache (a new GOSYM_KERNEL_CACHE directory), so every cost a new job pays is in the
numbers: the library's load, the group's bootstrap, the device's modules (prebuilt images, or
NVRTC where none fits), the first op's buffers. Every rank times, from just before
``init_process_group``: the group's creation, the first all_reduce (4 KiB, completed: on CUDA
a device synchronize), and the tenth. The table gives the slowest rank's times.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from ._torchrun import module_job, run_job

_RANK_ENV = "GOSYM_STARTBENCH_OUT"


def _rank_main(device: str, backend: str) -> None:
    """One rank of a job: times its start-up and writes them to $GOSYM_STARTBENCH_OUT/rank<r>."""
    import torch
    import torch.distributed as dist

    if backend == "gosym":
        import gosym  # noqa: F401  (registers the backend)
    rank = int(os.environ["RANK"])
    kw = {}
    if device == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(dev)
        torch.zeros(1, device=dev)  # the CUDA context: not a cost of the backend
        kw["device_id"] = dev
    else:
        dev = torch.device("cpu")

    def done():
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    t_ctx = done()
    dist.init_process_group(backend, **kw)
    t_init = done()
    x = torch.ones(1024, device=dev)
    marks = []
    for _ in range(10):
        dist.all_reduce(x)
        marks.append(done())
    if x[0].item() != dist.get_world_size() ** 10:
        raise AssertionError(f"rank {rank}: all_reduce gave {x[0].item()}")
    dist.destroy_process_group()
    out = {"init_s": t_init - t_ctx, "first_s": marks[0] - t_init,
           "tenth_s": marks[9] - t_init, "after_first_us": (marks[9] - marks[0]) / 9 * 1e6}
    with open(os.path.join(os.environ[_RANK_ENV], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


def _job(device: str, backend: str, nproc: int, timeout: float) -> dict:
    """One fresh job of backend; the slowest rank's times."""
    with tempfile.TemporaryDirectory(prefix="gosym-startbench-") as tmp:
        env = dict(os.environ, GOSYM_KERNEL_CACHE=os.path.join(tmp, "kernels"), **{_RANK_ENV: tmp})
        cmd, env = module_job(nproc, "gosym.startbench", "--rank-of", device, backend, env=env)
        t0 = time.perf_counter()
        res = run_job(cmd, env, timeout)
        wall = time.perf_counter() - t0
        if res.returncode != 0:
            raise RuntimeError(f"{backend} job failed ({res.returncode}):\n{res.stderr[-4000:]}")
        ranks = [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(nproc)]
    out = {k: max(r[k] for r in ranks) for k in ranks[0]}
    out["job_s"] = wall
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gosym.startbench", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--nproc", type=int, default=None, help="ranks (default: every GPU on CUDA, 2 on CPU)")
    p.add_argument("--backends", default=None, help="default gosym and the reference (nccl or gloo)")
    p.add_argument("--repeats", type=int, default=2, help="fresh jobs per backend, alternating")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one job may take")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--rank-of", nargs=2, metavar=("DEVICE", "BACKEND"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.rank_of:
        _rank_main(*a.rank_of)
        return 0
    ref = "nccl" if a.device == "cuda" else "gloo"
    backends = (a.backends or f"gosym,{ref}").split(",")
    nproc = a.nproc
    if nproc is None:
        import torch

        nproc = torch.cuda.device_count() if a.device == "cuda" else 2
    rows = []
    for i in range(a.repeats):
        for b in backends:
            r = _job(a.device, b, nproc, a.timeout)
            rows.append({"backend": b, "repeat": i, **r})
    head = f"{'backend':8} {'rep':>3} {'init s':>8} {'first op s':>11} {'10th op s':>10} " \
           f"{'ops 2-10 us':>12} {'job s':>7}"
    print(f"start-up, {a.device}, {nproc} ranks (slowest rank; from just before init_process_group)")
    print(head)
    for r in rows:
        print(f"{r['backend']:8} {r['repeat']:>3} {r['init_s']:8.3f} {r['first_s']:11.3f} "
              f"{r['tenth_s']:10.3f} {r['after_first_us']:12.1f} {r['job_s']:7.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": a.device, "nproc": nproc, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
