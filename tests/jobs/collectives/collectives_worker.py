"""Correctness matrix for one world size: every collective x dtype x reduce op x size.

Every rank can regenerate every rank's input (seed = case name + rank), so it
computes the expected result locally in float64 (or exact integer/bool
arithmetic) and compares its own output. Outputs are poisoned before each op
(NaN, or the bitwise complement of the expected value) so that elements the
backend never wrote show up. Reduction inputs are chosen so that, where the
spec makes the answer exact (fp16/bf16 accumulated in fp32 and rounded once,
products of small dyadic numbers, 2-rank fp32 sums), the check is bitwise.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import wcommon as wc
from wcommon import LARGE, make_input, poison_like

SIZES = [0, 1, 3, 1025]

# name -> ReduceOp factory (PREMUL_SUM carries its factor).
REDOPS = {
    "SUM": lambda: dist.ReduceOp.SUM,
    "AVG": lambda: dist.ReduceOp.AVG,
    "PRODUCT": lambda: dist.ReduceOp.PRODUCT,
    "MIN": lambda: dist.ReduceOp.MIN,
    "MAX": lambda: dist.ReduceOp.MAX,
    "PREMUL_SUM(0.5)": lambda: dist._make_nccl_premul_sum(0.5),
    "PREMUL_SUM(0.3)": lambda: dist._make_nccl_premul_sum(0.3),
    "BAND": lambda: dist.ReduceOp.BAND,
    "BOR": lambda: dist.ReduceOp.BOR,
    "BXOR": lambda: dist.ReduceOp.BXOR,
}
BITWISE = {"BAND", "BOR", "BXOR"}


def premul_factor(opname: str) -> float | None:
    return float(opname[len("PREMUL_SUM(") : -1]) if opname.startswith("PREMUL_SUM") else None


def supported(dtype: torch.dtype, opname: str) -> bool:
    """The issue's matrix: AVG/PREMUL_SUM need floats, bitwise ops need ints or bool."""
    if dtype.is_floating_point:
        return opname not in BITWISE
    return opname != "AVG" and premul_factor(opname) is None


def _fold(fn, xs):
    r = xs[0]
    for x in xs[1:]:
        r = fn(r, x)
    return r


# Elementwise folds in rank order (much faster than reducing a stacked dim 0).
# torch.minimum/maximum propagate NaN, as MIN/MAX must.
_FOLDS = {
    "SUM": torch.add, "PRODUCT": torch.mul, "MIN": torch.minimum, "MAX": torch.maximum,
    "BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor,
}


def reduce_ref(xs: list[torch.Tensor], dtype: torch.dtype, opname: str, world: int):
    """Expected reduction of xs and an elementwise tolerance (None: must be bitwise equal)."""
    if dtype == torch.bool:
        alias = {"SUM": "BOR", "MAX": "BOR", "PRODUCT": "BAND", "MIN": "BAND"}
        return _fold(_FOLDS[alias.get(opname, opname)], xs), None
    if not dtype.is_floating_point:
        if opname in BITWISE:
            return _fold(_FOLDS[opname], xs), None
        # int64 arithmetic wraps; the cast keeps the low bits: two's-complement wrap.
        return _fold(_FOLDS[opname], [x.to(torch.int64) for x in xs]).to(dtype), None

    factor = premul_factor(opname)
    terms = [x.double() * factor if factor is not None else x.double() for x in xs]
    if opname == "AVG":
        r = _fold(torch.add, terms) / world
    else:
        r = _fold(_FOLDS["SUM" if factor is not None else opname], terms)
    exp = r.to(dtype)

    low_precision = dtype in (torch.float16, torch.bfloat16)
    exact = (
        opname in ("PRODUCT", "MIN", "MAX")
        or (low_precision and (opname in ("SUM", "AVG") or factor == 0.5))
        or (world <= 2 and (opname in ("SUM", "AVG") or factor == 0.5))
    )
    if exact:
        return exp, None
    eps_out = torch.finfo(dtype).eps
    # fp32 accumulation for <=32-bit floats; a premul in the low precision type is allowed.
    eps_acc = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
    if low_precision:
        eps_acc = eps_out
    spread = _fold(torch.add, [t.abs() for t in terms]) / (world if opname == "AVG" else 1)
    return exp, 2 * (eps_out * r.abs() + world * eps_acc * spread)


