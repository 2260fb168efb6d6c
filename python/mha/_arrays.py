"""_arrays.py - how mha sees the caller's arrays: NumPy arrays as they are,
CPU torch tensors through their zero-copy ``.numpy()`` view, and the one
counter of the copies this package makes (``mha.copies()``).

mha computes in float32 and reads any non-negative strides, so a float32
array of any layout NumPy or torch produces is passed without a copy.  The
only copies: an input with a negative stride (NumPy's ``a[::-1]``), which
mha's views cannot express (mha refuses it, call() copies and retries), and the layers' inputs when they are not
row-major (mha's Transformer layers read contiguous rows).  Each one adds
1 to ``copies()``.  Other dtypes (float64, float16, bfloat16, ints where a
float is wanted) are refused with ValueError: convert them yourself, e.g.
``x.float()`` or ``x.astype(np.float32)``.
"""
import random
import sys

import numpy as np

from . import _mha

_copies = [0]

KERNELS = {"auto": 0, "ref": 1, "scalar": 2, "avx2": 3}
MASKED_ROWS = {"zero": 0, "nan": 1}
_MASK_DTYPES = (np.dtype(np.bool_), np.dtype(np.float32), np.dtype(np.uint8))
_F32 = np.dtype(np.float32)


def copies():
    """Number of array copies this package made so far (process-wide)."""
    return _copies[0]


def count_copy():
    _copies[0] += 1


def _torch():
    return sys.modules.get("torch")


def is_torch(x):
    """True when x is a torch.Tensor (torch is never imported for this)."""
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


_torch_dtypes = {}


def _from_torch(x, name, allowed):
    if not x.is_cpu:
        raise ValueError("%s: a %s tensor; mha runs on the CPU (use .cpu())" % (name, x.device))
    if not _torch_dtypes:
        t = _torch()
        _torch_dtypes.update({t.float32: np.dtype(np.float32), t.bool: np.dtype(np.bool_),
                              t.uint8: np.dtype(np.uint8), t.int64: np.dtype(np.int64)})
    dt = _torch_dtypes.get(x.dtype)
    if dt is None or dt not in allowed:
        raise ValueError("%s: dtype %s is not supported (mha computes in float32; convert with "
                         ".float())" % (name, x.dtype))
    return (x.detach() if x.requires_grad else x).numpy()


def call(fn, *args):
    """fn(*args) (an mha._mha function); when mha refuses a negative stride
    (LayoutError), the inputs with one are copied (counted) and fn called
    again.  An output with one is a ValueError from the extension instead."""
    try:
        return fn(*args)
    except _mha.LayoutError:
        return fn(*(_positive_strides(a) for a in args))


def _positive_strides(a):
    if type(a) is np.ndarray and min(a.strides, default=0) < 0:
        count_copy()
        return np.ascontiguousarray(a)
    return a


def _array(x, name, allowed):
    if type(x) is not np.ndarray:
        if is_torch(x):
            x = _from_torch(x, name, allowed)
        elif isinstance(x, np.ndarray):
            x = np.asarray(x)
        else:
            raise TypeError("%s: %s is not a NumPy array or a torch tensor"
                            % (name, type(x).__name__))
    if x.dtype not in allowed:
        raise ValueError("%s: dtype %s is not supported (mha computes in float32; convert with "
                         ".astype(np.float32))" % (name, x.dtype))
    return x


def f32(x, name):
    """The float32 NumPy view of x (zero-copy; see the module comment)."""
    if type(x) is np.ndarray and x.dtype == _F32:
        return x
    return _array(x, name, (_F32,))


def mask(x, name, extra=()):
    """A mask as mha reads it: bool (uint8 counts as bool) or float32 (added);
    None stays None."""
    if x is None:
        return None
    return _array(x, name, _MASK_DTYPES + tuple(np.dtype(e) for e in extra))


def i64(x, name):
    if x is None:
        return None
    return _array(x, name, (np.dtype(np.int64),))


def out_buffer(out, shape, name="out"):
    """The caller's out= array, checked to have `shape` (the extension
    checks that it is writable float32 with non-negative strides)."""
    o = out if type(out) is np.ndarray else f32(out, name)
    if o.shape != tuple(shape):
        raise ValueError("%s: shape %s, want %s" % (name, o.shape, tuple(shape)))
    return o


def rows(x, name):
    """x with contiguous rows, as mha's layers read them (a counted copy when not)."""
    if x.flags.c_contiguous:
        return x
    count_copy()
    return np.ascontiguousarray(x)


def wrap(result, like_torch):
    """result as a torch tensor (sharing memory) when the inputs were torch."""
    if like_torch and result is not None:
        return _torch().from_numpy(result)
    return result


def seed_or_random(seed):
    return random.getrandbits(64) if seed is None else int(seed) & (2**64 - 1)


def kernel_id(kernel):
    try:
        return KERNELS[kernel]
    except KeyError:
        raise ValueError("kernel: %r, want one of %s" % (kernel, sorted(KERNELS))) from None


def masked_rows_id(masked_rows):
    try:
        return MASKED_ROWS[masked_rows]
    except KeyError:
        raise ValueError("masked_rows: %r, want 'zero' or 'nan'" % (masked_rows,)) from None


def weights(state_dict):
    """A state_dict (torch tensors or arrays, any float dtype) as a dict of
    float32 row-major NumPy arrays, converted once: float32 contiguous CPU
    tensors are shared (zero-copy), anything else converted."""
    out = {}
    for name, value in state_dict.items():
        if is_torch(value):
            value = value.detach()
            if value.dtype != _torch().float32:
                value = value.float()
            value = value.cpu().numpy()
        out[name] = np.ascontiguousarray(value, dtype=np.float32)
    return out
