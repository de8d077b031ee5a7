"""The byte and real views a group across hosts moves tensors as (gosym.hier.tensors: _bytes,
_flat_bytes, _red_wire) take every contiguous tensor, those torch calls contiguous with odd
strides on dims of size 1 included (a one-element slice of a strided view: the CPU fuzzer
across hosts 4+1 broadcast such an int16 tensor, and the view to bytes raised), and alias its
elements."""

from __future__ import annotations

import pytest
import torch

from gosym.hier.tensors import _bytes, _flat_bytes, _red_wire

DTYPES = [torch.int16, torch.bfloat16, torch.bool, torch.uint8, torch.float64, torch.complex64]
# (shape, strides) that torch calls contiguous: a dim of size 1 may have any stride
ODD = [((1,), (2,)), ((1, 1), (5, 3)), ((3, 1), (1, 7)), ((1, 3), (9, 1)), ((2, 1, 3), (3, 11, 1))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,strides", ODD)
def test_views_take_contiguous_tensors_with_odd_strides(dtype, shape, strides):
    t = torch.zeros(64, dtype=dtype)[1:].as_strided(shape, strides)
    assert t.is_contiguous()
    want = torch.arange(1, t.numel() + 1).to(dtype).view(shape)
    for view in (_bytes, _flat_bytes):
        t.zero_()
        b = view(t)
        assert b.data_ptr() == t.data_ptr()  # the same elements, no copy
        assert b.numel() * b.element_size() == t.numel() * t.element_size()
        b.view(-1).copy_(view(want.clone()).reshape(-1))
        assert torch.equal(t, want), view.__name__
    if dtype.is_complex:
        w, back = _red_wire(t)
        assert not back and w.data_ptr() == t.data_ptr() and w.shape == (*shape, 2)
