"""test_modules.py - parity with Debian's PyTorch 1.13: nn.MultiheadAttention
(every constructor flag, both mask kinds, weights averaged or per head,
batch-first/seq-first/unbatched), F.multi_head_attention_forward, and the
Transformer encoder/decoder layers built from their state_dicts."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import mha  # noqa: E402

TOL = dict(rtol=1e-4, atol=2e-5)


def close(a, b):
    np.testing.assert_allclose(np.asarray(a.detach() if hasattr(a, "detach") else a),
                               b.detach().numpy(), **TOL)


MHA_CONFIGS = [
    dict(E=12, H=3), dict(E=8, H=1, bias=False), dict(E=10, H=5, kdim=7, vdim=3),
    dict(E=6, H=2, add_bias_kv=True), dict(E=6, H=3, add_zero_attn=True),
    dict(E=4, H=4, add_bias_kv=True, add_zero_attn=True),
]


@pytest.mark.parametrize("cfg", MHA_CONFIGS)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("masks", ["none", "bool", "float", "float_kpm"])
@pytest.mark.parametrize("average", [True, False])
def test_multihead_attention(cfg, batch_first, masks, average):
    torch.manual_seed(5)
    E, H = cfg["E"], cfg["H"]
    kdim, vdim = cfg.get("kdim", E), cfg.get("vdim", E)
    m = torch.nn.MultiheadAttention(E, H, bias=cfg.get("bias", True),
                                    add_bias_kv=cfg.get("add_bias_kv", False),
                                    add_zero_attn=cfg.get("add_zero_attn", False),
                                    kdim=cfg.get("kdim"), vdim=cfg.get("vdim"),
                                    batch_first=batch_first).eval()
    B, L, S = 2, 5, 7
    shape = (lambda n, w: (B, n, w)) if batch_first else (lambda n, w: (n, B, w))
    q, k, v = torch.randn(*shape(L, E)), torch.randn(*shape(S, kdim)), torch.randn(*shape(S, vdim))
    kw = {}
    if masks == "bool":
        kpm = torch.zeros(B, S, dtype=torch.bool)
        kpm[0, 1] = kpm[1, -1] = True
        am = torch.rand(L, S) < 0.3
        am[:, 0] = False
        kw = dict(key_padding_mask=kpm, attn_mask=am)
    elif masks == "float":  # torch 1.13 cannot add a float key_padding_mask to it
        kpm = torch.zeros(B, S, dtype=torch.bool)
        kpm[1, 2] = True
        kw = dict(key_padding_mask=kpm, attn_mask=torch.randn(B * H, L, S))
    elif masks == "float_kpm":
        kw = dict(key_padding_mask=torch.randn(B, S))
    ours = mha.MultiheadAttention.from_torch(m)
    with torch.enable_grad():  # no fast path: torch's reference math
        want, want_w = m(q, k, v, average_attn_weights=average, **kw)
    got, got_w = ours(q, k, v, average_attn_weights=average, **kw)
    assert isinstance(got, torch.Tensor) and got.shape == want.shape
    close(got, want)
    close(got_w, want_w)
    got2, none = ours(q, k, v, need_weights=False, **kw)
    assert none is None
    close(got2, want)


def test_self_attention_unbatched_and_causal():
    torch.manual_seed(2)
    m = torch.nn.MultiheadAttention(8, 2).eval()
    x = torch.randn(6, 8)  # unbatched (L,E)
    causal = torch.triu(torch.ones(6, 6, dtype=torch.bool), 1)
    with torch.enable_grad():
        want, ww = m(x, x, x, attn_mask=causal)
    ours = mha.MultiheadAttention.from_torch(m)
    got, gw = ours(x, x, x, attn_mask=causal)
    close(got, want)
    close(gw, ww)
    got_c, _ = ours(x, x, x, is_causal=True)
    close(got_c, want)


def test_fully_masked_row_is_nan_as_torch():
    torch.manual_seed(3)
    m = torch.nn.MultiheadAttention(4, 2, batch_first=True).eval()
    x = torch.randn(1, 3, 4)
    am = torch.zeros(3, 3, dtype=torch.bool)
    am[1] = True
    with torch.enable_grad():
        want, _ = m(x, x, x, attn_mask=am)
    got, _ = mha.MultiheadAttention.from_torch(m)(x, x, x, attn_mask=am)
    assert torch.isnan(want[0, 1]).all() and torch.isnan(got[0, 1]).all()
    close(got[0, [0, 2]], want[0, [0, 2]])


def test_functional_multi_head_attention_forward():
    torch.manual_seed(4)
    E, H, L, S, B = 6, 2, 4, 5, 3
    q, k, v = torch.randn(L, B, E), torch.randn(S, B, E), torch.randn(S, B, E)
    w_in, b_in = torch.randn(3 * E, E), torch.randn(3 * E)
    w_out, b_out = torch.randn(E, E), torch.randn(E)
    kpm = torch.zeros(B, S, dtype=torch.bool)
    kpm[2, 0] = True
    args = (q, k, v, E, H, w_in, b_in, None, None, False, 0.0, w_out, b_out)
    want, ww = F.multi_head_attention_forward(*args, training=False, key_padding_mask=kpm)
    got, gw = mha.multi_head_attention(*args, training=False, key_padding_mask=kpm)
    close(got, want)
    close(gw, ww)
    # NumPy arrays in, NumPy out
    npargs = tuple(a.numpy() if isinstance(a, torch.Tensor) else a for a in args)
    got_np, _ = mha.multi_head_attention(*npargs, training=False, key_padding_mask=kpm.numpy())
    assert isinstance(got_np, np.ndarray)
    close(got_np, want)
    # separate projection weights
    wq, wk, wv = w_in.chunk(3)
    sep = args[:5] + (None, b_in) + args[7:]
    want_s, _ = F.multi_head_attention_forward(*sep, training=False, use_separate_proj_weight=True,
                                               q_proj_weight=wq, k_proj_weight=wk, v_proj_weight=wv)
    got_s, _ = mha.multi_head_attention(*sep, training=False, use_separate_proj_weight=True,
                                        q_proj_weight=wq, k_proj_weight=wk, v_proj_weight=wv)
    close(got_s, want_s)


def test_weights_shared_not_copied():
    m = torch.nn.MultiheadAttention(4, 2)
    ours = mha.MultiheadAttention.from_torch(m)
    assert np.shares_memory(ours.state["in_proj_weight"], m.in_proj_weight.detach().numpy())


LAYER_CONFIGS = [dict(norm_first=False, activation="relu"),
                 dict(norm_first=True, activation="gelu"),
                 dict(norm_first=False, activation="gelu")]


@pytest.mark.parametrize("cfg", LAYER_CONFIGS)
@pytest.mark.parametrize("batch_first", [True, False])
def test_encoder_layer(cfg, batch_first):
    torch.manual_seed(6)
    E, H, F_, B, L = 12, 3, 20, 2, 7
    layer = torch.nn.TransformerEncoderLayer(E, H, F_, dropout=0.0, batch_first=batch_first,
                                             **cfg).eval()
    x = torch.randn(B, L, E) if batch_first else torch.randn(L, B, E)
    kpm = torch.zeros(B, L, dtype=torch.bool)
    kpm[1, -2:] = True
    src_mask = torch.randn(L, L)
    with torch.enable_grad():
        want = layer(x, src_mask=src_mask, src_key_padding_mask=kpm)
    ours = mha.TransformerEncoderLayer.from_torch(layer)
    before = mha.copies()
    got = ours(x, src_mask=src_mask, src_key_padding_mask=kpm)
    # seq-first input: one counted copy to (B,L,E) rows; batch-first: none
    assert mha.copies() == before + (0 if batch_first else 1)
    close(got, want)
    # built from a state_dict of NumPy arrays (e.g. a safetensors file)
    sd = {n: t.detach().numpy().copy() for n, t in layer.state_dict().items()}
    again = mha.TransformerEncoderLayer(E, H, F_, 0.0, cfg["activation"], 1e-5, batch_first,
                                        cfg["norm_first"], state_dict=sd)
    close(again(x.numpy(), src_mask=src_mask.numpy(), src_key_padding_mask=kpm.numpy()), want)


@pytest.mark.parametrize("cfg", LAYER_CONFIGS)
def test_decoder_layer(cfg):
    torch.manual_seed(7)
    E, H, F_, B, L, S = 8, 2, 16, 3, 5, 6
    layer = torch.nn.TransformerDecoderLayer(E, H, F_, dropout=0.0, batch_first=True,
                                             **cfg).eval()
    tgt, memory = torch.randn(B, L, E), torch.randn(B, S, E)
    tgt_mask = torch.nn.Transformer.generate_square_subsequent_mask(L)
    mkpm = torch.zeros(B, S, dtype=torch.bool)
    mkpm[0, :2] = True
    with torch.enable_grad():
        want = layer(tgt, memory, tgt_mask=tgt_mask, memory_key_padding_mask=mkpm)
    ours = mha.TransformerDecoderLayer.from_torch(layer)
    close(ours(tgt, memory, tgt_mask=tgt_mask, memory_key_padding_mask=mkpm), want)
    close(ours(tgt, memory, tgt_is_causal=True, memory_key_padding_mask=mkpm), want)
