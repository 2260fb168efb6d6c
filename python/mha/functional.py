"""functional.py - the functions with PyTorch's names and arguments:
scaled_dot_product_attention (torch.nn.functional), multi_head_attention
(F.multi_head_attention_forward), onnx_attention (the ONNX Attention
operator), attention_decode (one step over a KVCache) and
load_safetensors.  Each takes NumPy arrays or CPU torch tensors and returns
the same kind; the work is one call into mha without the GIL.

Letters: B batch, H / Hq query heads, Hkv key/value heads, L query length,
S key length, E model width, d head dim, dv value head dim.
"""
import threading

import numpy as np

from . import _mha
from ._arrays import (attention_inputs, attention_mask, attention_output, call, count_copy,
                      f32, i64, is_torch, kernel_id, marked, mask, masked_rows_id, out_buffer,
                      seed_or_random, wrap)

_ndarray = np.ndarray
_float32 = np.float32
_F32 = np.dtype(np.float32)


def _torch_from_numpy(a):
    import torch
    return torch.from_numpy(a)


def _as4(x, name):
    """x (..., N, D) as a 4-D view (B', H, N, D): leading 1s added, or the
    leading dims merged (a counted copy only when NumPy cannot view them)."""
    nd = x.ndim
    if nd == 4:
        return x
    if nd < 2:
        raise ValueError("%s: shape %s, want (..., L, E) with at least 2 dims" % (name, x.shape))
    if nd < 4:
        return x[(None,) * (4 - nd)]
    y = x.reshape((-1,) + x.shape[-3:])
    if not np.shares_memory(x, y):
        count_copy()
    return y


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *, out=None,
                                 seed=None, masked_rows="zero", kernel="auto"):
    """torch.nn.functional.scaled_dot_product_attention on mha.

    query (..., Hq, L, d), key (..., Hkv, S, d), value (..., Hkv, S, dv)
    -> (..., Hq, L, dv).  Any rank 2..4 (more: the leading dims are merged);
    the leading dims of the three must match.  Hq != Hkv needs
    enable_gqa=True: query head h reads kv head h // (Hq / Hkv).

    attn_mask: broadcastable to (..., Hq, L, S); bool True = attend (torch's
    polarity), float32 added to the scores.  is_causal: key j masked when
    j > i (top-left, as torch); mha also combines it with attn_mask.
    scale: default 1/sqrt(d).  dropout_p > 0 drops attention weights with
    mha's counter-based generator (seed: a 64-bit int, random when None).
    A query row whose every key is masked gives 0 (masked_rows="zero",
    FlashAttention/ONNX) or NaN ("nan").  out: an array of the output's
    shape and dtype to write into (returned).  kernel: "auto", "ref",
    "scalar", "avx2" or "avx512".

    Dtypes: float32, float16 (NumPy or torch) or torch.bfloat16, the same
    for query, key and value (else ValueError, torch's rule); the result has
    that dtype.  Half inputs are read in place by mha's half path (float32
    products and softmax, P rounded to value's dtype before P.V, the output
    rounded once).  attn_mask: bool or float32, or for half inputs also a
    float mask of their dtype (as torch; widened to float32, a counted copy).
    """
    like_torch = False
    q, k, v = query, key, value
    dtype = "float32"
    if (type(q) is not _ndarray or type(k) is not _ndarray or type(v) is not _ndarray
            or q.dtype is not _F32 or k.dtype is not _F32 or v.dtype is not _F32):
        like_torch = is_torch(query)
        q, k, v, dtype = attention_inputs(query, key, value)
    nd = q.ndim
    if not (nd == k.ndim == v.ndim):
        raise ValueError("query, key, value: ranks %d, %d, %d differ" % (nd, k.ndim, v.ndim))
    shape = q.shape[:-1] + v.shape[-1:]
    if nd != 4:
        q, k, v = _as4(q, "query"), _as4(k, "key"), _as4(v, "value")
    if q.shape[1] != k.shape[1] and not enable_gqa:
        raise ValueError("key: %d heads but query has %d; pass enable_gqa=True for grouped-"
                         "query attention" % (k.shape[1], q.shape[1]))
    half = dtype != "float32"
    if half or (out is not None and type(out) is not _ndarray):
        returned, result = attention_output(shape, dtype, like_torch, out)
    else:
        result = np.empty(shape, _float32) if out is None else out_buffer(out, shape)
        returned = out if out is not None else _torch_from_numpy(result) if like_torch else result
    m = attn_mask
    if m is not None:
        m = attention_mask(m, "attn_mask", dtype)
        if m.ndim > 4:
            m = _as4(m, "attn_mask")
    rows = 0 if masked_rows == "zero" else masked_rows_id(masked_rows)
    kid = 0 if kernel == "auto" else kernel_id(kernel)
    o = result if nd == 4 else _as4(result, "out")
    if half:
        o, q, k, v = marked(dtype, o, q, k, v)
    args = (o, q, k, v, m, 0, None, 0, 1 if is_causal else 0, scale, dropout_p,
            seed_or_random(seed) if dropout_p else 0, rows, None, None, kid)
    try:  # call() inlined: this is the per-call floor (bench/python_bench.py)
        _mha.sdpa(*args)
    except _mha.LayoutError:
        call(_mha.sdpa, *args)
    return returned


