"""The real-client scenarios: small training scripts run unchanged on any backend.

Each scenario is a function ``fn(ctx) -> list[float]`` run on every rank of a job
whose default process group is the backend under test (gloo or NCCL as the
reference, gosym as the candidate). It returns this rank's per-step losses (or,
for the collective-only scenarios, the values of its outputs). The harness
compares the lists of the two backends rank by rank. Everything random is
seeded from the scenario, step and rank, so both runs see the same data.
Scenarios raise on a failed internal check (a resumed checkpoint that does not
reproduce the uninterrupted run).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import wcommon as wc

CPU_STEPS = 6
CUDA_STEPS = 10


@dataclasses.dataclass
class Ctx:
    rank: int
    world: int
    device: torch.device
    backend: str
    scratch: str  # a directory every rank of the job shares (checkpoints)

    @property
    def steps(self) -> int:
        return CUDA_STEPS if self.device.type == "cuda" else CPU_STEPS

    def gen(self, *parts) -> torch.Generator:
        return torch.Generator().manual_seed(wc.seed_of(*parts))

    def randn(self, *shape, seed=(), dtype=torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen(*seed), dtype=dtype).to(self.device)


# -- shared pieces -------------------------------------------------------------------


class Block(nn.Module):
    """up -> GELU -> down: tensor parallelism splits up by columns and down by rows."""

    def __init__(self, d_in, hidden, d_out):
        super().__init__()
        self.up = nn.Linear(d_in, hidden)
        self.down = nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class MLP(nn.Module):
    def __init__(self, d_in=16, hidden=64, d_out=8, layers=2):
        super().__init__()
        self.layers = nn.ModuleList(Block(d_in if i == 0 else d_out, hidden, d_out) for i in range(layers))

    def forward(self, x):
        for blk in self.layers:
            x = blk(x)
        return x


def build(seed: int, ctx: Ctx, **kw) -> MLP:
    torch.manual_seed(seed)  # the same start on every rank and on both backends
    return MLP(**kw).to(ctx.device)


def batch(ctx: Ctx, name: str, step: int, who: int, rows=8, d_in=16, d_out=8):
    """(x, y) of one step for data-parallel rank ``who``: ranks that pass the same ``who``
    (the tensor-parallel ranks of one slice) get the same batch."""
    g = ctx.gen(name, step, who)
    x = torch.randn(rows, d_in, generator=g)
    y = torch.randn(rows, d_out, generator=g)
    return x.to(ctx.device), y.to(ctx.device)


def train(ctx: Ctx, name: str, model: nn.Module, steps: int, *, who=None, first=0,
          opt=None, lr=0.05) -> list[float]:
    """Per-step losses of ``steps`` AdamW (or ``opt``) steps from step ``first``;
    ``who``: the data-parallel rank whose batches to take (default: this rank)."""
    opt = opt or torch.optim.AdamW(model.parameters(), lr=lr)
    who = ctx.rank if who is None else who
    losses = []
    for step in range(first, first + steps):
        x, y = batch(ctx, name, step, who)
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()
        losses.append(_item(loss))
    return losses


def _item(loss) -> float:
    """A loss as a float; a DTensor loss (tensor parallel) as its full value."""
    full = getattr(loss, "full_tensor", None)
    return float((full() if full else loss).item())


def mesh(ctx: Ctx, shape, names):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(ctx.device.type, shape, mesh_dim_names=names)


def shard_fsdp(model: MLP, dp_mesh, mp=None) -> MLP:
    from torch.distributed.fsdp import fully_shard

    kw = {"mesh": dp_mesh}
    if mp is not None:
        kw["mp_policy"] = mp
    for blk in model.layers:
        fully_shard(blk, **kw)
    return fully_shard(model, **kw)


def tp_plan(model: MLP, tp_mesh) -> MLP:
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    for blk in model.layers:
        parallelize_module(blk, tp_mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    return model


# -- the scenarios -------------------------------------------------------------------


def ddp(ctx):
    import ddp_worker

    ddp_worker.STEPS = ctx.steps
    losses, _, _ = ddp_worker.train(None, ctx.rank, ctx.device)
    return losses


def fsdp2_fp32(ctx):
    model = shard_fsdp(build(11, ctx), mesh(ctx, (ctx.world,), ("dp",)))
    return train(ctx, "fsdp2", model, ctx.steps)


def _fsdp2_mixed(ctx, seed, reduce_dtype, sgd=False):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
    model = shard_fsdp(build(seed, ctx), mesh(ctx, (ctx.world,), ("dp",)), mp)
    opt = torch.optim.SGD(model.parameters(), lr=0.1) if sgd else None
    return train(ctx, f"fsdp2-{seed}", model, ctx.steps, opt=opt)


def fsdp2_bf16(ctx):
    return _fsdp2_mixed(ctx, 12, torch.float32)


def fsdp2_bf16_reduce(ctx):
    # SGD: AdamW would turn a last-bit difference of a tiny gradient into a full step.
    return _fsdp2_mixed(ctx, 18, torch.bfloat16, sgd=True)


def tp(ctx):
    model = tp_plan(build(13, ctx, hidden=64), mesh(ctx, (ctx.world,), ("tp",)))
    return train(ctx, "tp", model, ctx.steps, who=0)  # every tp rank sees the same batch


def fsdp_tp(ctx):
    m = mesh(ctx, (ctx.world // 2, 2), ("dp", "tp"))
    model = shard_fsdp(tp_plan(build(14, ctx), m["tp"]), m["dp"])
    return train(ctx, "fsdp_tp", model, ctx.steps, who=m["dp"].get_local_rank())


def _pipeline(ctx: Ctx, schedule_cls) -> list[float]:
    """One stage per rank (a Linear+GELU block each), 4 microbatches (8 past 4 ranks: 1F1B
    needs as many as stages); the last stage's per-step mean loss."""
    from torch.distributed.pipelining import PipelineStage

    torch.manual_seed(15)
    blocks = [nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(ctx.world)]
    stage_mod = blocks[ctx.rank].to(ctx.device)
    stage = PipelineStage(stage_mod, ctx.rank, ctx.world, ctx.device)
    sched = schedule_cls(stage, n_microbatches=4 if ctx.world <= 4 else 8, loss_fn=F.mse_loss)
    opt = torch.optim.AdamW(stage_mod.parameters(), lr=0.05)
    first, last = ctx.rank == 0, ctx.rank == ctx.world - 1
    out = []
    for step in range(ctx.steps):
        g = ctx.gen("pipe", step)
        x, y = torch.randn(8, 16, generator=g).to(ctx.device), torch.randn(8, 16, generator=g).to(ctx.device)
        opt.zero_grad(set_to_none=True)
        losses: list = []
        if first and last:
            sched.step(x, target=y, losses=losses)
        elif first:
            sched.step(x)
        elif last:
            sched.step(target=y, losses=losses)
        else:
            sched.step()
        opt.step()
        if last:
            out.append(float(torch.stack([l.detach() for l in losses]).mean().item()))
    # Every stage trained: the first stage's weights moved as well.
    out.append(float(stage_mod[0].weight.detach().double().sum().item()))
    return out


