"""modules.py - MultiheadAttention, TransformerEncoderLayer and
TransformerDecoderLayer: the torch.nn modules' constructor arguments and
forward signatures, their weights taken from a torch state_dict (or a dict
of arrays with the same names), run by mha (inference; dropout only after
.train()).

Letters: B batch, L target length, S source/memory length, E d_model,
H heads, F dim_feedforward.
"""
import numpy as np

from . import _mha
from ._arrays import (call, f32, is_torch, kernel_id, mask, masked_rows_id, rows, seed_or_random,
                      weights, wrap)
from .functional import multihead

_ACTIVATIONS = {"relu": 0, "gelu": 1, "gelu_tanh": 2, "silu": 3}


def _state_of(state_dict, module):
    if state_dict is None:
        raise ValueError("state_dict: required (a torch state_dict or dict of arrays, "
                         "e.g. module.state_dict())")
    if hasattr(state_dict, "state_dict") and callable(state_dict.state_dict):
        state_dict = state_dict.state_dict()
    return weights(state_dict)


class _Module:
    """train()/eval() and __call__ as torch.nn.Module."""
    training = False

    def train(self, mode=True):
        self.training = bool(mode)
        return self

    def eval(self):
        return self.train(False)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


class MultiheadAttention(_Module):
    """torch.nn.MultiheadAttention on mha.

    MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True,
    add_bias_kv=False, add_zero_attn=False, kdim=None, vdim=None,
    batch_first=False, *, state_dict) with state_dict the module's
    (in_proj_weight (3E,E) or q/k/v_proj_weight, in_proj_bias (3E),
    out_proj.weight (E,E), out_proj.bias (E), bias_k/bias_v (1,1,E)).
    Float32 CPU tensors are shared, not copied.  MultiheadAttention.from_torch(m)
    copies a module's configuration and weights.  masked_rows="nan"
    (PyTorch's result for a query row with every key masked) or "zero".
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, *,
                 state_dict=None, masked_rows="nan", kernel="auto"):
        self.embed_dim, self.num_heads = int(embed_dim), int(num_heads)
        self.dropout, self.add_zero_attn = float(dropout), bool(add_zero_attn)
        self.batch_first = bool(batch_first)
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self.masked_rows, self.kernel = masked_rows, kernel
        masked_rows_id(masked_rows), kernel_id(kernel)
        self.state = _state_of(state_dict, self)
        if ("bias_k" in self.state) != bool(add_bias_kv):
            raise ValueError("state_dict: bias_k %s but add_bias_kv=%s"
                             % ("present" if "bias_k" in self.state else "absent", add_bias_kv))
        if bias != ("out_proj.bias" in self.state):
            raise ValueError("state_dict: out_proj.bias %s but bias=%s"
                             % ("present" if "out_proj.bias" in self.state else "absent", bias))

    @classmethod
    def from_torch(cls, module, **kwargs):
        """The mha twin of a torch.nn.MultiheadAttention (weights shared)."""
        return cls(module.embed_dim, module.num_heads, module.dropout,
                   module.out_proj.bias is not None, module.bias_k is not None,
                   module.add_zero_attn, module.kdim, module.vdim, module.batch_first,
                   state_dict=module.state_dict(), **kwargs)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False, *, seed=None):
        """query (L,B,E) (batch_first: (B,L,E); unbatched (L,E)), key (S,B,kdim),
        value (S,B,vdim) -> (attn_output like query, weights (B,L,S) averaged
        or (B,H,L,S), or None when need_weights=False).  key_padding_mask
        (B,S), attn_mask (L,S) or (B*H,L,S): bool True = masked, float
        added.  is_causal: tril(ones(L,S)), with or without attn_mask."""
        return multihead(self.state, self.num_heads, query, key, value, key_padding_mask,
                         need_weights, attn_mask, average_attn_weights, is_causal,
                         self.batch_first, self.training, self.dropout, self.add_zero_attn,
                         seed, self.masked_rows, self.kernel)


class _Layer(_Module):
    """The constructor shared by the encoder and decoder layers (torch's
    arguments; bias is implied by the state_dict's entries)."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True, *,
                 state_dict=None, masked_rows="nan", kernel="auto"):
        if callable(activation):
            activation = getattr(activation, "__name__", "")
        if activation not in _ACTIVATIONS:
            raise ValueError("activation: %r, want one of %s" % (activation, sorted(_ACTIVATIONS)))
        self.d_model, self.nhead = int(d_model), int(nhead)
        self.dim_feedforward, self.dropout = int(dim_feedforward), float(dropout)
        self.activation, self.layer_norm_eps = activation, float(layer_norm_eps)
        self.batch_first, self.norm_first = bool(batch_first), bool(norm_first)
        self.masked_rows, self.kernel = masked_rows, kernel
        self.state = _state_of(state_dict, self)
        w1 = self.state.get("linear1.weight")
        if w1 is None or w1.shape != (self.dim_feedforward, self.d_model):
            raise ValueError("state_dict: linear1.weight %s, want (%d, %d) (dim_feedforward, "
                             "d_model)" % (None if w1 is None else w1.shape,
                                           self.dim_feedforward, self.d_model))

    @classmethod
    def from_torch(cls, layer, **kwargs):
        """The mha twin of a torch layer (weights shared when float32)."""
        return cls(layer.self_attn.embed_dim, layer.self_attn.num_heads,
                   layer.linear1.out_features, layer.dropout.p, _torch_activation(layer),
                   layer.norm1.eps, layer.self_attn.batch_first, layer.norm_first,
                   state_dict=layer.state_dict(), **kwargs)

    def _options(self, seed):
        drop = self.training and self.dropout > 0
        return (self.nhead, int(self.norm_first), _ACTIVATIONS[self.activation],
                self.layer_norm_eps, masked_rows_id(self.masked_rows), int(drop), self.dropout,
                seed_or_random(seed) if drop else 0, kernel_id(self.kernel))

    def _seq(self, x, name):
        """(B,L,E) contiguous rows for mha (seq-first input: a counted copy)."""
        a = f32(x, name)
        if a.ndim == 3 and not self.batch_first:
            a = a.swapaxes(0, 1)
        return rows(a, name)

    def _result(self, out, like_torch):
        if out.ndim == 3 and not self.batch_first:
            out = out.swapaxes(0, 1)
        return wrap(out, like_torch)


