"""A builder per op of the gosym_op_desc it posts, with named arguments.

Each returns the bytes _lib.pack_desc packs for the same fields (tests/unit/test_descriptors.py
checks it), the fields the op does not read zero. Counts are in elements of dtype; pieces are
the address of an array of (addr, count) uint64 pairs. A CUDA op names its CUstream and device
ordinal; device -1, the default, is host memory. Each builder is one struct call, with no frame
through pack_desc: they are on the path of every op.
"""

from __future__ import annotations

from ._lib import (ANY_SOURCE, DESC, DESC_SIZE, OP_ALLGATHER, OP_ALLREDUCE, OP_ALLTOALL,
                   OP_BARRIER, OP_BROADCAST, OP_GATHER, OP_RECV, OP_REDUCE, OP_REDUCE_SCATTER,
                   OP_SCATTER, OP_SEND)

_pack = DESC.pack  # gosym_op_desc's fields in order, then flags (always 0 here)


def _in_place(op, name):
    # Not keyword-only: the in-place CUDA short path passes its arguments in order, where
    # eight keywords would cost several times the builder's own frame.
    def build(dtype, count, addr, red_op=0, scale=1.0, root=0, stream=0, device=-1):
        return _pack(DESC_SIZE, op, dtype, red_op, scale, root, 0, 0, count, addr, addr,
                     0, 0, 0, 0, stream, device, 0)

    build.__name__ = build.__qualname__ = name
    build.__doc__ = (f"{name} of the count elements at addr, in place. The three in-place ops "
                     f"take the same arguments, so one caller serves them all: root matters "
                     f"to reduce and broadcast, red_op and scale (GOSYM_RED_*, PREMUL_SUM's "
                     f"factor) to the reductions.")
    return build


all_reduce = _in_place(OP_ALLREDUCE, "all_reduce")
reduce = _in_place(OP_REDUCE, "reduce")
broadcast = _in_place(OP_BROADCAST, "broadcast")


def all_gather(*, dtype, count, src, dst=0, out_pieces=0, n_out=0, stream=0, device=-1):
    """count elements at src from every rank: rank r's at dst + r * count, or, with dst 0,
    into piece r of the n_out pieces at out_pieces."""
    return _pack(DESC_SIZE, OP_ALLGATHER, dtype, 0, 1.0, 0, 0, 0, count, src, dst,
                 0, out_pieces, 0, n_out, stream, device, 0)


def reduce_scatter(*, dtype, red_op, scale, count, dst, src=0, in_pieces=0, n_in=0,
                   stream=0, device=-1):
    """count elements into dst, reduced over the ranks' parts for this rank: the one at
    src + rank * count, or, with src 0, piece rank of the n_in pieces at in_pieces."""
    return _pack(DESC_SIZE, OP_REDUCE_SCATTER, dtype, red_op, scale, 0, 0, 0, count, src, dst,
                 in_pieces, 0, n_in, 0, stream, device, 0)


def all_gather_on(dtype, count, src, dst, stream, device):
    """all_gather into dst as the CUDA short path calls it: in order, no keywords (on the
    path of every small eager op, where keywords cost several times the struct call)."""
    return _pack(DESC_SIZE, OP_ALLGATHER, dtype, 0, 1.0, 0, 0, 0, count, src, dst,
                 0, 0, 0, 0, stream, device, 0)


def reduce_scatter_on(dtype, red_op, scale, count, src, dst, stream, device):
    """reduce_scatter from src as the CUDA short path calls it (see all_gather_on)."""
    return _pack(DESC_SIZE, OP_REDUCE_SCATTER, dtype, red_op, scale, 0, 0, 0, count, src, dst,
                 0, 0, 0, 0, stream, device, 0)


def all_to_all_on(dtype, count, src, dst, stream, device):
    """all_to_all of equal splits as the CUDA short path calls it (see all_gather_on)."""
    return _pack(DESC_SIZE, OP_ALLTOALL, dtype, 0, 1.0, 0, 0, 0, count, src, dst,
                 0, 0, 0, 0, stream, device, 0)


def all_to_all(*, dtype, count, src, dst, stream=0, device=-1):
    """Equal splits: count elements at src + r * count go to rank r, count from rank r
    arrive at dst + r * count."""
    return _pack(DESC_SIZE, OP_ALLTOALL, dtype, 0, 1.0, 0, 0, 0, count, src, dst,
                 0, 0, 0, 0, stream, device, 0)


def all_to_all_v(*, dtype, in_pieces, out_pieces, world, stream=0, device=-1):
    """Any splits: piece r of in_pieces goes to rank r, piece r of out_pieces receives rank
    r's (world pieces each)."""
    return all_to_all_v_on(dtype, in_pieces, out_pieces, world, stream, device)


def all_to_all_v_on(dtype, in_pieces, out_pieces, world, stream, device):
    """all_to_all of any splits as the CUDA short path calls it (see all_gather_on)."""
    return _pack(DESC_SIZE, OP_ALLTOALL, dtype, 0, 1.0, 0, 0, 0, 0, 0, 0,
                 in_pieces, out_pieces, world, world, stream, device, 0)


def gather(*, dtype, root, count, src, out_pieces=0, n_out=0, stream=0, device=-1):
    """count elements at src to root, into piece r of its n_out pieces (none elsewhere)."""
    return _pack(DESC_SIZE, OP_GATHER, dtype, 0, 1.0, root, 0, 0, count, src, 0,
                 0, out_pieces, 0, n_out, stream, device, 0)


def scatter(*, dtype, root, count, dst, in_pieces=0, n_in=0, stream=0, device=-1):
    """count elements into dst from piece rank of root's n_in pieces (none elsewhere)."""
    return _pack(DESC_SIZE, OP_SCATTER, dtype, 0, 1.0, root, 0, 0, count, 0, dst,
                 in_pieces, 0, n_in, 0, stream, device, 0)


def send(*, dtype, peer, tag, count, src, stream=0, device=-1):
    return _pack(DESC_SIZE, OP_SEND, dtype, 0, 1.0, 0, peer, tag, count, src, 0,
                 0, 0, 0, 0, stream, device, 0)


def recv(*, dtype, peer, tag, count, dst, stream=0, device=-1):
    return _pack(DESC_SIZE, OP_RECV, dtype, 0, 1.0, 0, peer, tag, count, 0, dst,
                 0, 0, 0, 0, stream, device, 0)


def recv_anysource(*, dtype, tag, count, dst, sender_at):
    """A host receive from any rank; the engine stores the sender's rank as an int32 at
    sender_at."""
    return _pack(DESC_SIZE, OP_RECV, dtype, 0, 1.0, 0, ANY_SOURCE, tag, count, sender_at, dst,
                 0, 0, 0, 0, 0, -1, 0)


def barrier(*, stream=0, device=-1):
    return _pack(DESC_SIZE, OP_BARRIER, 0, 0, 1.0, 0, 0, 0, 0, 0, 0,
                 0, 0, 0, 0, stream, device, 0)
