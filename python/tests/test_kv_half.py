"""Half-precision KV caches (mha.KVCache(dtype="bfloat16"|"float16")): the
decode over a half cache equals the decode over a float32 cache holding the
same rounded values up to the rounding of P (the only other difference), and
a bad dtype is refused."""
import numpy as np
import pytest

import mha
from conftest import randn


def rounded(x, dtype):
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # nearest even (no NaN here)
    return bits.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("dtype,tol", [("bfloat16", 1e-2), ("float16", 2e-3)])
def test_half_cache_decode_matches_rounded_fp32_cache(rng, dtype, tol):
    B, Hq, Hkv, T, d = 2, 6, 2, 300, 24
    q, k, v = randn(rng, B, Hq, 1, d), randn(rng, B, Hkv, T, d), randn(rng, B, Hkv, T, d)
    half = mha.KVCache(B, Hkv, capacity=T, head_dim=d, dtype=dtype)
    ref = mha.KVCache(B, Hkv, capacity=T, head_dim=d)
    assert half.dtype == dtype
    half.append(k, v)
    ref.append(rounded(k, dtype), rounded(v, dtype))
    out, want = mha.attention_decode(q, half), mha.attention_decode(q, ref)
    err = np.abs(out - want).max() / np.abs(want).max()
    assert 0 < err < tol


def test_half_cache_bad_dtype():
    with pytest.raises(ValueError, match="dtype"):
        mha.KVCache(1, 1, 4, 2, dtype="int64")
