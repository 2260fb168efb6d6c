"""mha.torch - mha inside PyTorch training: scaled_dot_product_attention as
a torch.autograd.Function whose backward is mha's fused backward
(mha_sdpa_backward), and use_mha_attention(module), which makes
torch.nn.MultiheadAttention modules compute their attention core with it
(projections stay torch's, so the whole module trains).

CPU float32, float16 or bfloat16 tensors (query, key and value of one
dtype; the output and the gradients in that dtype, computed by mha's half
path in float32); inputs and outputs are shared with mha, never copied.  Letters: B batch, H / Hq query heads, Hkv kv heads, L query
length, S key length, E width, d head dim, dv value head dim.
"""
import types

import numpy as np
import torch
import torch.nn.functional as F

from . import _mha
from ._arrays import (attention_array, attention_inputs, attention_mask, kernel_id,
                      mask as _mask, marked, masked_rows_id, seed_or_random)


def _np(t, name):
    """t as the extension reads it: the .numpy() view of a CPU float32 or
    float16 tensor, a bfloat16 one marked (_mha.bf16 of its int16 view)."""
    a, dtype = attention_array(t, name)
    return marked(dtype, a)[0]


class ScaledDotProductAttention(torch.autograd.Function):
    """out (B,Hq,L,dv), weights (B,Hq,L,S) or None = SDPA(q (B,Hq,L,d),
    k (B,Hkv,S,d), v (B,Hkv,S,dv)), q, k, v and out of one dtype (float32,
    float16 or bfloat16; weights and the log-sum-exp float32).  opts =
    (mask_true_masks, key_padding_mask, kpm_true_masks, causal, scale,
    dropout_p, seed, masked_rows, kernel, need_weights).  Gradients for q,
    k, v (in their dtype) from mha_sdpa_backward with the forward's saved
    output and log-sum-exp; masks get none, the weights output is not
    differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, attn_mask, opts):
        B, Hq, L, _ = q.shape
        qa, ka, va, dtype = attention_inputs(q, k, v)
        out = torch.empty((B, Hq, L, v.shape[3]), dtype=q.dtype)
        lse = torch.empty((B, Hq, L), dtype=torch.float32)
        weights = (torch.empty((B, Hq, L, k.shape[2]), dtype=torch.float32)
                   if opts[-1] else None)
        m = attention_mask(attn_mask, "attn_mask", dtype)
        args = (m, opts[0], _mask(opts[1], "key_padding_mask")) + opts[2:-1]
        _mha.sdpa(_np(out, "out"), *marked(dtype, qa, ka, va), *args[:9],
                  None if weights is None else weights.numpy(), lse.numpy(), args[9])
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = args
        if weights is None:
            return out
        ctx.mark_non_differentiable(weights)
        return out, weights

    @staticmethod
    def backward(ctx, grad_out, *unused):
        q, k, v, out, lse = ctx.saved_tensors
        need = ctx.needs_input_grad
        dq = torch.zeros_like(q) if need[0] else None
        dk = torch.zeros_like(k) if need[1] else None
        dv = torch.zeros_like(v) if need[2] else None
        _mha.sdpa_backward(*(None if g is None else _np(g, "grad") for g in (dq, dk, dv)),
                           _np(grad_out, "grad_output"), _np(out, "out"), lse.numpy(),
                           _np(q, "query"), _np(k, "key"), _np(v, "value"),
                           *ctx.args[:9], None, None, ctx.args[9])
        return dq, dk, dv, None, None


def _sdpa(q, k, v, attn_mask, mask_true_masks, key_padding_mask, kpm_true_masks, causal,
          scale, dropout_p, seed, masked_rows, kernel, need_weights):
    for name, m in (("attn_mask", attn_mask), ("key_padding_mask", key_padding_mask)):
        if m is not None and m.requires_grad:
            raise ValueError("%s: requires grad, but mha computes no gradient for masks" % name)
    opts = (mask_true_masks, key_padding_mask, kpm_true_masks, causal, scale,
            float(dropout_p), seed_or_random(seed) if dropout_p else 0,
            masked_rows_id(masked_rows), kernel_id(kernel), need_weights)
    return ScaledDotProductAttention.apply(q, k, v, attn_mask, opts)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *, seed=None,
                                 masked_rows="zero", kernel="auto"):
    """torch.nn.functional.scaled_dot_product_attention with autograd, on mha.

    query (..., Hq, L, d), key (..., Hkv, S, d), value (..., Hkv, S, dv),
    rank 2..4 -> (..., Hq, L, dv); Hq != Hkv needs enable_gqa.  attn_mask
    bool True = attend or float added (no gradient), is_causal top-left,
    scale default 1/sqrt(d).  float32, float16 or bfloat16 inputs of one
    dtype; the output and gradients have it (a float mask may also have it,
    widened to float32).  The backward is mha's fused backward; with
    dropout_p > 0 it reuses the forward's keep decisions (same seed)."""
    nd = query.dim()
    if not (2 <= nd <= 4 and key.dim() == nd and value.dim() == nd):
        raise ValueError("query, key, value: ranks %d, %d, %d, want equal and 2..4"
                         % (nd, key.dim(), value.dim()))
    lift = (None,) * (4 - nd)
    q, k, v = query[lift], key[lift], value[lift]
    if q.shape[1] != k.shape[1] and not enable_gqa:
        raise ValueError("key: %d heads but query has %d; pass enable_gqa=True"
                         % (k.shape[1], q.shape[1]))
    out = _sdpa(q, k, v, attn_mask, 0, None, 0, int(bool(is_causal)), scale, dropout_p, seed,
                masked_rows, kernel, False)
    return out[(0,) * (4 - nd)] if nd < 4 else out


