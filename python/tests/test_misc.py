"""test_misc.py - the ONNX Attention operator, the KV cache and decode
step, safetensors loading, errors as Python exceptions, threads."""
import numpy as np
import pytest

import mha
from conftest import randn, ref_sdpa, run_in_threads


def test_onnx_attention_4d_with_past(rng):
    q, k, v = randn(rng, 2, 4, 3, 5), randn(rng, 2, 2, 3, 5), randn(rng, 2, 2, 3, 6)
    pk, pv = randn(rng, 2, 2, 4, 5), randn(rng, 2, 2, 4, 6)
    y, present_k, present_v, qk = mha.onnx_attention(q, k, v, past_key=pk, past_value=pv,
                                                     is_causal=1)
    kk, vv = np.concatenate([pk, k], 2), np.concatenate([pv, v], 2)
    np.testing.assert_array_equal(present_k, kk)
    np.testing.assert_array_equal(present_v, vv)
    # causal with a past of P: query i sees keys j <= i + P
    keep = np.tril(np.ones((3, 7), bool), 4)
    np.testing.assert_allclose(y, ref_sdpa(q, kk, vv, keep), rtol=1e-4, atol=2e-5)
    assert qk.shape == (2, 4, 3, 7)


def test_onnx_attention_3d_int_mask(rng):
    q, k, v = randn(rng, 2, 3, 8), randn(rng, 2, 5, 8), randn(rng, 2, 5, 8)
    m = rng.integers(-2, 2, size=(3, 5)).astype(np.int64)
    y = mha.onnx_attention(q, k, v, m, q_num_heads=2, kv_num_heads=2)[0]
    split = lambda x: x.reshape(2, -1, 2, 4).transpose(0, 2, 1, 3)
    want = ref_sdpa(split(q), split(k), split(v), m.astype(np.float32))
    np.testing.assert_allclose(y, want.transpose(0, 2, 1, 3).reshape(2, 3, 8), rtol=1e-4, atol=2e-5)


def test_kv_cache_decode_equals_causal_forward(rng):
    B, Hq, Hkv, T, d = 2, 4, 2, 9, 8
    q, k, v = randn(rng, B, Hq, T, d), randn(rng, B, Hkv, T, d), randn(rng, B, Hkv, T, d)
    cache = mha.KVCache(B, Hkv, capacity=16, head_dim=d)
    full = ref_sdpa(q, k, v, causal=True)
    for t in range(T):
        cache.append(k[:, :, t:t + 1], v[:, :, t:t + 1])
        out = mha.attention_decode(q[:, :, t:t + 1], cache)
        np.testing.assert_allclose(out, full[:, :, t:t + 1], rtol=1e-4, atol=2e-5)
    assert cache.position == T and len(cache) == T
    cache.reset()
    assert len(cache) == 0


def test_kv_cache_sliding_window(rng):
    cache = mha.KVCache(1, 1, capacity=4, head_dim=2, window=3)
    k, v, q = randn(rng, 1, 1, 10, 2), randn(rng, 1, 1, 10, 2), randn(rng, 1, 1, 1, 2)
    for t in range(10):
        cache.append(k[:, :, t:t + 1], v[:, :, t:t + 1])
    assert len(cache) == 3 and cache.position == 10
    np.testing.assert_allclose(mha.attention_decode(q, cache),
                               ref_sdpa(q, k[:, :, 7:], v[:, :, 7:]), rtol=1e-4, atol=2e-5)