def _seq_first(x, batch_first):
    """(L,B,E) -> the (B,L,E) view mha reads; batch-first and unbatched
    inputs as they are."""
    if x.ndim == 3 and not batch_first:
        return x.swapaxes(0, 1)
    return x


def multihead(state, num_heads, query, key, value, key_padding_mask, need_weights, attn_mask,
              average_attn_weights, is_causal, batch_first, training, dropout_p, add_zero_attn,
              seed, masked_rows, kernel, out=None):
    """The forward shared by multi_head_attention and MultiheadAttention:
    state is a dict of float32 arrays under nn.MultiheadAttention's names."""
    like_torch = is_torch(query)
    q = f32(query, "query")
    k = q if key is query else f32(key, "key")
    v = q if value is query else k if value is key else f32(value, "value")
    if q.ndim not in (2, 3):
        raise ValueError("query: shape %s, want (L,E), (L,B,E) or with batch_first (B,L,E)"
                         % (q.shape,))
    qb = _seq_first(q, batch_first)
    kb = qb if k is q else _seq_first(k, batch_first)
    vb = qb if v is q else kb if v is k else _seq_first(v, batch_first)
    if out is None:
        result = np.empty(q.shape, np.float32)
    else:
        result = out_buffer(out, q.shape)
    w = None
    if need_weights:
        S = kb.shape[-2] + ("bias_k" in state) + bool(add_zero_attn)
        lead = qb.shape[:-2]
        L = qb.shape[-2]
        w = np.empty(lead + ((L, S) if average_attn_weights else (num_heads, L, S)), np.float32)
    call(_mha.multihead, _seq_first(result, batch_first), qb, kb, vb, state, num_heads,
                   int(bool(add_zero_attn)), mask(key_padding_mask, "key_padding_mask"),
                   mask(attn_mask, "attn_mask"), int(bool(is_causal)),
                   masked_rows_id(masked_rows), w, int(bool(average_attn_weights)),
                   int(bool(training and dropout_p > 0)), float(dropout_p),
                   seed_or_random(seed) if training and dropout_p else 0, kernel_id(kernel))
    return (out if out is not None else wrap(result, like_torch)), wrap(w, like_torch)