class TransformerEncoderLayer(_Layer):
    """torch.nn.TransformerEncoderLayer on mha.

    TransformerEncoderLayer(d_model, nhead, dim_feedforward=2048,
    dropout=0.1, activation="relu", layer_norm_eps=1e-5, batch_first=False,
    norm_first=False, bias=True, *, state_dict) with the layer's state_dict
    (self_attn.*, linear1.*, linear2.*, norm1.*, norm2.*).  activation:
    "relu", "gelu", "gelu_tanh", "silu" (or F.relu / F.gelu).
    TransformerEncoderLayer.from_torch(layer) copies a torch layer.
    """

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False, *,
                seed=None):
        """src (L,B,E) (batch_first: (B,L,E); unbatched (L,E)) -> same shape.
        src_mask (L,L) or (B*H,L,L), src_key_padding_mask (B,L): bool True =
        masked, float added; is_causal: a causal self-attention mask."""
        like_torch = is_torch(src)
        x = self._seq(src, "src")
        out = np.empty(x.shape, np.float32)
        call(_mha.encoder_layer, out, x, self.state, mask(src_mask, "src_mask"),
                           mask(src_key_padding_mask, "src_key_padding_mask"),
                           int(bool(is_causal)), *self._options(seed))
        return self._result(out, like_torch)


class TransformerDecoderLayer(_Layer):
    """torch.nn.TransformerDecoderLayer on mha: the constructor of
    TransformerEncoderLayer; state_dict with self_attn.*, multihead_attn.*,
    linear1/2.*, norm1/2/3.*."""

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False, *,
                seed=None):
        """tgt (L,B,E), memory (S,B,E) (batch_first: (B,L,E), (B,S,E)) ->
        like tgt.  tgt_mask (L,L), memory_mask (L,S) (or (B*H,...)),
        *_key_padding_mask (B,L) / (B,S): bool True = masked, float added.
        memory_is_causal is not supported (NotImplementedError)."""
        if memory_is_causal:
            raise NotImplementedError("memory_is_causal: not supported by mha; pass memory_mask")
        like_torch = is_torch(tgt)
        x, m = self._seq(tgt, "tgt"), self._seq(memory, "memory")
        out = np.empty(x.shape, np.float32)
        call(_mha.decoder_layer, out, x, m, self.state, mask(tgt_mask, "tgt_mask"),
                           mask(tgt_key_padding_mask, "tgt_key_padding_mask"),
                           int(bool(tgt_is_causal)), mask(memory_mask, "memory_mask"),
                           mask(memory_key_padding_mask, "memory_key_padding_mask"),
                           *self._options(seed))
        return self._result(out, like_torch)


def _torch_activation(layer):
    """The name of a torch layer's activation ("relu" or "gelu")."""
    act = getattr(layer, "activation", None)
    name = getattr(act, "__name__", None) or type(act).__name__.lower()
    return name
