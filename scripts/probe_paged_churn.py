"""What happens to gosym's runs of pages when torch gives expandable-segment pages back
(empty_cache) and allocates again: addresses, reserved bytes and the runs counters per step.
Launch on 2 GPUs with the safety variables set:

  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True GOSYM_GPU_DIRECT_MIN=1 \\
      torchrun --nproc-per-node 2 scripts/probe_paged_churn.py
"""

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import gosym  # noqa: E402,F401

KEYS = ("gpu_direct_ops", "gpu_page_runs_made", "gpu_page_runs_retired", "gpu_peer_map_dropped")


def main():
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("gosym")
    rank = dist.get_rank()
    steps = []
    for rnd in range(3):
        for n in (600_003, 6 * 2**20 + 3):
            p = torch.ones(n, device=dev)
            dist.all_reduce(p)
            st = gosym.stats()
            steps.append({"round": rnd, "n": n, "ptr": hex(p.data_ptr()), "ok": bool((p == dist.get_world_size()).all()),
                          "reserved": torch.cuda.memory_reserved(dev), **{k: int(st.get(k, 0)) for k in KEYS}})
            del p
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        steps.append({"round": rnd, "after_empty_cache_reserved": torch.cuda.memory_reserved(dev)})
    if rank == 0:
        print(json.dumps(steps, indent=1), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