def test_load_safetensors(tmp_path):
    import json
    import struct
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    header = json.dumps({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}})
    header += " " * (-len(header) % 8)
    p = tmp_path / "w.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header.encode() + a.tobytes())
    got = mha.load_safetensors(str(p))
    np.testing.assert_array_equal(got["w"], a)
    (tmp_path / "bad.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":")
    with pytest.raises(OSError, match="safetensors|header|format"):
        mha.load_safetensors(str(tmp_path / "bad.safetensors"))
    with pytest.raises(OSError):
        mha.load_safetensors(str(tmp_path / "missing.safetensors"))


def q3(rng):
    return randn(rng, 1, 2, 3, 4)


@pytest.mark.parametrize("call, match", [
    (lambda q: mha.scaled_dot_product_attention(q, q[..., :3], q), "shape"),
    (lambda q: mha.scaled_dot_product_attention(q, q[:, :1], q[:, :1]), "enable_gqa"),
    (lambda q: mha.scaled_dot_product_attention(q, q, q, scale=float("nan")), "scale"),
    (lambda q: mha.scaled_dot_product_attention(q, q, q, dropout_p=1.5), "dropout"),
    (lambda q: mha.scaled_dot_product_attention(q, q, q, out=q), "overlap"),
    (lambda q: mha.scaled_dot_product_attention(q, q, q, out=np.empty((1, 2, 3, 5), np.float32)),
     "shape"),
    (lambda q: mha.scaled_dot_product_attention(q.astype(np.float64), q, q), "dtype"),
    (lambda q: mha.scaled_dot_product_attention(q, q, q, attn_mask=np.ones((3, 5), bool)), "mask"),
    (lambda q: mha.scaled_dot_product_attention(q[0, 0, 0], q, q), "rank"),
    (lambda q: mha.scaled_dot_product_attention(q, q, q, kernel="gpu"), "kernel"),
    (lambda q: mha.KVCache(1, 1, 0, 4), "capacity|shape|positive"),
    (lambda q: mha.multi_head_attention(q[0], q[0], q[0], 4, 3, np.ones((12, 4), np.float32),
                                        None, None, None, False, 0.0,
                                        np.ones((4, 4), np.float32), None), "num_heads|divide"),
])
def test_bad_inputs_raise_value_error(rng, call, match):
    with pytest.raises(ValueError, match=match):
        call(q3(rng))


def test_not_an_array_is_type_error():
    with pytest.raises(TypeError):
        mha.scaled_dot_product_attention([[1.0]], [[1.0]], [[1.0]])


def test_append_past_capacity(rng):
    cache = mha.KVCache(1, 1, capacity=2, head_dim=2)
    kv = randn(rng, 1, 1, 3, 2)
    with pytest.raises(ValueError, match="capacity"):
        cache.append(kv, kv)
    assert len(cache) == 0  # a failed call changes nothing


def test_huge_allocation_is_memory_error():
    with pytest.raises((MemoryError, ValueError)):
        mha.KVCache(1, 1, 2 ** 36, 1024)


def test_threads_equal_serial(rng):
    inputs = [(randn(rng, 2, 3, 17, 8), randn(rng, 2, 3, 19, 8), randn(rng, 2, 3, 19, 8))
              for _ in range(8)]
    serial = [mha.scaled_dot_product_attention(*x, is_causal=True) for x in inputs]
    results = [[None] * 8 for _ in range(8)]

    def work(t):
        for rep in range(8):
            i = (t + rep) % 8
            results[t][i] = mha.scaled_dot_product_attention(*inputs[i], is_causal=True)

    run_in_threads(work, 8)
    for t in range(8):
        for i in range(8):
            np.testing.assert_array_equal(results[t][i], serial[i])


def test_threads_share_a_kv_cache(rng):
    cache = mha.KVCache(1, 2, capacity=64, head_dim=4)
    kv = randn(rng, 1, 2, 1, 4)
    run_in_threads(lambda t: [cache.append(kv, kv) for _ in range(8)], 4)
    assert len(cache) == 32


def test_versions_and_threads():
    assert mha.library_version == "0.3.0"
    assert mha.kernel_name("ref") == "ref"
    n = mha.get_num_threads()
    mha.set_num_threads(1)
    assert mha.get_num_threads() == 1
    mha.set_num_threads(n)
    with pytest.raises(ValueError):
        mha.set_num_threads(-1)