def pipe_gpipe(ctx):
    from torch.distributed.pipelining import ScheduleGPipe

    return _pipeline(ctx, ScheduleGPipe)


def pipe_1f1b(ctx):
    from torch.distributed.pipelining import Schedule1F1B

    return _pipeline(ctx, Schedule1F1B)


def dcp(ctx):
    import torch.distributed.checkpoint as dcp_
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = os.path.join(ctx.scratch, f"dcp-{ctx.backend}")
    dp = mesh(ctx, (ctx.world,), ("dp",))
    half = ctx.steps // 2

    def fresh(seed):
        model = shard_fsdp(build(seed, ctx), dp)
        return model, torch.optim.AdamW(model.parameters(), lr=0.05)

    model, opt = fresh(16)
    first = train(ctx, "dcp", model, half, opt=opt)
    msd, osd = get_state_dict(model, opt)
    dcp_.save({"model": msd, "optim": osd}, checkpoint_id=path)
    straight = train(ctx, "dcp", model, ctx.steps - half, first=half, opt=opt)

    model2, opt2 = fresh(99)  # different weights, so a load that does nothing shows
    msd2, osd2 = get_state_dict(model2, opt2)
    state = {"model": msd2, "optim": osd2}
    dcp_.load(state, checkpoint_id=path)
    set_state_dict(model2, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
    resumed = train(ctx, "dcp", model2, ctx.steps - half, first=half, opt=opt2)
    if resumed != straight:
        raise AssertionError(f"resumed losses {resumed} differ from the uninterrupted run's {straight}")
    dist.barrier()
    if ctx.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
    return first + straight


def _funcol_values(ctx: Ctx, name: str, fn) -> list[float]:
    """fn(inputs...) of fresh random inputs for two rounds; every output element."""
    out = []
    for step in range(2):
        a = ctx.randn(4 * ctx.world, seed=(name, "a", step, ctx.rank))
        b = ctx.randn(3, seed=(name, "b", step, ctx.rank))
        for t in fn(a, b):
            out.extend(t.detach().double().reshape(-1).cpu().tolist())
    return out


def _funcols(a, b):
    import torch.distributed._functional_collectives as fc

    grp = dist.group.WORLD
    world = dist.get_world_size()
    r1 = fc.all_reduce(a * 2, "sum", grp)
    r2 = fc.all_gather_tensor(b + 1, 0, grp)
    r3 = fc.reduce_scatter_tensor(a.sin(), "sum", 0, grp)
    r4 = fc.all_to_all_single(a.cos(), [4] * world, [4] * world, grp)
    r5 = fc.all_reduce(b, "max", grp)
    return [fc.wait_tensor(r) for r in (r1, r2, r3, r4, r5)]


def funcol_eager(ctx):
    return _funcol_values(ctx, "funcol", _funcols)


def compile_backend(ctx: Ctx) -> str:
    """inductor on CUDA; aot_eager on CPU (inductor's C++ compile is minutes on a CI host)."""
    return os.environ.get("GOSYM_CLIENTS_COMPILE", "inductor" if ctx.device.type == "cuda" else "aot_eager")


def funcol_compile(ctx):
    fn = torch.compile(_funcols, backend=compile_backend(ctx), fullgraph=True)
    return _funcol_values(ctx, "funcol", fn)


def compiled_ddp(ctx):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(build(17, ctx))  # one bucket: DDPOptimizer's first is 1 MB, more than the model
    cmodel = torch.compile(model, backend=compile_backend(ctx))
    return train(ctx, "compiled_ddp", cmodel, ctx.steps)


def split(ctx):
    pg = dist.group.WORLD
    faked = pg.bound_device_id is None and ctx.backend != "gloo"
    if faked:  # torch takes no CPU device_id, and split_group demands a bound device
        pg.bound_device_id = torch.device("cuda", 0)
    try:
        return _split_values(ctx)
    finally:
        if faked:
            pg.bound_device_id = None


def _split_values(ctx) -> list[float]:
    """Halves, the whole world, ranks {0, 1} alone (the others must get None), then
    every other rank (after a split that left ranks out: torch names the groups from
    what each rank registered, which then differs between their members); at an even
    world, a 2-D DeviceMesh's groups."""
    w = ctx.world
    out = []
    layouts = [[list(range(0, w // 2)), list(range(w // 2, w))], [list(range(w))],
               [list(range(min(w, 2)))], [list(range(j, w, 2)) for j in range(2)]]
    layouts = [[r for r in splits if r] for splits in layouts]  # world 1: no empty half
    for i, splits in enumerate(layouts):
        mine = next((r for r in splits if ctx.rank in r), None)
        if ctx.backend == "gloo":
            # gloo splits only with hand-made options and hangs on CPU: the reference
            # is the same ranks' groups from new_group.
            subs = [dist.new_group(r) for r in splits]
            sub = subs[splits.index(mine)] if mine else None
        else:
            sub = dist.split_group(split_ranks=splits)
        if mine is None:
            if sub is not None:
                raise AssertionError(f"rank {ctx.rank} is in no split of {splits} but got {sub}")
            continue
        if sub is None:
            raise AssertionError(f"split_group returned None for a member of {splits}")
        if dist.get_process_group_ranks(sub) != mine or sub.size() != len(mine):
            raise AssertionError(f"split {i}: ranks {dist.get_process_group_ranks(sub)}, want {mine}")
        a = ctx.randn(5, seed=("split", i, ctx.rank))
        dist.all_reduce(a, group=sub)
        g = [torch.empty(3, device=ctx.device) for _ in mine]
        dist.all_gather(g, ctx.randn(3, seed=("split-ag", i, ctx.rank)), group=sub)
        for t in [a, *g]:
            out.extend(t.double().reshape(-1).cpu().tolist())
    if w % 2 == 0:
        # A 2-D DeviceMesh: from a device-bound default group (CUDA) its dimension
        # groups come from split_group, as torchtitan's do.
        m = mesh(ctx, (w // 2, 2), ("a", "b"))
        for dim in ("a", "b"):
            t = ctx.randn(4, seed=("split-mesh", dim, ctx.rank))
            dist.all_reduce(t, group=m.get_group(dim))
            out.extend(t.double().cpu().tolist())
    return out


def stall_at_exit(ctx):
    """Not a client: the harness's own test of a job that hangs after its scenarios. Every
    value is right, and on gosym the last rank's process then never exits (an exit handler
    sleeps), as a teardown that hangs would look."""
    if ctx.rank == ctx.world - 1 and ctx.backend == "gosym":
        import atexit

        atexit.register(time.sleep, 3600)
    return [1.0]


def stall(ctx):
    """Not a client: the harness's own test of a hung scenario. The last rank sleeps and
    the others wait for it in a collective, as a hang in a real client would look."""
    if ctx.rank == ctx.world - 1:
        time.sleep(3600)
    dist.barrier()
    return [0.0]
