"""A rank of a group across two simulated hosts (one rank each) SIGKILLed in a loop of
all_reduces (die) or of sends and receives around the ring (die-p2p), or asleep past the
timeout (late, stall), on CPU or CUDA tensors:
what the survivor raises, and when (tests/jobs/hier/hier_worker.py's scenario; test_rank_lost
asserts it on CPU). Where the CUDA path stands on issue 36's "a lost rank named within 10 s".

Usage: PYTHONPATH=python:tests:tests/jobs/hier:tests/jobs/common \\
    python3 scripts/hier_lost_probe.py cpu|cuda die,die-p2p,late,stall GROUP_TIMEOUT_S [OUTDIR]
"""
import pathlib
import sys
import time

import test_hier as th


def main():
    dev, scenarios, timeout = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
    out = pathlib.Path(sys.argv[4] if len(sys.argv) > 4 else "/tmp/hier-lost")
    for sc in scenarios:
        t0 = time.monotonic()
        res = th.run_hosts((1, 1), "hier_worker", ["--hosts", "1,1", "--device", dev, "--scenario", sc,
                                                  "--victim", 1, "--timeout", timeout],
                           out / sc, timeout=6 * timeout + 120, gpus=dev == "cuda", kind=th.ANY_HOSTS)
        print(f"== {dev} {sc}, group timeout {timeout} s: exit {res.returncode} after "
              f"{time.monotonic() - t0:.1f} s")
        for r in res.results:
            if r:
                print(f"   failures {r.get('failures')}, {r.get('info')}")
        print(res.tail(2000))


if __name__ == "__main__":
    main()
