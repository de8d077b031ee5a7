"""gosym.descriptors' builders pack the bytes of the positional _lib.pack_desc calls that
backend.py and anysource.py made before the builders existed, on the host and on a stream."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from gosym import _lib
from gosym import descriptors as D
from gosym._lib import (ANY_SOURCE, OP_ALLGATHER, OP_ALLREDUCE, OP_ALLTOALL, OP_BARRIER,
                        OP_BROADCAST, OP_GATHER, OP_RECV, OP_REDUCE, OP_REDUCE_SCATTER, OP_SCATTER,
                        OP_SEND)

# Argument sets: addresses high and low, counts past 32 bits, several reduce operators, a
# PREMUL_SUM factor, roots, peers and tags off zero.
VALUES = [
    NS(dtype=_lib.DTYPE_FLOAT32, red=_lib.RED["SUM"], scale=1.0, root=0, peer=1, tag=0, count=1,
       a=0x7F00_0000_1000, b=0x7F00_0000_9000, p=0x55AA_0000_0040, q=0x55AA_0000_0140, world=2),
    NS(dtype=_lib.DTYPE_BFLOAT16, red=_lib.RED["PREMUL_SUM"], scale=0.25, root=3, peer=2, tag=7,
       count=4096, a=0x7FFF_FFFF_F000, b=0x1000, p=0x7F12_3456_7890, q=0x7F12_3456_8890, world=4),
    NS(dtype=_lib.DTYPE_UINT8, red=_lib.RED["BXOR"], scale=1.0, root=7, peer=0, tag=1 << 40,
       count=(1 << 33) + 5, a=0x2000, b=0x7E00_0000_0000, p=0x3000, q=0x4000, world=8),
]
STREAMS = [(0x5555_0000_1234, 0), (0x7F00_DEAD_BEEF, 7)]


def pairs(v, on=()):
    """(name, new desc, the old call's positional arguments) for each builder and use; on:
    (stream, device) to pass to the builders that take them."""
    s = dict(zip(("stream", "device"), on))
    red = {"red_op": v.red, "scale": v.scale}
    out = []
    for name, op in (("all_reduce", OP_ALLREDUCE), ("reduce", OP_REDUCE),
                     ("broadcast", OP_BROADCAST)):
        r = {"red_op": 0, "scale": 1.0} if name == "broadcast" else red
        old = (op, v.dtype, r["red_op"], r["scale"], v.root, 0, 0, v.count, v.a, v.a, 0, 0, 0, 0)
        build = getattr(D, name)
        out.append((name, build(dtype=v.dtype, count=v.count, addr=v.a, root=v.root, **r, **s),
                    old))
        # as the in-place CUDA short path calls it
        out.append((name, build(v.dtype, v.count, v.a, r["red_op"], r["scale"], v.root, *on),
                    old))
    out += [
        ("all_gather", D.all_gather(dtype=v.dtype, count=v.count, src=v.a, out_pieces=v.p,
                                    n_out=v.world, **s),
         (OP_ALLGATHER, v.dtype, 0, 1.0, 0, 0, 0, v.count, v.a, 0, 0, v.p, 0, v.world)),
        ("all_gather", D.all_gather(dtype=v.dtype, count=v.count, src=v.a, dst=v.b, **s),
         (OP_ALLGATHER, v.dtype, 0, 1.0, 0, 0, 0, v.count, v.a, v.b, 0, 0, 0, 0)),
        ("reduce_scatter", D.reduce_scatter(dtype=v.dtype, count=v.count, dst=v.b, in_pieces=v.p,
                                            n_in=v.world, **red, **s),
         (OP_REDUCE_SCATTER, v.dtype, v.red, v.scale, 0, 0, 0, v.count, 0, v.b, v.p, 0,
          v.world, 0)),
        ("reduce_scatter", D.reduce_scatter(dtype=v.dtype, count=v.count, src=v.a, dst=v.b,
                                            **red, **s),
         (OP_REDUCE_SCATTER, v.dtype, v.red, v.scale, 0, 0, 0, v.count, v.a, v.b, 0, 0, 0, 0)),
        ("all_to_all", D.all_to_all(dtype=v.dtype, count=v.count, src=v.a, dst=v.b, **s),
         (OP_ALLTOALL, v.dtype, 0, 1.0, 0, 0, 0, v.count, v.a, v.b, 0, 0, 0, 0)),
        ("all_to_all_v", D.all_to_all_v(dtype=v.dtype, in_pieces=v.p, out_pieces=v.q,
                                        world=v.world, **s),
         (OP_ALLTOALL, v.dtype, 0, 1.0, 0, 0, 0, 0, 0, 0, v.p, v.q, v.world, v.world)),
        # gather and scatter: at the root, and elsewhere (no pieces)
        ("gather", D.gather(dtype=v.dtype, root=v.root, count=v.count, src=v.a, out_pieces=v.p,
                            n_out=v.world, **s),
         (OP_GATHER, v.dtype, 0, 1.0, v.root, 0, 0, v.count, v.a, 0, 0, v.p, 0, v.world)),
        ("gather", D.gather(dtype=v.dtype, root=v.root, count=v.count, src=v.a, **s),
         (OP_GATHER, v.dtype, 0, 1.0, v.root, 0, 0, v.count, v.a, 0, 0, 0, 0, 0)),
        ("scatter", D.scatter(dtype=v.dtype, root=v.root, count=v.count, dst=v.b, in_pieces=v.p,
                              n_in=v.world, **s),
         (OP_SCATTER, v.dtype, 0, 1.0, v.root, 0, 0, v.count, 0, v.b, v.p, 0, v.world, 0)),
        ("scatter", D.scatter(dtype=v.dtype, root=v.root, count=v.count, dst=v.b, **s),
         (OP_SCATTER, v.dtype, 0, 1.0, v.root, 0, 0, v.count, 0, v.b, 0, 0, 0, 0)),
        ("send", D.send(dtype=v.dtype, peer=v.peer, tag=v.tag, count=v.count, src=v.a, **s),
         (OP_SEND, v.dtype, 0, 1.0, 0, v.peer, v.tag, v.count, v.a, 0, 0, 0, 0, 0)),
        ("recv", D.recv(dtype=v.dtype, peer=v.peer, tag=v.tag, count=v.count, dst=v.b, **s),
         (OP_RECV, v.dtype, 0, 1.0, 0, v.peer, v.tag, v.count, 0, v.b, 0, 0, 0, 0)),
        ("barrier", D.barrier(**s), (OP_BARRIER, 0, 0, 1.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)),
    ]
    if on:  # the two-buffer CUDA short path's positional builders
        out += [
            ("all_gather_on", D.all_gather_on(v.dtype, v.count, v.a, v.b, *on),
             (OP_ALLGATHER, v.dtype, 0, 1.0, 0, 0, 0, v.count, v.a, v.b, 0, 0, 0, 0)),
            ("all_to_all_on", D.all_to_all_on(v.dtype, v.count, v.a, v.b, *on),
             (OP_ALLTOALL, v.dtype, 0, 1.0, 0, 0, 0, v.count, v.a, v.b, 0, 0, 0, 0)),
            ("all_to_all_v_on", D.all_to_all_v_on(v.dtype, v.p, v.q, v.world, *on),
             (OP_ALLTOALL, v.dtype, 0, 1.0, 0, 0, 0, 0, 0, 0, v.p, v.q, v.world, v.world)),
            ("reduce_scatter_on",
             D.reduce_scatter_on(v.dtype, v.red, v.scale, v.count, v.a, v.b, *on),
             (OP_REDUCE_SCATTER, v.dtype, v.red, v.scale, 0, 0, 0, v.count, v.a, v.b, 0, 0, 0, 0)),
        ]
    if not on:  # host memory only
        out.append(("recv_anysource", D.recv_anysource(dtype=v.dtype, tag=v.tag, count=v.count,
                                                       dst=v.b, sender_at=v.p),
                    (OP_RECV, v.dtype, 0, 1.0, 0, ANY_SOURCE, v.tag, v.count, v.p, v.b,
                     0, 0, 0, 0)))
    return out


@pytest.mark.parametrize("on", [(), *STREAMS], ids=["host", "stream", "stream7"])
@pytest.mark.parametrize("v", VALUES, ids=range(len(VALUES)))
def test_builders_pack_the_old_bytes(v, on):
    for name, new, old in pairs(v, on):
        assert new == _lib.pack_desc(*old, *on), (name, old)


@pytest.mark.parametrize("v", VALUES, ids=range(len(VALUES)))
def test_host_desc_moved_onto_a_stream(v):
    """What CudaStreams.op does to every CUDA op but the in-place short path and the barrier;
    before the builders, those ops packed pack_desc(..., stream, device)."""
    for on in STREAMS:
        for name, new, old in pairs(v):
            assert _lib.on_stream(new, *on) == _lib.pack_desc(*old, *on), (name, old)


def test_every_builder_is_checked():
    public = {n for n, f in vars(D).items() if callable(f) and not n.startswith("_")
              and getattr(f, "__module__", None) == D.__name__}
    assert public == {name for on in ((), STREAMS[0]) for name, _, _ in pairs(VALUES[0], on)}
