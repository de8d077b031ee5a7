"""recv from any source (dist.recv(t) with src None, pg.recv_anysource), as gloo: the engine
takes the first message with the tag from any rank that no receive naming that rank wants,
and stores the sender's rank in a small buffer the Work reads (Work._source_rank()).

Host memory only. A CUDA receive from any source is refused, as NCCL refuses it: gosym's CUDA
messages travel over a channel per pair, posted by both sides, so the receiver would have to
learn the sender before the data moves, which needs every CUDA send to announce itself on the
host mailbox (a host message per send that nobody reads unless a receive from any source is
waiting).
"""

from __future__ import annotations

from array import array

import torch

from . import _lib, descriptors
from ._dtypes import move_dtype
from ._tensors import _dst, _one
from .work import Work, _Op


class AnySourceWork(Work):
    """The Work of a receive from any source: _source_rank() is the sender, once done."""

    __slots__ = ("_src",)

    def _source_rank(self):
        self.wait()
        return self._src[0]


def host_tensor(tensors):
    """The one tensor of a receive from any source; NotImplementedError for a CUDA one."""
    t = _one(tensors, "recv")
    if isinstance(t, torch.Tensor) and t.is_cuda:
        raise NotImplementedError("gosym: recv from any source into a CUDA tensor is not "
                                  "supported (as with NCCL); pass src, or receive into a CPU "
                                  "tensor")
    return t


def recv_anysource(pg, tensors, tag):
    """pg.recv_anysource (see the module's doc)."""
    t = host_tensor(tensors)
    cb = []
    dst = _dst(t, cb, False)
    code, mult = move_dtype(dst)
    src = array("i", [-1])
    desc = descriptors.recv_anysource(dtype=code, tag=tag, count=dst.numel() * mult,
                                      dst=dst.data_ptr(), sender_at=src.buffer_info()[0])
    handle = _lib.post(pg._endpoint(), desc)
    w = AnySourceWork()
    w._op = _Op((handle,), tensors, (dst, src), cb or None, pg._completer)
    w._src = src
    return w
