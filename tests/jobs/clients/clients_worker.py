"""One rank of a real-client job: runs the named scenarios on one backend in turn.

Started by harness.py (conftest's spawn launcher: RANK, WORLD_SIZE,
MASTER_ADDR/PORT in the environment). The default group is the backend under
test; on CUDA it is created eagerly with ``device_id`` (as torchtitan and
DeviceMesh users do, so 2-D meshes come from split_group). Writes
rank<r>.json: per scenario its values, or the error it raised.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time
import traceback
from pathlib import Path

_STARTED = time.monotonic()  # before torch's import: the job's phases (main) start here

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "common")]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import scenarios as sc  # noqa: E402
import wcommon as wc  # noqa: E402


def _args(p):
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--scenarios", required=True, help="comma-separated scenario names")
    p.add_argument("--scratch", required=True, help="a directory all ranks share")
    p.add_argument("--scenario-timeout", type=float, default=150.0,
                   help="seconds a scenario may take before this rank reports it hung and exits")


def _deadline(rank, name, seconds, results, backend):
    """A timer that records scenario name as hung and ends this rank (os._exit: a rank
    stuck in a collective cannot unwind) if it runs past seconds."""
    def fire():
        results[name] = {"values": None, "started": True, "hung": True,
                         "error": f"{name} did not finish within {seconds:g} s on rank {rank} (hung)"}
        wc.write_result({"rank": rank, "failures": [], "backend": backend, "scenarios": results})
        print(f"[rank {rank}] {name} on {backend} did not finish within {seconds:g} s: exiting",
              file=sys.stderr, flush=True)
        os._exit(3)
    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()
    return t


def main():
    args = wc.setup(_args)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    kw = {}
    if args.device == "cuda":
        dev = wc.cuda_device()
        torch.backends.cudnn.deterministic = True
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        kw["device_id"] = dev
    else:
        dev = torch.device("cpu")
    if args.backend == "gosym":
        import gosym  # noqa: F401  (registers the backend)
    t_init = time.monotonic()
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout), **kw)
    # Seconds of the job's phases outside the scenarios (imports, init, teardown), so that a
    # slow job says where its time went.
    phases = {"imports_s": round(t_init - _STARTED, 2), "init_s": round(time.monotonic() - t_init, 2)}
    ctx = sc.Ctx(rank, world, dev, args.backend, args.scratch)
    results = {}

    def write():
        wc.write_result({"rank": rank, "failures": [], "backend": args.backend, "scenarios": results,
                         "phases": phases})

    for name in args.scenarios.split(","):
        t0 = time.monotonic()
        entry = {"values": None, "error": None}
        # Marked before it runs: a scenario that hangs is named by the harness, which
        # resumes the job after it (a hung collective may never raise).
        results[name] = {"values": None, "error": None, "started": True}
        write()
        watchdog = _deadline(rank, name, args.scenario_timeout, results, args.backend)
        try:
            entry["values"] = getattr(sc, name)(ctx)
            if dev.type == "cuda":
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - reported per scenario
            entry["error"] = f"{wc.error_text(e)}\n{traceback.format_exc(limit=-6)}"
            print(f"[rank {rank}] {name} on {args.backend} raised:\n{entry['error']}", file=sys.stderr)
        watchdog.cancel()
        entry["seconds"] = round(time.monotonic() - t0, 2)
        results[name] = entry
        # Written after every scenario, so a later hang keeps the earlier results.
        write()
    t_end = time.monotonic()
    if args.backend != "gosym":
        # The reference's teardown is not under test, and NCCL's can hang: at world 3 on
        # 4xH200 (sessions 22 and 23) an NCCL job sat 380 s after its scenarios until the
        # job's deadline while gosym's shard ended in 19 s. Its results are written; leave.
        phases["destroy_skipped"] = True
        write()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    phases["destroy_started"] = True  # without destroy_s after it: the teardown hung
    write()
    dist.destroy_process_group()
    phases["destroy_s"] = round(time.monotonic() - t_end, 2)
    write()


if __name__ == "__main__":
    main()
