"""DDP training: the same 50 steps on a gosym group and on a gloo group.

One launch trains the model twice from the same seed: once with DDP over the
default (gosym) group, once over a gloo group created next to it. Each rank
reports its per-step losses and a digest of the final parameters; the test
compares them. Small buckets make DDP issue several async all_reduces per
step; BatchNorm makes it broadcast buffers every forward. On CPU, an embedding
bag with sparse gradients trains 20 steps too (DDP all_reduces sparse tensors).
With --device cuda the model lives on the rank's GPU and the reference group
is NCCL.
"""

from __future__ import annotations


import torch
import torch.distributed as dist
import torch.nn as nn
import wcommon as wc
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 50
SPARSE_STEPS = 20


def build_model() -> nn.Module:
    torch.manual_seed(1234)  # identical start on every rank and in both runs
    return nn.Sequential(
        nn.Linear(32, 256), nn.BatchNorm1d(256), nn.Tanh(),
        nn.Linear(256, 256), nn.ReLU(),
        nn.Linear(256, 4),
    )


def train(group, rank: int, dev) -> tuple[list[float], str, list[str]]:
    """Returns per-step losses, a digest of all final parameters, per-parameter digests."""
    ddp = DDP(build_model().to(dev), process_group=group, bucket_cap_mb=0.05)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    teacher = torch.randn(32, 4, generator=torch.Generator().manual_seed(7))  # a learnable target
    losses = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(wc.seed_of("ddp", step, rank))
        x = torch.randn(16, 32, generator=g)
        y = x @ teacher + 0.01 * torch.randn(16, 4, generator=g)
        x, y = x.to(dev), y.to(dev)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = [wc.digest(p) for p in ddp.module.state_dict().values()]
    whole = torch.cat([p.detach().reshape(-1).double() for p in ddp.module.parameters()])
    return losses, wc.digest(whole), params


class Bag(nn.Module):
    """An embedding bag with sparse gradients: DDP all_reduces them as sparse tensors."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(99)
        self.emb = nn.Embedding(64, 16, sparse=True)
        self.head = nn.Linear(16, 1)

    def forward(self, idx):
        return self.head(self.emb(idx).mean(1))


def train_sparse(group, rank: int) -> list[float]:
    """Per-step losses of the Bag under DDP (CPU: NCCL has no sparse all_reduce)."""
    ddp = DDP(Bag(), process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    losses = []
    for step in range(SPARSE_STEPS):
        g = torch.Generator().manual_seed(wc.seed_of("ddp-sparse", step, rank))
        idx = torch.randint(0, 64, (8, 5), generator=g)
        y = torch.randn(8, 1, generator=g)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(ddp(idx), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    args = wc.setup(lambda p: p.add_argument("--device", default="cpu"))
    dev = torch.device("cpu")
    if args.device == "cuda":
        dev = wc.cuda_device()
        torch.backends.cudnn.deterministic = True
        torch.backends.cuda.matmul.allow_tf32 = False
    rank, world = wc.init(args.backend, args.timeout)
    torch.set_num_threads(1)
    ref = dist.new_group(backend="nccl" if dev.type == "cuda" else "gloo")
    losses_main, digest_main, params_main = train(None, rank, dev)
    losses_gloo, digest_gloo, params_gloo = train(ref, rank, dev)
    sparse = {}
    if dev.type == "cpu":
        sparse = {"main": train_sparse(None, rank), "gloo": train_sparse(ref, rank)}
    wc.write_result({
        "rank": rank,
        "failures": [],
        "losses": {"main": losses_main, "gloo": losses_gloo},
        "digest": {"main": digest_main, "gloo": digest_gloo},
        "params": {"main": params_main, "gloo": params_gloo},
        "sparse_losses": sparse,
    })
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
