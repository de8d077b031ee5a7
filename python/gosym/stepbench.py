"""Training-step benchmark: an FSDP2 step of a model large enough to be bound by its collectives,
gosym against the reference backend (NCCL on CUDA, gloo on CPU), in the same job.

``python -m gosym.stepbench [--device cuda] [--nproc N] [--dim D] [--layers L] [--tokens T]
[--json F]`` launches one torchrun job. Its default group is gosym; a second group of the same
ranks runs the reference. Each backend gets its own copy of one model (residual MLP blocks of
dim -> 4 dim -> dim, every block and the root sharded with ``fully_shard`` on a mesh of that
backend's group; parameters bf16 with ``MixedPrecisionPolicy``, gradients reduced in
``--reduce-dtype``, SGD), built from the same seed and fed the same batches, so the two loss
sequences agree to the reduction order's rounding. The backends take turns, ``--steps`` steps
each per round, so a drift of the machine falls on both; every step ends in a device
synchronize and is timed on every rank, the slowest rank's time per step counting.

A step moves about 3 x params x 2 bytes through each rank's links at bf16 (all_gather in the
forward and again in the backward, reduce_scatter of the gradients): at the CUDA default
(dim 4096, 8 layers: 1.07 B parameters, 1024 tokens a step) that is ~6.4 GB against ~2.4 ms of
compute per GPU at 4 GPUs, so the step is bound by the collectives.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from ._torchrun import module_job, run_job

_RANK_ENV = "GOSYM_STEPBENCH_OUT"
_REFERENCE = {"cuda": "nccl", "cpu": "gloo"}


def _model(torch, dim: int, layers: int, seed: int):
    """Residual MLP blocks; the same parameters for every caller with the same seed."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(dim)
            self.up = nn.Linear(dim, 4 * dim, bias=False)
            self.down = nn.Linear(4 * dim, dim, bias=False)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Block() for _ in range(layers))

        def forward(self, x):
            for blk in self.layers:
                x = blk(x)
            return x

    torch.manual_seed(seed)
    return Net()


