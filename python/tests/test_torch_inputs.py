"""test_torch_inputs.py - CPU torch tensors in and out of the NumPy-level
functions: zero-copy (the result's memory is the caller's out= tensor, or
a tensor sharing the returned buffer), dtypes that are refused."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import mha  # noqa: E402
from conftest import ref_sdpa  # noqa: E402


def test_torch_in_torch_out_zero_copy():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g) for _ in range(3))
    out = torch.empty(2, 3, 5, 4)
    before = mha.copies()
    r = mha.scaled_dot_product_attention(q, k, v, is_causal=True, out=out)
    assert r is out and mha.copies() == before
    np.testing.assert_allclose(out.numpy(), ref_sdpa(q.numpy(), k.numpy(), v.numpy(),
                                                     causal=True), rtol=1e-4, atol=2e-5)
    r2 = mha.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert isinstance(r2, torch.Tensor) and torch.equal(r2, out)


def test_transposed_torch_tensor(rng=np.random.default_rng(1)):
    x = torch.randn(2, 7, 3, 4)  # (B,L,H,d)
    q = x.transpose(1, 2)  # (B,H,L,d), non-contiguous
    before = mha.copies()
    got = mha.scaled_dot_product_attention(q, q, q)
    assert mha.copies() == before
    np.testing.assert_allclose(got.numpy(), ref_sdpa(q.numpy(), q.numpy(), q.numpy()),
                               rtol=1e-4, atol=2e-5)


def test_requires_grad_tensor_is_read_without_copy():
    q = torch.randn(1, 1, 3, 2, requires_grad=True)
    got = mha.scaled_dot_product_attention(q, q, q)
    assert not got.requires_grad


@pytest.mark.parametrize("dtype", ["float64", "int32"])  # half: test_half.py
def test_other_dtypes_refused(dtype):
    q = torch.ones(1, 1, 2, 2, dtype=getattr(torch, dtype))
    with pytest.raises(ValueError, match="dtype"):
        mha.scaled_dot_product_attention(q, q, q)


def test_bool_mask_tensor():
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    m = torch.rand(3, 5) < 0.5
    m[:, 0] = True
    got = mha.scaled_dot_product_attention(q, k, v, attn_mask=m)
    want = ref_sdpa(q.numpy(), k.numpy(), v.numpy(), m.numpy())
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=2e-5)
