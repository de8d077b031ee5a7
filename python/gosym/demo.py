"""Train one small model with DDP on backend "gosym" and again on "gloo", and compare.

    python -m gosym.demo [--nproc 2] [--steps 50] [--backends gosym,gloo]

Run plainly, it launches itself under torchrun once per backend with the same
seed and data, then prints the losses side by side, the training-loop times,
and whether the losses agree bit for bit. Under torchrun (RANK is set) it is
the worker: every rank trains the same MLP on its shard of a synthetic
classification set, and rank 0 writes its losses and time to a JSON file.
"""

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time

# A stuck child (a hang in a backend) must not hang the demo.
CHILD_TIMEOUT_S = 300
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m gosym.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2, help="ranks per run (default 2)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--every", type=int, default=10, help="print every N-th step")
    ap.add_argument("--backends", default="gosym,gloo",
                    help="comma-separated backends to compare (default gosym,gloo)")
    ap.add_argument("--timeout", type=float, default=CHILD_TIMEOUT_S,
                    help="seconds each torchrun may take")
    # Worker-only options, passed by the launcher.
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


# ---------------------------------------------------------------- worker


def worker(args):
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    if args.backend == "gosym":
        import gosym  # noqa: F401  (importing registers the backend)

    torch.set_num_threads(1)
    dist.init_process_group(backend=args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    # The same data for every backend: a fixed generator, a random linear
    # "teacher" for the labels, and a disjoint shard per rank at every step.
    gen = torch.Generator().manual_seed(args.seed)
    teacher = torch.randn(64, 10, generator=gen)
    x = torch.randn(args.steps, world * args.batch, 64, generator=gen)
    y = (x @ teacher).argmax(dim=-1)
    shard = slice(rank * args.batch, (rank + 1) * args.batch)
    x, y = x[:, shard].contiguous(), y[:, shard].contiguous()

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()

    losses = []
    dist.barrier()
    start = time.perf_counter()
    for step in range(args.steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x[step]), y[step])
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if rank == 0 and (step % args.every == 0 or step == args.steps - 1):
            print(f"[{args.backend}] step {step:3d}  loss {losses[-1]:.6f}", flush=True)
    dist.barrier()
    elapsed = time.perf_counter() - start

    if rank == 0:
        print(f"[{args.backend}] {args.steps} steps in {elapsed:.3f} s", flush=True)
        with open(args.out, "w") as f:
            json.dump({"backend": args.backend, "world": world, "steps": args.steps,
                       "time_s": elapsed, "losses": losses,
                       "torch": torch.__version__}, f)
    dist.destroy_process_group()


# ---------------------------------------------------------------- launcher


def run_backend(args, backend, out_path):
    """Runs one torchrun; returns its exit status (124 on timeout)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={args.nproc}", "-m", "gosym.demo",
           "--backend", backend, "--out", out_path,
           "--steps", str(args.steps), "--batch", str(args.batch), "--lr", str(args.lr),
           "--seed", str(args.seed), "--every", str(args.every)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # The workers must import this very gosym, installed or from the tree.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PKG_PARENT, env.get("PYTHONPATH")) if p)
    print(f"== {backend}: {' '.join(cmd[2:5])} ...", flush=True)
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        print(f"== {backend}: no result after {args.timeout:.0f} s, stopping it", file=sys.stderr)
        stop(proc)
        return 124
    except BaseException:
        stop(proc)
        raise


def stop(proc):
    """SIGTERM lets torchrun stop its workers; SIGKILL the group if it will not."""
    for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            pass


def report(results):
    """Prints the loss table and times; returns 1 if two runs disagree beyond rounding."""
    names = list(results)
    steps = len(results[names[0]]["losses"])
    every = results[names[0]]["every"]
    shown = {s for s in range(steps) if s % every == 0 or s == steps - 1}
    pair = [results[n]["losses"] for n in names] if len(names) == 2 else None
    first_diff = next((s for s in range(steps) if pair[0][s] != pair[1][s]), None) if pair else None
    if first_diff is not None:
        shown.add(first_diff)

    print(f"\n{'step':>5}" + "".join(f"  {'loss ' + n:>16}" for n in names)
          + ("  equal?" if pair else ""))
    for s in sorted(shown):
        vals = [results[n]["losses"][s] for n in names]
        row = f"{s:>5}" + "".join(f"  {v:>16.9f}" for v in vals)
        if pair:
            row += "  " + ("yes" if vals[0] == vals[1] else "NO")
        print(row)
    print()
    for n in names:
        r = results[n]
        print(f"{n:>8}: {r['time_s']:.3f} s for {steps} steps "
              f"({1e3 * r['time_s'] / steps:.2f} ms/step, {r['world']} ranks)")
    if not pair:
        return 0
    which = f"losses of {names[0]} and {names[1]}"
    if first_diff is None:
        print(f"\n{which}: bitwise equal at all {steps} steps")
        return 0
    a, b = pair
    diff = max(abs(x - y) for x, y in zip(a, b))
    close = all(math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-6) for x, y in zip(a, b))
    print(f"\n{which}: NOT bitwise equal from step {first_diff} (max |diff| {diff:.3g}; "
          f"{'within' if close else 'OUTSIDE'} relative tolerance 1e-4)")
    return 0 if close else 1


def launch(args):
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    results = {}
    with tempfile.TemporaryDirectory(prefix="gosym-demo-") as tmp:
        for backend in backends:
            out = os.path.join(tmp, f"{backend}.json")
            rc = run_backend(args, backend, out)
            if rc != 0 or not os.path.exists(out):
                print(f"== {backend}: torchrun failed (exit status {rc})", file=sys.stderr)
                return rc or 1
            with open(out) as f:
                results[backend] = dict(json.load(f), every=args.every)
    return report(results)


def main(argv=None):
    args = parse_args(argv)
    if "RANK" in os.environ:
        if not args.backend or not args.out:
            sys.exit("gosym.demo: under torchrun, --backend and --out are required")
        worker(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