def multi_head_attention(query, key, value, embed_dim_to_check, num_heads, in_proj_weight,
                         in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p,
                         out_proj_weight, out_proj_bias, training=True, key_padding_mask=None,
                         need_weights=True, attn_mask=None, use_separate_proj_weight=False,
                         q_proj_weight=None, k_proj_weight=None, v_proj_weight=None,
                         static_k=None, static_v=None, average_attn_weights=True,
                         is_causal=False, *, batch_first=False, seed=None, masked_rows="nan",
                         kernel="auto", out=None):
    """torch.nn.functional.multi_head_attention_forward on mha.

    query (L,B,E), key (S,B,kdim), value (S,B,vdim) (batch_first=True:
    (B,L,E) ...; unbatched (L,E) ...) -> (attn_output (L,B,E),
    attn_output_weights (B,L,S) averaged or (B,H,L,S) per head, or None).
    Weights in PyTorch's layout: in_proj_weight (3E,E) or, with
    use_separate_proj_weight, q/k/v_proj_weight (E,E) (E,kdim) (E,vdim);
    in_proj_bias (3E); out_proj_weight (E,E); out_proj_bias (E); bias_k,
    bias_v (1,1,E) or None.  Masks with MHA's polarity: bool True =
    masked, float added; key_padding_mask (B,S); attn_mask (L,S) or
    (B*H,L,S).  is_causal applies tril(ones(L,S)) (combined with masks).
    Fully masked rows give NaN as PyTorch 1.13 (masked_rows="nan") or 0.
    Dropout (training and dropout_p > 0) uses mha's generator (seed).
    static_k/static_v are not supported (NotImplementedError).
    """
    if static_k is not None or static_v is not None:
        raise NotImplementedError("static_k/static_v: not supported by mha")
    if query.shape[-1] != embed_dim_to_check:
        raise ValueError("query: width %d, but embed_dim_to_check is %d"
                         % (query.shape[-1], embed_dim_to_check))
    named = {"in_proj_bias": in_proj_bias, "out_proj.weight": out_proj_weight,
             "out_proj.bias": out_proj_bias, "bias_k": bias_k, "bias_v": bias_v}
    if use_separate_proj_weight:
        named.update(q_proj_weight=q_proj_weight, k_proj_weight=k_proj_weight,
                     v_proj_weight=v_proj_weight)
    else:
        named["in_proj_weight"] = in_proj_weight
    state = {n: f32(t, n) for n, t in named.items() if t is not None}
    return multihead(state, num_heads, query, key, value, key_padding_mask, need_weights,
                     attn_mask, average_attn_weights, is_causal, batch_first, training,
                     dropout_p, add_zero_attn, seed, masked_rows, kernel, out)


def onnx_attention(Q, K, V, attn_mask=None, past_key=None, past_value=None,
                   nonpad_kv_seqlen=None, *, is_causal=0, scale=None, q_num_heads=0,
                   kv_num_heads=0, softcap=0.0, qk_matmul_output_mode=0, softmax_precision=0,
                   left_window_size=-1, right_window_size=-1, kernel="auto"):
    """The ONNX Attention operator (opsets 23-25, onnx 1.23), attributes as
    keywords.  Q (B,Hq,L,d), K (B,Hkv,S,d), V (B,Hkv,S,dv), or 3-D
    (B,L,Hq*d) ... with q_num_heads/kv_num_heads; attn_mask bool (True =
    attend), float32 or int64 (added), broadcast to (B,Hq,L,T); past_key
    (B,Hkv,P,d) and past_value (B,Hkv,P,dv) together; nonpad_kv_seqlen (B)
    int64.  Returns (Y (B,Hq,L,dv) or (B,L,Hq*dv), present_key (B,Hkv,T,d),
    present_value (B,Hkv,T,dv), qk_matmul_output (B,Hq,L,T)), T = P + S.
    """
    like_torch = is_torch(Q)
    ins = (f32(Q, "Q"), f32(K, "K"), f32(V, "V"),
           mask(attn_mask, "attn_mask", extra=(np.int64,)),
           None if past_key is None else f32(past_key, "past_key"),
           None if past_value is None else f32(past_value, "past_value"),
           i64(nonpad_kv_seqlen, "nonpad_kv_seqlen"))
    opts = (int(bool(is_causal)), scale, int(q_num_heads), int(kv_num_heads), float(softcap),
            int(qk_matmul_output_mode), int(softmax_precision), int(left_window_size),
            int(right_window_size), kernel_id(kernel))
    shapes = call(_mha.onnx_attention_shapes, *ins, *opts)
    outs = [np.empty(s, np.float32) for s in shapes]
    call(_mha.onnx_attention, *outs, *ins, *opts)
    return tuple(wrap(o, like_torch) for o in outs)