def _rank_main(a) -> None:
    """One rank: both backends' models, their steps in turns; the rank's times and losses to
    $GOSYM_STEPBENCH_OUT/rank<r>.json."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import gosym  # noqa: F401  (registers the backend)

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if a.hang_dump:
        # a rank still running near the job's limit prints every thread's stack and exits, so a
        # hang says where it is instead of being killed silently with the job
        import faulthandler

        faulthandler.dump_traceback_later(a.hang_dump, exit=True)
    kw = {}
    if a.device == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(dev)
        kw["device_id"] = dev
    else:
        dev = torch.device("cpu")
        torch.set_num_threads(1)
    backends = a.backends.split(",")
    dist.init_process_group(backends[0], **kw)
    groups = {backends[0]: dist.group.WORLD}
    for b in backends[1:]:
        groups[b] = dist.new_group(backend=b)
        if a.pg_alloc and dev.type == "cuda":
            # NCCL makes its memory pool only on a communicator that exists: one op first
            dist.all_reduce(torch.zeros(1, device=dev), group=groups[b])
    rdt = {"bf16": torch.bfloat16, "fp32": torch.float32}[a.reduce_dtype]
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=rdt)
    models, opts = {}, {}
    for b in backends:
        with torch.device(dev):  # built where it runs: no full copy in host memory
            m = _model(torch, a.dim, a.layers, seed=7)
        mesh = DeviceMesh.from_group(groups[b], dev.type)
        for blk in m.layers:
            fully_shard(blk, mesh=mesh, mp_policy=mp)
        models[b] = fully_shard(m, mesh=mesh, mp_policy=mp)
        if a.pg_alloc:  # every backend's own buffers (gosym's segments, NCCL's ncclMemAlloc)
            for mod in (*m.layers, m):
                mod.set_allocate_memory_from_process_group_for_comm(True)
        opts[b] = torch.optim.SGD(m.parameters(), lr=1e-3)
    params = a.layers * (8 * a.dim * a.dim + 2 * a.dim)  # two matrices and a LayerNorm a block
    gen = torch.Generator(device="cpu").manual_seed(1000 + rank)  # each rank its own batch
    batches = [torch.randn(a.tokens // a.seq, a.seq, a.dim, generator=gen).to(dev)
               for _ in range(a.warmup + a.steps * a.rounds)]

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def step(b, x):
        m, opt = models[b], opts[b]
        opt.zero_grad(set_to_none=True)
        loss = m(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    times = {b: [] for b in backends}
    host = {b: [] for b in backends}  # until step() returned, before the sync: the CPU's part
    losses = {b: [] for b in backends}
    for b in backends:  # warm-up: allocators, kernels, the groups' buffers
        for i in range(a.warmup):
            losses[b].append(float(step(b, batches[i]).item()))
    for r in range(a.rounds):
        for b in backends:
            for i in range(a.steps):
                x = batches[a.warmup + r * a.steps + i]
                sync()
                dist.barrier(group=groups[b])
                sync()
                t0 = time.perf_counter()
                loss = step(b, x)
                host[b].append(time.perf_counter() - t0)
                sync()
                times[b].append(time.perf_counter() - t0)
                losses[b].append(float(loss.item()))
    profiles = {}
    if a.profile:  # one more step each, under torch's profiler: where the device time goes
        from torch.profiler import ProfilerActivity, profile

        for b in backends:
            sync()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                step(b, batches[-1])
                sync()
            profiles[b] = "\n".join(prof.key_averages().table(sort_by=k, row_limit=a.profile)
                                     for k in ("device_time_total", "self_cpu_time_total"))
    stats = gosym.stats(groups["gosym"])  # the counters of its paths (direct, cache misses)
    dist.barrier()
    dist.destroy_process_group()
    out = {"rank": rank, "world": world, "times_s": times, "host_s": host, "losses": losses,
           "params": params, "gosym_stats": stats, "profiles": profiles}
    with open(os.path.join(os.environ[_RANK_ENV], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


def _summary(ranks: list[dict], backends: list[str]) -> dict:
    """Per backend: the slowest rank's time of each step, its median and spread; the losses'
    largest relative difference from the first backend's (rank 0's, every step)."""
    out = {}
    for b in backends:
        steps = [max(r["times_s"][b][i] for r in ranks) for i in range(len(ranks[0]["times_s"][b]))]
        q = statistics.quantiles(steps, n=10) if len(steps) >= 2 else [steps[0]] * 9
        hosts = [max(r["host_s"][b][i] for r in ranks) for i in range(len(steps))]
        out[b] = {"median_ms": statistics.median(steps) * 1e3, "p10_ms": q[0] * 1e3,
                  "p90_ms": q[-1] * 1e3, "steps": len(steps),
                  "host_median_ms": statistics.median(hosts) * 1e3}
    ref = ranks[0]["losses"][backends[0]]
    for b in backends:
        got = ranks[0]["losses"][b]
        out[b]["loss_max_rel"] = max(abs(g - f) / max(abs(f), 1e-30) for f, g in zip(ref, got))
        out[b]["last_loss"] = got[-1]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gosym.stepbench", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--nproc", type=int, default=None, help="ranks (default: every GPU on CUDA, 2 on CPU)")
    p.add_argument("--backends", default=None, help="gosym first (the default group), then the "
                   "reference (default nccl or gloo)")
    p.add_argument("--dim", type=int, default=None, help="model width (default 4096 on CUDA, 64 on CPU)")
    p.add_argument("--layers", type=int, default=None, help="blocks (default 8 on CUDA, 2 on CPU)")
    p.add_argument("--tokens", type=int, default=None, help="tokens per rank per step "
                   "(default 1024 on CUDA, 64 on CPU)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default 512 on CUDA, 16 on CPU)")
    p.add_argument("--reduce-dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--steps", type=int, default=5, help="timed steps per backend per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds of turns")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per backend first")
    p.add_argument("--pg-alloc", action="store_true",
                   help="FSDP2's communication buffers from each group's own allocator "
                   "(set_allocate_memory_from_process_group_for_comm)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds the job may take")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--profile", type=int, default=0, metavar="ROWS",
                   help="profile one more step per backend and print rank 0's top ROWS ops by "
                        "device time, then by the CPU's own time")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--hang-dump", type=float, default=0.0, help=argparse.SUPPRESS)
    a, _ = p.parse_known_args(argv)
    cuda = a.device == "cuda"
    a.dim = a.dim or (4096 if cuda else 64)
    a.layers = a.layers or (8 if cuda else 2)
    a.tokens = a.tokens or (1024 if cuda else 64)
    a.seq = a.seq or (512 if cuda else 16)
    a.backends = a.backends or f"gosym,{_REFERENCE[a.device]}"
    if a.tokens % a.seq:
        p.error(f"--tokens {a.tokens} is not a multiple of --seq {a.seq}")
    if a.backends.split(",")[0] != "gosym":
        p.error("--backends: gosym comes first (it is the default group)")
    if a.rank:
        _rank_main(a)
        return 0
    nproc = a.nproc
    if nproc is None:
        import torch

        nproc = torch.cuda.device_count() if cuda else 2
    args = ["--rank", "--device", a.device, "--backends", a.backends, "--dim", str(a.dim),
            "--layers", str(a.layers), "--tokens", str(a.tokens), "--seq", str(a.seq),
            "--reduce-dtype", a.reduce_dtype, "--steps", str(a.steps), "--rounds", str(a.rounds),
            "--warmup", str(a.warmup), "--profile", str(a.profile), *(["--pg-alloc"] if a.pg_alloc else []),
            "--hang-dump", str(max(5.0, a.timeout - 15))]
    with tempfile.TemporaryDirectory(prefix="gosym-stepbench-") as tmp:
        cmd, env = module_job(nproc, "gosym.stepbench", *args, env=dict(os.environ, **{_RANK_ENV: tmp}))
        res = run_job(cmd, env, a.timeout)
        if res.returncode == 124:
            print(f"stepbench: the job ran past --timeout {a.timeout:g} s", file=sys.stderr)
        if res.returncode != 0:
            print(res.stdout[-4000:], res.stderr[-8000:], file=sys.stderr)
            return 1
        ranks = [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(nproc)]
    backends = a.backends.split(",")
    summary = _summary(ranks, backends)
    params = ranks[0]["params"]
    print(f"FSDP2 step, {a.device}, {nproc} ranks: {params / 1e6:.1f} M parameters (dim {a.dim}, "
          f"{a.layers} blocks), {a.tokens} tokens per rank, bf16 parameters, {a.reduce_dtype} "
          f"reduction; slowest rank per step")
    print(f"{'backend':8} {'median ms':>10} {'p10 ms':>8} {'p90 ms':>8} {'host ms':>8} {'steps':>6} "
          f"{'loss rel diff':>14} {'vs ' + backends[-1]:>10}")
    base = summary[backends[-1]]["median_ms"]
    for b in backends:
        s = summary[b]
        print(f"{b:8} {s['median_ms']:10.2f} {s['p10_ms']:8.2f} {s['p90_ms']:8.2f} "
              f"{s['host_median_ms']:8.2f} {s['steps']:6d} "
              f"{s['loss_max_rel']:14.3g} {base / s['median_ms']:9.2f}x")
    for b, table in ranks[0]["profiles"].items():
        print(f"== {b}, rank 0, one step under the profiler\n{table}")
    st = ranks[0]["gosym_stats"]
    print("gosym rank 0 counters:", {k: v for k, v in sorted(st.items())
                                     if k.startswith("gpu_") and isinstance(v, int) and v})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": a.device, "nproc": nproc, "params": params,
                       "config": {k: getattr(a, k) for k in ("dim", "layers", "tokens", "seq",
                                                             "reduce_dtype", "steps", "rounds",
                                                             "warmup", "backends", "pg_alloc")},
                       "summary": summary, "ranks": ranks}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
