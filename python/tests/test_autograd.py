"""test_autograd.py - mha.torch: gradients of scaled_dot_product_attention
(mha's fused backward) against torch autograd of the float64 math
reference; dropout's backward with the forward's keep decisions; the
nn.MultiheadAttention swap (forward and parameter gradients)."""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import mha.torch as mt  # noqa: E402


def math_sdpa(q, k, v, mask=None, causal=False, scale=None):
    """torch's math SDPA in float64 (repeat_interleave for GQA)."""
    g = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(g, -3), v.repeat_interleave(g, -3)
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    if causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v


CASES = [  # B, Hq, Hkv, L, S, d, dv, mask kind, causal
    (1, 1, 1, 1, 1, 1, 1, None, False), (2, 3, 3, 7, 5, 4, 6, None, True),
    (3, 4, 2, 5, 11, 3, 5, "bool", False), (2, 2, 1, 9, 9, 8, 8, "float", True),
    (1, 2, 2, 33, 17, 16, 16, "float", False), (2, 1, 1, 70, 67, 64, 64, "bool", True)]


@pytest.mark.parametrize("case", CASES)
def test_gradients_match_torch_autograd(case):
    B, Hq, Hkv, L, S, d, dv, kind, causal = case
    g = torch.Generator().manual_seed(11)
    q = torch.randn(B, Hq, L, d, generator=g, requires_grad=True)
    k = torch.randn(B, Hkv, S, d, generator=g, requires_grad=True)
    v = torch.randn(B, Hkv, S, dv, generator=g, requires_grad=True)
    mask = None
    if kind == "bool":
        mask = torch.rand(L, S, generator=g) < 0.7
        mask[:, 0] = True
    elif kind == "float":
        mask = torch.randn(B, 1, L, S, generator=g)
    dout = torch.randn(B, Hq, L, dv, generator=g)
    out = mt.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                          enable_gqa=Hq != Hkv)
    out.backward(dout)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = math_sdpa(q64, k64, v64, None if mask is None else
                    (mask if mask.dtype == torch.bool else mask.double()), causal)
    ref.backward(dout.double())
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-4, atol=2e-5)
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-3, atol=1e-4)


def test_strided_inputs_and_partial_grads():
    x = torch.randn(2, 6, 3, 4)  # (B,L,H,d)
    q = x.transpose(1, 2).requires_grad_()  # a non-contiguous leaf
    k = torch.randn(2, 3, 5, 4)
    v = torch.randn(2, 3, 5, 4, requires_grad=True)
    out = mt.scaled_dot_product_attention(q, k, v)
    out.square().sum().backward()
    q64, v64 = q.detach().double().requires_grad_(), v.detach().double().requires_grad_()
    math_sdpa(q64, k.double(), v64).square().sum().backward()
    np.testing.assert_allclose(q.grad.numpy(), q64.grad.numpy(), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(v.grad.numpy(), v64.grad.numpy(), rtol=1e-3, atol=1e-4)
    assert k.grad is None


def test_dropout_backward_uses_forward_keep_decisions():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g, requires_grad=True) for _ in range(3))
    p = 0.3
    out, w = mt._sdpa(q, k, v, None, 0, None, 0, 0, None, p, 99, "zero", "auto", True)
    keep = (w != 0).double()
    dout = torch.randn(1, 2, 6, 4, generator=g)
    out.backward(dout)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    prob = torch.softmax(q64 @ k64.transpose(-1, -2) * 0.5, -1)
    ref = (prob * keep / (1 - p)) @ v64
    ref.backward(dout.double())
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-4, atol=2e-5)
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-3, atol=1e-4)


@pytest.mark.filterwarnings("ignore:Input #")
def test_gradcheck_float32_finite_differences():
    # mha computes in float32: central differences with a float32-sized step
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 1, 3, 2, generator=g, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(lambda a, b, c: mt.scaled_dot_product_attention(a, b, c),
                                    (q, k, v), eps=1e-2, atol=5e-3, rtol=5e-3)


def test_mask_requiring_grad_is_refused():
    q = torch.randn(1, 1, 2, 2)
    m = torch.zeros(2, 2, requires_grad=True)
    with pytest.raises(ValueError, match="no gradient for masks"):
        mt.scaled_dot_product_attention(q, q, q, attn_mask=m)


@pytest.mark.parametrize("batch_first", [False, True])
def test_swapped_multihead_attention_trains_like_torch(batch_first):
    torch.manual_seed(8)
    E, H, B, L, S = 12, 3, 2, 5, 7
    ref = torch.nn.MultiheadAttention(E, H, batch_first=batch_first)
    ours = mt.use_mha_attention(copy.deepcopy(ref))
    shape = (B, L, E) if batch_first else (L, B, E)
    kshape = (B, S, E) if batch_first else (S, B, E)
    q, kv = torch.randn(*shape), torch.randn(*kshape)
    kpm = torch.zeros(B, S, dtype=torch.bool)
    kpm[1, 0] = True
    am = torch.randn(B * H, L, S)
    outs = []
    for m in (ref, ours):
        out, w = m(q, kv, kv, key_padding_mask=kpm, attn_mask=am)
        (out.square().sum() + 0 * w.sum()).backward()
        outs.append((out.detach(), w.detach()))
    np.testing.assert_allclose(outs[1][0].numpy(), outs[0][0].numpy(), rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(outs[1][1].numpy(), outs[0][1].numpy(), rtol=1e-4, atol=2e-5)
    for (n, p1), (_, p2) in zip(ref.named_parameters(), ours.named_parameters()):
        np.testing.assert_allclose(p2.grad.numpy(), p1.grad.numpy(), rtol=1e-3, atol=1e-4,
                                   err_msg=n)


def test_swap_inside_encoder_layer_training():
    torch.manual_seed(9)
    ref = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    ours = mt.use_mha_attention(copy.deepcopy(ref))
    x = torch.randn(2, 6, 8)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(6)
    a, b = ref(x, src_mask=causal), ours(x, src_mask=causal)
    a.sum().backward()
    b.sum().backward()
    np.testing.assert_allclose(b.detach().numpy(), a.detach().numpy(), rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(ours.linear1.weight.grad.numpy(),
                               ref.linear1.weight.grad.numpy(), rtol=1e-3, atol=1e-4)


def test_swap_refuses_bias_kv():
    with pytest.raises(ValueError, match="bias_k"):
        mt.use_mha_attention(torch.nn.MultiheadAttention(4, 2, add_bias_kv=True))
