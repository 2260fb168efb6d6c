"""_arrays.py - how mha sees the caller's arrays: NumPy arrays as they are,
CPU torch tensors through their zero-copy ``.numpy()`` view, and the one
counter of the copies this package makes (``mha.copies()``).

mha reads any non-negative strides, so an array of any layout NumPy or
torch produces is passed without a copy.  Dtypes: float32 everywhere;
scaled_dot_product_attention (and mha.torch's) also takes float16 (NumPy or
torch) and torch.bfloat16 for query, key, value and out, all three of one
dtype as torch requires, computed by mha's half path.  bfloat16 has no
NumPy dtype: its tensor travels as the int16 view ``x.view(torch.int16)
.numpy()`` of the same memory inside ``_mha.bf16(...)``, the explicit
marking the extension reads as bfloat16 (a bare int16/uint16 array is never
taken as bf16).  The only copies: an input with a negative stride (NumPy's
``a[::-1]``), which mha's views cannot express (mha refuses it, call()
copies and retries), the layers' inputs when they are not row-major (mha's
Transformer layers read contiguous rows), and a half-precision float mask
given with half inputs (widened to the float32 mask mha reads).  Each one
adds 1 to ``copies()``.  Other dtypes (float64, ints where a float is
wanted, half where a function takes float32) are refused with ValueError:
convert them yourself, e.g. ``x.float()`` or ``x.astype(np.float32)``.
"""
import random
import sys

import numpy as np

from . import _mha

_copies = [0]

KERNELS = {"auto": 0, "ref": 1, "scalar": 2, "avx2": 3, "avx512": 4}
MASKED_ROWS = {"zero": 0, "nan": 1}
_MASK_DTYPES = (np.dtype(np.bool_), np.dtype(np.float32), np.dtype(np.uint8))
_F32 = np.dtype(np.float32)
_F16 = np.dtype(np.float16)
_NUMPY_ATTENTION_DTYPES = {_F32: "float32", _F16: "float16"}


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


def _torch_dtype(x):
    """The NumPy dtype of a torch tensor's .numpy() view (None: none, or bfloat16)."""
    if not _torch_dtypes:
        t = _torch()
        _torch_dtypes.update({t.float32: _F32, t.float16: _F16, t.bool: np.dtype(np.bool_),
                              t.uint8: np.dtype(np.uint8), t.int64: np.dtype(np.int64)})
    return _torch_dtypes.get(x.dtype)


def _cpu(x, name):
    if not x.is_cpu:
        raise ValueError("%s: a %s tensor; mha runs on the CPU (use .cpu())" % (name, x.device))
    return x.detach() if x.requires_grad else x


def _from_torch(x, name, allowed):
    x = _cpu(x, name)
    dt = _torch_dtype(x)
    if dt is None or dt not in allowed:
        raise ValueError("%s: dtype %s is not supported (mha computes in float32 here; "
                         "convert with .float())" % (name, x.dtype))
    return x.numpy()


def call(fn, *args):
    """fn(*args) (an mha._mha function); when mha refuses a negative stride
    (LayoutError), the inputs with one are copied (counted) and fn called
    again.  An output with one is a ValueError from the extension instead."""
    try:
        return fn(*args)
    except _mha.LayoutError:
        return fn(*(_positive_strides(a) for a in args))


def _positive_strides(a):
    if type(a) is _mha.bf16:
        return _mha.bf16(_positive_strides(a.array))
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
    """The caller's out= array, checked to be float32 of `shape` (the
    extension checks that it is writable with non-negative strides)."""
    o = out if type(out) is np.ndarray and out.dtype == _F32 else f32(out, name)
    if o.shape != tuple(shape):
        raise ValueError("%s: shape %s, want %s" % (name, o.shape, tuple(shape)))
    return o


# ---- half precision: scaled_dot_product_attention's query, key, value, out

def attention_array(x, name):
    """(the NumPy view of x mha reads, its dtype name "float32" | "float16" |
    "bfloat16"), zero-copy; a bfloat16 tensor gives its int16 view (pass it
    through marked())."""
    if is_torch(x):
        x = _cpu(x, name)
        if x.dtype is _torch().bfloat16:
            return x.view(_torch().int16).numpy(), "bfloat16"
        dt = _torch_dtype(x)
        if dt in _NUMPY_ATTENTION_DTYPES:
            return x.numpy(), _NUMPY_ATTENTION_DTYPES[dt]
        got = x.dtype
    elif isinstance(x, np.ndarray):
        dt = _NUMPY_ATTENTION_DTYPES.get(x.dtype)
        if dt is not None:
            return np.asarray(x), dt
        got = x.dtype
    else:
        raise TypeError("%s: %s is not a NumPy array or a torch tensor" % (name, type(x).__name__))
    raise ValueError("%s: dtype %s is not supported (float32, float16 or torch.bfloat16; "
                     "convert with .float() or .astype(np.float32))" % (name, got))


def attention_inputs(query, key, value):
    """The views of SDPA's query, key and value (attention_array) and their
    one dtype name; ValueError when the dtypes differ (torch's rule)."""
    (q, dq), (k, dk), (v, dv) = (attention_array(x, n) for x, n in
                                 ((query, "query"), (key, "key"), (value, "value")))
    if not dq == dk == dv:
        raise ValueError("query, key, value: dtypes %s, %s, %s; they must share one dtype "
                         "(torch: \"Expected query, key, and value to have the same dtype\")"
                         % (dq, dk, dv))
    return q, k, v, dq


def attention_mask(x, name, dtype):
    """An SDPA mask for inputs of dtype (a name): bool or float32 as mask()
    takes them, or, for half inputs, a float mask of that same dtype (torch
    allows it), widened to float32 (a counted copy)."""
    if x is None or dtype == "float32":
        return mask(x, name)
    if is_torch(x) and x.dtype is getattr(_torch(), dtype):
        count_copy()
        return _cpu(x, name).float().numpy()
    if isinstance(x, np.ndarray) and x.dtype == _F16 and dtype == "float16":
        count_copy()
        return x.astype(np.float32)
    if not (is_torch(x) or isinstance(x, np.ndarray)) or (
            (_torch_dtype(x) if is_torch(x) else x.dtype) in _MASK_DTYPES):
        return mask(x, name)
    raise ValueError("%s: dtype %s; want bool, float32 or the query's dtype (%s)"
                     % (name, x.dtype, dtype))


def attention_output(shape, dtype, like_torch, out=None):
    """(the result to return, the NumPy view mha writes): out when given,
    checked to have `shape` and dtype; else a new array (a torch tensor when
    like_torch; bfloat16 is always one)."""
    if out is not None:
        a, got = attention_array(out, "out")
        if got != dtype:
            raise ValueError("out: dtype %s, want %s (the inputs' dtype)" % (got, dtype))
        if a.shape != tuple(shape):
            raise ValueError("out: shape %s, want %s" % (a.shape, tuple(shape)))
        return out, a
    if dtype == "bfloat16":
        t = _torch().empty(shape, dtype=_torch().bfloat16)
        return t, t.view(_torch().int16).numpy()
    a = np.empty(shape, _F32 if dtype == "float32" else _F16)
    return wrap(a, like_torch), a


def marked(dtype, *arrays):
    """arrays as the extension takes them for dtype: bfloat16's int16 views
    inside _mha.bf16 (None stays None), the others as they are."""
    if dtype != "bfloat16":
        return arrays
    return tuple(None if a is None else _mha.bf16(a) for a in arrays)


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