class Matrix:
    def __init__(self, rank: int, world: int, ck: wc.Checker, group=None):
        self.rank, self.world, self.ck, self.group = rank, world, ck, group
        self.digests: dict[str, str] = {}

    # -- helpers -----------------------------------------------------------
    def inputs(self, case, n, dtype, opname=""):
        return [make_input(case, i, n, dtype, opname) for i in range(self.world)]

    def root(self, case) -> int:
        return wc.seed_of(case, "root") % self.world

    def expect(self, case, got, exp, tol=None):
        why = wc.compare(got, exp, tol)
        self.ck.check(case, why is None, why or "")

    def unchanged(self, case, t, orig):
        why = wc.compare(t, orig)
        self.ck.check(case + " [input unchanged]", why is None, why or "")

    def splits(self, case, n):
        """Uneven all-to-all counts s[i][j] (rank i -> rank j), zeros included."""
        salt = wc.seed_of(case, "splits") % 5
        return [[((i * 7 + j * 3 + salt) % 5) * n for j in range(self.world)] for i in range(self.world)]

    # -- reductions ----------------------------------------------------------
    def all_reduce(self, case, dtype, opname, n, nan=False):
        xs = self.inputs(case, n, dtype, opname)
        if nan:  # rank i puts a NaN at index 2*i: MIN/MAX must propagate it
            for i, x in enumerate(xs):
                if 2 * i < n:
                    x[2 * i] = float("nan")
        exp, tol = reduce_ref(xs, dtype, opname, self.world)
        t = xs[self.rank].clone()
        dist.all_reduce(t, op=REDOPS[opname](), group=self.group)
        self.expect(case, t, exp, tol)
        self.digests[case] = wc.digest(t)

    def reduce(self, case, dtype, opname, n):
        xs = self.inputs(case, n, dtype, opname)
        exp, tol = reduce_ref(xs, dtype, opname, self.world)
        root = self.root(case)
        t = xs[self.rank].clone()
        dist.reduce(t, dst=root, op=REDOPS[opname](), group=self.group)
        if self.rank == root:  # like gloo, non-root buffers are scratch afterwards
            self.expect(case, t, exp, tol)

    def reduce_scatter(self, case, dtype, opname, n, flat=False):
        xs = self.inputs(case, self.world * n, dtype, opname)
        exp, tol = reduce_ref([x[self.rank * n : (self.rank + 1) * n] for x in xs], dtype, opname, self.world)
        mine = xs[self.rank].clone()
        out = poison_like(exp)
        if flat:
            dist.reduce_scatter_tensor(out, mine, op=REDOPS[opname](), group=self.group)
        else:
            dist.reduce_scatter(out, list(mine.split(n)) if n else [mine[:0]] * self.world,
                                op=REDOPS[opname](), group=self.group)
        self.expect(case, out, exp, tol)
        self.unchanged(case, mine, xs[self.rank])

    def unsupported(self, op, dtype, opname):
        t = make_input(op, self.rank, 3 * self.world, dtype)
        redop = REDOPS[opname]()
        if op == "all_reduce":
            dist.all_reduce(t, op=redop, group=self.group)
        elif op == "reduce":
            dist.reduce(t, dst=0, op=redop, group=self.group)
        else:
            dist.reduce_scatter_tensor(t[:3].clone(), t, op=redop, group=self.group)

    # -- data movement -------------------------------------------------------
    def broadcast(self, case, dtype, n):
        xs = self.inputs(case, n, dtype)
        src = self.root(case)
        t = xs[src].clone() if self.rank == src else poison_like(xs[src])
        dist.broadcast(t, src=src, group=self.group)
        self.expect(case, t, xs[src])

    def all_gather(self, case, dtype, n):
        xs = self.inputs(case, n, dtype)
        mine = xs[self.rank].clone()
        outs = [poison_like(x) for x in xs]
        dist.all_gather(outs, mine, group=self.group)
        for i, (o, x) in enumerate(zip(outs, xs)):
            self.expect(f"{case} [from rank {i}]", o, x)
        self.unchanged(case, mine, xs[self.rank])

    def all_gather_into_tensor(self, case, dtype, n):
        xs = self.inputs(case, n, dtype)
        exp = torch.cat(xs)
        mine = xs[self.rank].clone()
        out = poison_like(exp)
        dist.all_gather_into_tensor(out, mine, group=self.group)
        self.expect(case, out, exp)
        self.unchanged(case, mine, xs[self.rank])

    def all_gather_in_place(self, case, dtype, n):
        """The FSDP pattern: the input is this rank's slice of the output."""
        xs = self.inputs(case, n, dtype)
        exp = torch.cat(xs)
        out = poison_like(exp)
        out[self.rank * n : (self.rank + 1) * n] = xs[self.rank]
        dist.all_gather_into_tensor(out, out[self.rank * n : (self.rank + 1) * n], group=self.group)
        self.expect(case, out, exp)

    def all_to_all_single(self, case, dtype, n, uneven):
        w, r = self.world, self.rank
        s = self.splits(case, n) if uneven else [[n] * w for _ in range(w)]
        xs = [make_input(case, i, sum(s[i]), dtype) for i in range(w)]
        # Rank i's chunk for rank r starts after its chunks for ranks < r.
        exp = torch.cat([xs[i][sum(s[i][:r]) : sum(s[i][: r + 1])] for i in range(w)])
        mine = xs[r].clone()
        out = poison_like(exp)
        if uneven:
            dist.all_to_all_single(out, mine, output_split_sizes=[s[i][r] for i in range(w)],
                                   input_split_sizes=s[r], group=self.group)
        else:
            dist.all_to_all_single(out, mine, group=self.group)
        self.expect(case, out, exp)
        self.unchanged(case, mine, xs[r])

    def all_to_all(self, case, dtype, n):
        w, r = self.world, self.rank
        s = self.splits(case, n)
        xs = [make_input(case, i, sum(s[i]), dtype) for i in range(w)]
        exps = [xs[i][sum(s[i][:r]) : sum(s[i][: r + 1])] for i in range(w)]
        ins = list(xs[r].clone().split(s[r]))
        outs = [poison_like(e) for e in exps]
        dist.all_to_all(outs, ins, group=self.group)
        for i, (o, e) in enumerate(zip(outs, exps)):
            self.expect(f"{case} [from rank {i}]", o, e)

    def gather(self, case, dtype, n):
        xs = self.inputs(case, n, dtype)
        dst = self.root(case)
        outs = [poison_like(x) for x in xs] if self.rank == dst else None
        mine = xs[self.rank].clone()
        dist.gather(mine, gather_list=outs, dst=dst, group=self.group)
        if outs is not None:
            for i, (o, x) in enumerate(zip(outs, xs)):
                self.expect(f"{case} [from rank {i}]", o, x)
        self.unchanged(case, mine, xs[self.rank])

    def scatter(self, case, dtype, n):
        src = self.root(case)
        full = make_input(case, src, self.world * n, dtype)
        chunks = list(full.split(n)) if n else [full[:0]] * self.world
        exp = chunks[self.rank]
        out = poison_like(exp)
        dist.scatter(out, scatter_list=[c.clone() for c in chunks] if self.rank == src else None,
                     src=src, group=self.group)
        self.expect(case, out, exp)

    # -- layouts -------------------------------------------------------------
    def offset_view(self, case, dtype, n):
        """A view at storage offset 1 (misaligned for wide types), guards on both sides."""
        xs = self.inputs(case, n, dtype)
        exp, tol = reduce_ref(xs, dtype, "SUM" if dtype != torch.bool else "BOR", self.world)
        base = make_input(case + "/guard", self.rank, n + 2, dtype)
        guard = base.clone()
        base[1 : n + 1] = xs[self.rank]
        dist.all_reduce(base[1 : n + 1], op=dist.ReduceOp.SUM if dtype != torch.bool else dist.ReduceOp.BOR,
                        group=self.group)
        self.expect(case, base[1 : n + 1], exp, tol)
        self.expect(case + " [guards]", base[[0, n + 1]], guard[[0, n + 1]])

    def shaped(self, case, dtype):
        """Multi-dimensional tensors keep their shape and element order."""
        shape = (3, 5, 7)
        n = 3 * 5 * 7
        xs = [x.reshape(shape) for x in self.inputs(case, n, dtype)]
        exp, tol = reduce_ref([x.reshape(-1) for x in xs], dtype, "MAX", self.world)
        t = xs[self.rank].clone()
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        self.expect(case + " all_reduce", t, exp.reshape(shape), tol)
        out = poison_like(torch.cat(xs))
        dist.all_gather_into_tensor(out, xs[self.rank].clone(), group=self.group)
        self.expect(case + " all_gather_into_tensor", out, torch.cat(xs))

    def complex_ops(self, case):
        """torch hands complex tensors over as (real, imag) pairs; results must still be right."""
        xs = self.inputs(case, 2 * 9, torch.float32)
        cs = [torch.view_as_complex(x.reshape(9, 2)) for x in xs]
        t = cs[self.rank].clone()
        dist.all_reduce(t, group=self.group)
        exp, tol = reduce_ref(xs, torch.float32, "SUM", self.world)
        self.expect(case + " all_reduce", torch.view_as_real(t).reshape(-1), exp, tol)
        src = self.root(case)
        b = cs[src].clone() if self.rank == src else torch.full_like(cs[src], float("nan"))
        dist.broadcast(b, src=src, group=self.group)
        self.expect(case + " broadcast", torch.view_as_real(b).reshape(-1), xs[src])
        # reduce and reduce_scatter reach the backend as complex: SUM and AVG run on the pairs
        r = cs[self.rank].clone()
        dist.reduce(r, dst=src, group=self.group)
        if self.rank == src:
            self.expect(case + " reduce", torch.view_as_real(r).reshape(-1), exp, tol)
        w, k = self.world, 3
        ys = self.inputs(case + "/rs", 2 * k * w, torch.float32)
        ins = [torch.view_as_complex(y.reshape(k * w, 2)) for y in ys]
        part = slice(2 * k * self.rank, 2 * k * (self.rank + 1))
        for opname in ("SUM", "AVG"):
            ref, rtol = reduce_ref(ys, torch.float32, opname, w)
            rtol = None if rtol is None else rtol.reshape(-1)[part]
            out = torch.full((k,), complex(float("nan"), float("nan")), dtype=torch.complex64)
            dist.reduce_scatter_tensor(out, ins[self.rank].clone(), op=getattr(dist.ReduceOp, opname),
                                       group=self.group)
            self.expect(f"{case} reduce_scatter_tensor {opname}", torch.view_as_real(out).reshape(-1),
                        ref[part], rtol)
            out = torch.full((k,), complex(float("nan"), float("nan")), dtype=torch.complex64)
            dist.reduce_scatter(out, list(ins[self.rank].clone().chunk(w)), op=getattr(dist.ReduceOp, opname),
                                group=self.group)
            self.expect(f"{case} reduce_scatter {opname}", torch.view_as_real(out).reshape(-1), ref[part], rtol)

    def non_contiguous(self, case, dtype, n):
        """A strided view: must give the right answer and leave the gaps alone, or raise clearly."""
        xs = self.inputs(case, n, dtype)
        exp, tol = reduce_ref(xs, dtype, "MAX", self.world)
        base = make_input(case + "/gap", self.rank, 2 * n, dtype).reshape(n, 2)
        gap = base[:, 1].clone()
        base[:, 0] = xs[self.rank]
        view = base[:, 0]
        try:
            dist.all_reduce(view, op=dist.ReduceOp.MAX, group=self.group)
        except wc.CLEAR_ERRORS as e:
            self.ck.check(case + " [raised clearly]", len(str(e)) >= 8, wc.error_text(e))
            self.ck.info.setdefault("non_contiguous_raised", wc.error_text(e))
            return
        self.expect(case, base[:, 0].clone(), exp, tol)
        self.expect(case + " [gaps untouched]", base[:, 1].clone(), gap)


