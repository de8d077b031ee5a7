"""torch dtypes and ReduceOps -> gosym's ABI codes."""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import _lib

# dtype -> GOSYM_DTYPE_*; the engine reduces exactly these.
DTYPES = {
    torch.float32: _lib.DTYPE_FLOAT32,
    torch.float64: _lib.DTYPE_FLOAT64,
    torch.float16: _lib.DTYPE_FLOAT16,
    torch.bfloat16: _lib.DTYPE_BFLOAT16,
    torch.int8: _lib.DTYPE_INT8,
    torch.uint8: _lib.DTYPE_UINT8,
    torch.int16: _lib.DTYPE_INT16,
    torch.int32: _lib.DTYPE_INT32,
    torch.int64: _lib.DTYPE_INT64,
    torch.bool: _lib.DTYPE_BOOL,
    # NCCL 2.28 reduces fp8 (float accumulation); so does gosym on CUDA tensors. On CPU
    # tensors the engine refuses fp8 reductions, as Gloo does, and moves them as bytes.
    torch.float8_e4m3fn: _lib.DTYPE_FLOAT8_E4M3FN,
    torch.float8_e5m2: _lib.DTYPE_FLOAT8_E5M2,
}


def reduce_dtype(t: torch.Tensor) -> int:
    """The GOSYM_DTYPE_* a reduction over t uses; TypeError for others (complex, float8_e4m3fnuz, ...)."""
    code = DTYPES.get(t.dtype)
    if code is None:
        raise TypeError(f"gosym: reductions do not support dtype {t.dtype}; supported: "
                        + ", ".join(str(d).removeprefix("torch.") for d in DTYPES))
    return code


# complex dtype -> its parts' dtype: SUM, AVG and PREMUL_SUM (a real factor) reduce the
# real and imaginary parts apart, so such a reduction runs on the (real, imag) pairs.
_COMPLEX_PARTS = {torch.complex32: torch.float16, torch.complex64: torch.float32,
                  torch.complex128: torch.float64}


def reduce_types(t: torch.Tensor, red: int) -> tuple[int, int]:
    """(GOSYM_DTYPE_*, elements per torch element) of a reduction red (GOSYM_RED_*) over
    t: complex tensors reduce as (real, imag) pairs where red allows it, as torch's own
    all_reduce hands them over; TypeError for other dtypes and ops."""
    code = DTYPES.get(t.dtype)
    if code is not None:
        return code, 1
    parts = _COMPLEX_PARTS.get(t.dtype)
    if parts is None:
        return reduce_dtype(t), 1  # raises
    if red not in _ELEMENTWISE:
        raise TypeError(f"gosym: {_RED_NAMES[red]} is not defined on complex tensors ({t.dtype}); "
                        "SUM, AVG and PREMUL_SUM are")
    return DTYPES[parts], 2


def move_dtype(t: torch.Tensor) -> tuple[int, int]:
    """(GOSYM_DTYPE_*, elements per torch element) for an op that only moves data.

    Types the engine does not know (complex, float8_e8m0fnu, uint16, ...) travel as bytes:
    the count is multiplied by the element size and the type becomes UINT8.
    """
    code = DTYPES.get(t.dtype)
    if code is not None:
        return code, 1
    if t.is_quantized:
        raise TypeError(f"gosym: quantized tensors ({t.dtype}) are not supported")
    return _lib.DTYPE_UINT8, t.element_size()


# int(RedOpType) -> GOSYM_RED_*, built from the names so torch's numbering does not matter.
_REDS = {int(v): _lib.RED[name] for name, v in dist.ReduceOp.RedOpType.__members__.items()
         if name in _lib.RED}
_PREMUL = _lib.RED["PREMUL_SUM"]
_ELEMENTWISE = {_lib.RED["SUM"], _lib.RED["AVG"], _PREMUL}
_RED_NAMES = {code: name for name, code in _lib.RED.items()}


def _hash_is_op() -> bool:
    """torch 2.11 hashes a ReduceOp as its RedOpType value: hash(op) costs a quarter of
    int(op.op) (pybind enums convert slowly). Checked here, so a torch that hashes
    differently falls back to the slow path instead of mapping ops wrongly."""
    try:
        ops = [dist.ReduceOp(v) for n, v in dist.ReduceOp.RedOpType.__members__.items()
               if n in _lib.RED and n != "PREMUL_SUM"]
        ops.append(dist._make_nccl_premul_sum(2.0))
        return all(hash(o) == int(o.op) for o in ops)
    except Exception:  # noqa: BLE001
        return False


_op_key = hash if _hash_is_op() else (lambda op: int(op.op))


# The answers for the ops without a factor, ready made: reduce_op is on every reduction's path.
_PLAIN = {key: (code, 1.0) for key, code in _REDS.items() if code != _PREMUL}


def reduce_op(op) -> tuple[int, float]:
    """(GOSYM_RED_*, scale) for opts.reduceOp; scale is PREMUL_SUM's factor, else 1.0."""
    key = _op_key(op)
    plain = _PLAIN.get(key)
    if plain is not None:
        return plain
    code = _REDS.get(key)
    if code is None:
        raise NotImplementedError(f"gosym: reduce op {op.op} is not supported")
    if code != _PREMUL:
        return code, 1.0
    # ReduceOp pickles PREMUL_SUM as (RedOpType, factor); the factor is a float or a
    # one-element tensor (dist._make_nccl_premul_sum). It is not exposed otherwise.
    factor = op.__getstate__()[1]
    if isinstance(factor, torch.Tensor):
        if factor.numel() != 1:
            raise ValueError(f"gosym: PREMUL_SUM factor must have one element, got shape "
                             f"{tuple(factor.shape)}")
        factor = factor.item()
    return code, float(factor)
