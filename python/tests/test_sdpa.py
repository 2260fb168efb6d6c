"""test_sdpa.py - mha.scaled_dot_product_attention against the NumPy
float64 reference on the C suites' odd shapes (L=1, odd L/S, d=1, h=1,
GQA, tile tails), both mask kinds, causal; strided inputs; zero-copy."""
import numpy as np
import pytest

import mha
from conftest import randn, ref_sdpa

# (B, Hq, Hkv, L, S, d, dv)
SHAPES = [(1, 1, 1, 1, 1, 1, 1), (2, 3, 3, 7, 5, 4, 6), (1, 1, 1, 1, 9, 8, 8),
          (3, 4, 2, 5, 11, 3, 5), (2, 6, 1, 13, 1, 1, 2), (1, 2, 2, 33, 17, 16, 16),
          (2, 1, 1, 70, 67, 64, 64), (1, 8, 2, 3, 130, 32, 7)]
MASKS = ["none", "bool_ls", "bool_kpm", "float_full", "causal", "causal_bool"]
KERNELS = ["auto", "ref", "scalar"]


def make_mask(rng, kind, B, H, L, S):
    if kind == "bool_ls":
        m = rng.random((L, S)) < 0.7
        m[:, 0] = True
        return m
    if kind == "bool_kpm":
        m = rng.random((B, 1, 1, S)) < 0.6
        m[..., -1] = True
        return m
    if kind == "float_full":
        return randn(rng, B, H, L, S)
    if kind == "causal_bool":
        return rng.random((L, S)) < 0.8
    return None


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", MASKS)
def test_matches_float64_reference(rng, shape, kind):
    B, Hq, Hkv, L, S, d, dv = shape
    q, k, v = randn(rng, B, Hq, L, d), randn(rng, B, Hkv, S, d), randn(rng, B, Hkv, S, dv)
    m = make_mask(rng, kind, B, Hq, L, S)
    causal = kind.startswith("causal")
    got = mha.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal,
                                           enable_gqa=Hq != Hkv)
    assert got.shape == (B, Hq, L, dv) and got.dtype == np.float32
    np.testing.assert_allclose(got, ref_sdpa(q, k, v, m, causal), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("kernel", KERNELS)
def test_kernels_and_scale(rng, kernel):
    q, k, v = randn(rng, 2, 3, 9, 5), randn(rng, 2, 3, 4, 5), randn(rng, 2, 3, 4, 2)
    got = mha.scaled_dot_product_attention(q, k, v, scale=0.3, kernel=kernel)
    np.testing.assert_allclose(got, ref_sdpa(q, k, v, scale=0.3), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("lead", [(), (3,), (2, 3), (2, 2, 3)])
def test_ranks_2_to_5(rng, lead):
    q, k, v = randn(rng, *lead, 6, 4), randn(rng, *lead, 5, 4), randn(rng, *lead, 5, 3)
    got = mha.scaled_dot_product_attention(q, k, v)
    assert got.shape == lead + (6, 3)
    want = ref_sdpa(q.reshape(-1, 1, 6, 4), k.reshape(-1, 1, 5, 4), v.reshape(-1, 1, 5, 3))
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=2e-5)


def test_fully_masked_rows_zero_or_nan(rng):
    q, k, v = randn(rng, 1, 1, 3, 4), randn(rng, 1, 1, 5, 4), randn(rng, 1, 1, 5, 4)
    m = np.ones((3, 5), bool)
    m[1] = False
    z = mha.scaled_dot_product_attention(q, k, v, attn_mask=m)
    assert (z[0, 0, 1] == 0).all() and np.isfinite(z).all()
    n = mha.scaled_dot_product_attention(q, k, v, attn_mask=m, masked_rows="nan")
    assert np.isnan(n[0, 0, 1]).all() and np.isfinite(n[0, 0, [0, 2]]).all()


def test_strided_inputs_no_copy(rng):
    # (B,L,H,d) storage read as (B,H,L,d), and every other key row
    qs, ks, vs = randn(rng, 2, 7, 3, 5), randn(rng, 2, 22, 3, 5), randn(rng, 2, 22, 3, 4)
    q, k, v = qs.transpose(0, 2, 1, 3), ks.transpose(0, 2, 1, 3)[:, :, ::2], vs.transpose(0, 2, 1, 3)[:, :, ::2]
    assert not q.flags.c_contiguous and not k.flags.c_contiguous
    before = mha.copies()
    got = mha.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert mha.copies() == before
    np.testing.assert_allclose(got, ref_sdpa(q, k, v, causal=True), rtol=1e-4, atol=2e-5)


def test_strided_out_and_broadcast_mask(rng):
    q, k, v = randn(rng, 2, 3, 4, 5), randn(rng, 2, 3, 6, 5), randn(rng, 2, 3, 6, 5)
    store = np.zeros((2, 4, 3, 5), np.float32)
    out = store.transpose(0, 2, 1, 3)
    m = np.broadcast_to(randn(rng, 6), (4, 6))  # stride-0 rows
    r = mha.scaled_dot_product_attention(q, k, v, attn_mask=m, out=out)
    assert r is out and np.shares_memory(store, r)
    np.testing.assert_allclose(store.transpose(0, 2, 1, 3), ref_sdpa(q, k, v, m),
                               rtol=1e-4, atol=2e-5)


def test_negative_stride_is_one_counted_copy(rng):
    q, k, v = randn(rng, 1, 2, 5, 3), randn(rng, 1, 2, 4, 3), randn(rng, 1, 2, 4, 3)
    before = mha.copies()
    got = mha.scaled_dot_product_attention(q[:, :, ::-1], k, v)
    assert mha.copies() == before + 1
    np.testing.assert_allclose(got, ref_sdpa(q[:, :, ::-1], k, v), rtol=1e-4, atol=2e-5)


def test_zero_copy_contiguous(rng):
    q, k, v = randn(rng, 2, 2, 8, 4), randn(rng, 2, 2, 8, 4), randn(rng, 2, 2, 8, 4)
    out = np.empty((2, 2, 8, 4), np.float32)
    before = mha.copies()
    r = mha.scaled_dot_product_attention(q, k, v, out=out)
    assert r is out and mha.copies() == before
    r2 = mha.scaled_dot_product_attention(q, k, v)
    assert r2.flags.owndata and mha.copies() == before
    np.testing.assert_array_equal(r, r2)


def test_dropout_is_seeded(rng):
    q, k, v = randn(rng, 1, 2, 6, 4), randn(rng, 1, 2, 6, 4), randn(rng, 1, 2, 6, 4)
    a = mha.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=3)
    b = mha.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=3)
    c = mha.scaled_dot_product_attention(q, k, v, dropout_p=0.5, seed=4)
    d = mha.scaled_dot_product_attention(q, k, v)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c) and not np.array_equal(a, d)


def test_negative_stride_mask_copied_and_out_refused(rng):
    q, k, v = randn(rng, 1, 2, 5, 3), randn(rng, 1, 2, 4, 3), randn(rng, 1, 2, 4, 3)
    m = rng.random((5, 4)) < 0.7
    m[:, 0] = m[:, -1] = True
    before = mha.copies()
    got = mha.scaled_dot_product_attention(q, k, v, attn_mask=m[:, ::-1])
    assert mha.copies() == before + 1
    np.testing.assert_allclose(got, ref_sdpa(q, k, v, m[:, ::-1]), rtol=1e-4, atol=2e-5)
    store = np.zeros((1, 2, 5, 3), np.float32)
    with pytest.raises(ValueError, match="negative stride"):
        mha.scaled_dot_product_attention(q, k, v, out=store[:, :, ::-1])
    assert not store.any()  # nothing written