def _mha_forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                 attn_mask=None, average_attn_weights=True, is_causal=False):
    """nn.MultiheadAttention.forward with mha's attention core: torch's
    projections (autograd as usual), mha's fused SDPA forward/backward."""
    batched = query.dim() == 3
    if not batched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    if self.batch_first and batched:
        query, key, value = (x.transpose(0, 1) for x in (query, key, value))
    # here (L,B,E), (S,B,kdim), (S,B,vdim) as torch's functional
    L, B, E = query.shape
    S, H = key.shape[0], self.num_heads
    d = E // H
    if self._qkv_same_embed_dim:
        wq, wk, wv = self.in_proj_weight.chunk(3)
    else:
        wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
    bq, bk, bv = (None,) * 3 if self.in_proj_bias is None else self.in_proj_bias.chunk(3)
    # (B,H,N,d) views of the projections: strided, not copied
    heads = lambda x, w, b: F.linear(x, w, b).view(x.shape[0], B, H, d).permute(1, 2, 0, 3)
    q, k, v = heads(query, wq, bq), heads(key, wk, bk), heads(value, wv, bv)
    if attn_mask is not None and attn_mask.dim() == 3:
        attn_mask = attn_mask.view(B, H, L, S)
    out, w = _sdpa(q, k, v, attn_mask, 1, key_padding_mask, 1, int(bool(is_causal)), None,
                   self.dropout if self.training else 0.0, None, "nan", "auto", True)
    out = out.permute(2, 0, 1, 3).reshape(L, B, E)
    out = F.linear(out, self.out_proj.weight, self.out_proj.bias)
    if self.batch_first and batched:
        out = out.transpose(0, 1)
    if not batched:
        out = out.squeeze(1)
    if not need_weights:
        return out, None
    if average_attn_weights:
        w = w.mean(dim=1)
    w = w.to(out.dtype)  # mha's weights are float32; torch's the module's dtype
    return out, (w if batched else w.squeeze(0))


def use_mha_attention(model):
    """Makes every torch.nn.MultiheadAttention in model (the model itself or
    its submodules) compute attention with mha: forward and backward
    through ScaledDotProductAttention, projections by torch.  Returns model.
    Modules with bias_k/bias_v or add_zero_attn are refused (ValueError).
    The attention weights returned with need_weights are not
    differentiable.  TransformerEncoderLayer's eval-mode fast path
    (torch._transformer_encoder_layer_fwd) bypasses the module's forward
    and so stays torch's."""
    found = [m for m in model.modules() if isinstance(m, torch.nn.MultiheadAttention)]
    for m in found:
        if m.bias_k is not None or m.add_zero_attn:
            raise ValueError("use_mha_attention: bias_k/bias_v and add_zero_attn are not "
                             "supported by the swapped forward")
    for m in found:
        m.forward = types.MethodType(_mha_forward, m)
    return model


__all__ = ["scaled_dot_product_attention", "ScaledDotProductAttention", "use_mha_attention"]
