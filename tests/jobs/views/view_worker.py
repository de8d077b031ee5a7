"""gosym.contiguous_view on CPU tensors from gosym.empty (test_views.py): row r
aliases rank r's buffer for reads and writes, with a page-padded row stride; the same
buffer gives back the same view, another buffer (equal contents) another; a tensor at an
offset into its buffer works; the view outlives its buffer; sizes that differ fail on
every rank alike; other memory is refused; views and buffers are given back."""

from __future__ import annotations

import gc

import torch
import torch.distributed as dist
import wcommon as wc

import gosym


def _fill(rank, n, cols):
    return torch.arange(n * cols, dtype=torch.float32).view(n, cols) + 1000 * rank


def main():
    args = wc.setup()
    rank, world = wc.init(args.backend, args.timeout)
    ck = wc.Checker(rank)
    base_handles = gosym.process_stats()["handles"]
    n, cols = 1000, 3  # 12000 bytes: not a multiple of the page size
    x = gosym.empty(n, cols, dtype=torch.float32)
    x.copy_(_fill(rank, n, cols))
    dist.barrier()
    v = gosym.contiguous_view(x)
    ck.check("shape", v.shape == (world, n, cols), str(tuple(v.shape)))
    ck.check("page-padded row stride", v.stride(0) * 4 >= n * cols * 4 and v.stride(0) * 4 % 4096 == 0,
             str(v.stride()))
    for r in range(world):
        why = wc.compare(v[r], _fill(r, n, cols))
        ck.check(f"row {r} is rank {r}'s buffer", why is None, why or "")
    dist.barrier()
    v[(rank + 1) % world][0].fill_(-1.0 - rank)
    dist.barrier()
    ck.check("a peer's write lands in this rank's buffer",
             bool((x[0] == -1.0 - (rank - 1) % world).all()), str(x[0].tolist()))
    ck.check("same buffer, same view", gosym.contiguous_view(x) is v)
    y = gosym.empty(n, cols, dtype=torch.float32)
    y.copy_(x)
    vy = gosym.contiguous_view(y)
    ck.check("another buffer, another view", vy.data_ptr() != v.data_ptr())
    part = x[10:20, 1]
    vp = gosym.contiguous_view(part)
    ok = all(torch.equal(vp[r], v[r][10:20, 1]) for r in range(world))
    ck.check("a strided tensor at an offset", ok and vp.shape == (world, 10), str(tuple(vp.shape)))
    dist.barrier()
    keep = v[(rank + 1) % world][5:7].clone()
    del x, part, vp
    gc.collect()
    dist.barrier()
    ck.check("the view outlives its buffer", torch.equal(v[(rank + 1) % world][5:7], keep))
    bad = gosym.empty(4096 * (1 + 2 * (rank == 0)), dtype=torch.uint8)
    e = ck.expect_error("sizes differ", gosym.contiguous_view, bad)
    if e is not None:
        ck.check("sizes differ: names a rank and both sizes", "rank" in str(e) and "bytes" in str(e),
                 wc.error_text(e))
    e = ck.expect_error("ordinary tensor", gosym.contiguous_view, torch.ones(8))
    if e is not None:
        ck.check("ordinary tensor: ValueError", isinstance(e, ValueError), wc.error_text(e))
    t = torch.full((4,), float(rank))
    dist.all_reduce(t)
    ck.check("the group goes on", bool((t == world * (world - 1) / 2).all()))
    del v, vy, y, bad, keep
    gc.collect()
    after = gosym.process_stats()["handles"]
    ck.check("views and buffers given back", after == base_handles, f"{base_handles} -> {after}")
    wc.write_result(ck.result())
    wc.print_summary(ck, "views")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