def run_matrix(m: Matrix, large: bool) -> None:
    ck = m.ck
    w = m.world
    for dtype in wc.ALL_DTYPES:
        dn = wc.dname(dtype)
        for opname in REDOPS:
            if not supported(dtype, opname):
                # Refused locally: every rank raises, nobody hangs, the group stays usable.
                for op in ("all_reduce", "reduce", "reduce_scatter_tensor"):
                    case = f"{op}/{dn}/{opname}/unsupported"
                    ck.expect_error(case, m.unsupported, op, dtype, opname)
                continue
            for n in SIZES:
                for op in ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor"):
                    case = f"{op}/{dn}/{opname}/n={n}"
                    if op == "reduce_scatter_tensor":
                        ck.run(case, m.reduce_scatter, case, dtype, opname, n, flat=True)
                    else:
                        ck.run(case, getattr(m, op), case, dtype, opname, n)
        if dtype.is_floating_point:
            for opname in ("MIN", "MAX"):
                case = f"all_reduce/{dn}/{opname}/nan"
                ck.run(case, m.all_reduce, case, dtype, opname, 2 * w + 3, nan=True)
        for n in SIZES:
            for op in ("broadcast", "all_gather", "all_gather_into_tensor", "gather", "scatter"):
                case = f"{op}/{dn}/n={n}"
                ck.run(case, getattr(m, op), case, dtype, n)
            case = f"all_gather_in_place/{dn}/n={n}"
            ck.run(case, m.all_gather_in_place, case, dtype, n)
            for uneven in (False, True):
                case = f"all_to_all_single/{'uneven' if uneven else 'equal'}/{dn}/n={n}"
                ck.run(case, m.all_to_all_single, case, dtype, n, uneven)
            case = f"all_to_all/{dn}/n={n}"
            ck.run(case, m.all_to_all, case, dtype, n)
        for n in (1, 1025):
            case = f"offset_view/{dn}/n={n}"
            ck.run(case, m.offset_view, case, dtype, n)
            case = f"non_contiguous/{dn}/n={n}"
            ck.run(case, m.non_contiguous, case, dtype, n)
        case = f"shaped/{dn}"
        ck.run(case, m.shaped, case, dtype)

    ck.run("complex64", m.complex_ops, "complex64")
    for i in range(3):
        ck.run(f"barrier/{i}", dist.barrier, group=m.group)

    if not large:
        return
    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    big = [("all_reduce", d, "SUM") for d in wc.ALL_DTYPES] + [
        ("all_reduce", f32, "MAX"), ("all_reduce", torch.int32, "MIN"), ("all_reduce", bf16, "PRODUCT"),
        ("all_reduce", f16, "AVG"), ("all_reduce", torch.int64, "BXOR"), ("all_reduce", f32, "PREMUL_SUM(0.5)"),
        ("reduce", f32, "SUM"), ("reduce", bf16, "SUM"), ("reduce", torch.int64, "SUM"),
    ]
    for op, dtype, opname in big:
        case = f"{op}/{wc.dname(dtype)}/{opname}/n=LARGE"
        ck.run(case, getattr(m, op), case, dtype, opname, LARGE)
    per_rank = LARGE // w | 1
    for dtype in (f32, f16):
        case = f"reduce_scatter_tensor/{wc.dname(dtype)}/SUM/n=LARGE/world"
        ck.run(case, m.reduce_scatter, case, dtype, "SUM", per_rank, flat=True)
    ck.run("reduce_scatter/float32/SUM/n=LARGE/world", m.reduce_scatter,
           "reduce_scatter/float32/SUM/n=LARGE/world", f32, "SUM", per_rank)
    for dtype in (f32, torch.int8, torch.bool):
        case = f"broadcast/{wc.dname(dtype)}/n=LARGE"
        ck.run(case, m.broadcast, case, dtype, LARGE)
    for dtype in (f32, bf16):
        case = f"all_gather_into_tensor/{wc.dname(dtype)}/n=LARGE/world"
        ck.run(case, m.all_gather_into_tensor, case, dtype, per_rank)
    ck.run("all_gather/float64/n=LARGE/world", m.all_gather, "all_gather/float64/n=LARGE/world",
           torch.float64, per_rank)
    # splits are multiples of n in 0..4, so n = LARGE/(2w) keeps totals near LARGE.
    ck.run("all_to_all_single/uneven/float32/n=LARGE", m.all_to_all_single,
           "all_to_all_single/uneven/float32/n=LARGE", f32, LARGE // (2 * w) | 1, True)
    ck.run("all_to_all/int32/n=LARGE", m.all_to_all, "all_to_all/int32/n=LARGE", torch.int32,
           LARGE // (2 * w) | 1)
    ck.run("gather/float32/n=LARGE/world", m.gather, "gather/float32/n=LARGE/world", f32, per_rank)
    ck.run("scatter/float32/n=LARGE/world", m.scatter, "scatter/float32/n=LARGE/world", f32, per_rank)


def gloo_parity(m: Matrix, gloo) -> None:
    """The same calls on a gloo group give the same answer: bitwise where no rounding
    order is involved (<= 2 ranks, MAX, data movement), else within fp32 summation error."""
    w, r = m.world, m.rank
    eps = torch.finfo(torch.float32).eps

    def both(case, fn, summands=None):
        a, b = fn(m.group), fn(gloo)
        tol = None
        if summands is not None and w > 2:
            tol = 2 * w * eps * _fold(torch.add, [x.double().abs() for x in summands])
        m.expect(f"gloo_parity/{case}", a, b, tol)

    for n in (1, 1025, LARGE):
        xs = m.inputs(f"parity/{n}", n, torch.float32)

        def ar(g, op):
            t = xs[r].clone()
            dist.all_reduce(t, op=op, group=g)
            return t

        m.ck.run(f"gloo_parity/all_reduce SUM n={n}", both, f"all_reduce SUM n={n}",
                 lambda g: ar(g, dist.ReduceOp.SUM), xs)
        m.ck.run(f"gloo_parity/all_reduce MAX n={n}", both, f"all_reduce MAX n={n}",
                 lambda g: ar(g, dist.ReduceOp.MAX))

    k = 1025
    fulls = m.inputs("parity/rs", w * k, torch.float32)

    def rs(g):
        out = torch.empty(k)
        dist.reduce_scatter_tensor(out, fulls[r].clone(), group=g)
        return out

    m.ck.run("gloo_parity/reduce_scatter_tensor", both, "reduce_scatter_tensor", rs,
             [f[r * k : (r + 1) * k] for f in fulls])
    s = m.splits("parity/a2a", 7)
    inp = make_input("parity/a2a", r, sum(s[r]), torch.float32)

    def a2a(g):
        out = torch.empty(sum(s[i][r] for i in range(w)))
        dist.all_to_all_single(out, inp.clone(), [s[i][r] for i in range(w)], s[r], group=g)
        return out

    m.ck.run("gloo_parity/all_to_all_single", both, "all_to_all_single", a2a)


def main():
    args = wc.setup(lambda p: p.add_argument("--no-large", action="store_true"))
    rank, world = wc.init(args.backend, args.timeout)
    ck = wc.Checker(rank)
    m = Matrix(rank, world, ck)
    t0 = time.monotonic()
    run_matrix(m, large=not args.no_large)
    ck.info["matrix_s"] = round(time.monotonic() - t0, 2)
    if args.backend != "gloo":
        gloo = dist.new_group(backend="gloo")
        gloo_parity(m, gloo)
    wc.print_summary(ck, "collectives")
    wc.write_result(ck.result(digests=m.digests))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