class KVCache:
    """A KV cache for autoregressive decoding (mha_kv_cache): per batch row
    up to `capacity` keys (B,Hkv,capacity,d) and values (B,Hkv,capacity,dv),
    allocated once.  window in 1..capacity keeps the last `window` keys
    (sliding-window attention) and never fills; window=0 keeps every key and
    an append past capacity raises ValueError.  dtype is the storage of
    keys and values: "float32", or "bfloat16" / "float16" for half the memory
    (append rounds to nearest even; decode reads the half values, computes in
    float32 and rounds P to dtype before P.V).  Safe to share between
    threads (calls on one cache are serialised)."""

    _DTYPES = {"float32": 0, "float16": 2, "bfloat16": 4}

    def __init__(self, batch, kv_heads, capacity, head_dim, value_dim=None, window=0,
                 dtype="float32"):
        dv = head_dim if value_dim is None else value_dim
        name = str(dtype).replace("torch.", "")
        if name not in self._DTYPES:
            raise ValueError(f"dtype: {dtype!r}, want 'float32', 'bfloat16' or 'float16'")
        self._cache = _mha.kv_cache_create(int(batch), int(kv_heads), int(capacity),
                                           int(head_dim), int(dv), int(window),
                                           self._DTYPES[name])
        self.dtype = name
        self.batch, self.kv_heads, self.capacity = int(batch), int(kv_heads), int(capacity)
        self.head_dim, self.value_dim, self.window = int(head_dim), int(dv), int(window)
        self._lock = threading.Lock()

    def append(self, key, value):
        """Appends n steps: key (B,Hkv,n,d), value (B,Hkv,n,dv) (copied in)."""
        k, v = f32(key, "key"), f32(value, "value")
        with self._lock:
            call(_mha.kv_cache_append, self._cache, k, v)

    def reset(self):
        """Forgets every key; keeps the memory."""
        with self._lock:
            _mha.kv_cache_reset(self._cache)

    @property
    def position(self):
        """Tokens appended since creation or reset."""
        return _mha.kv_cache_info(self._cache)[0]

    def __len__(self):
        """Keys held now (<= window when sliding)."""
        return _mha.kv_cache_info(self._cache)[1]


def attention_decode(query, cache, scale=None, softcap=0.0, *, out=None, return_lse=False,
                     kernel="auto"):
    """One decode step: query (B,Hq,1,d) attends over every key in cache
    (append the new token's key first) -> (B,Hq,1,dv), equal to the last row
    of a causal SDPA over the whole sequence.  Hq a multiple of Hkv (GQA;
    K/V never replicated).  return_lse: also the (B,Hq,1) log-sum-exp."""
    like_torch = is_torch(query)
    q = f32(query, "query")
    if q.ndim != 4:
        raise ValueError("query: shape %s, want (B,Hq,1,d)" % (q.shape,))
    shape = q.shape[:3] + (cache.value_dim,)
    result = np.empty(shape, np.float32) if out is None else out_buffer(out, shape)
    lse = np.empty(q.shape[:3], np.float32) if return_lse else None
    with cache._lock:
        call(_mha.attention_decode, result, q, cache._cache, scale, float(softcap), lse,
                              kernel_id(kernel))
    o = out if out is not None else wrap(result, like_torch)
    return (o, wrap(lse, like_torch)) if return_lse else o


def load_safetensors(path):
    """The tensors of a .safetensors file as {name: float32 ndarray}, read by
    mha's hostile-input-proof parser (OSError for a missing, unreadable or
    malformed file)."""
    return {name: np.frombuffer(raw, np.float32).reshape(shape)
            for name, shape, raw in _mha.safetensors_load(path)}
