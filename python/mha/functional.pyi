import os
from typing import Any, Dict, Literal, Optional, Tuple, Union

import numpy as np

Array = Any  # numpy.ndarray or a CPU torch.Tensor (float32; masks bool or float32;
            # scaled_dot_product_attention also float16 / torch.bfloat16)
Kernel = Literal["auto", "ref", "scalar", "avx2"]
MaskedRows = Literal["zero", "nan"]

def scaled_dot_product_attention(
    query: Array, key: Array, value: Array, attn_mask: Optional[Array] = ...,
    dropout_p: float = ..., is_causal: bool = ..., scale: Optional[float] = ...,
    enable_gqa: bool = ..., *, out: Optional[Array] = ..., seed: Optional[int] = ...,
    masked_rows: MaskedRows = ..., kernel: Kernel = ...) -> Array:
    """query (..., Hq, L, d), key (..., Hkv, S, d), value (..., Hkv, S, dv) -> (..., Hq, L, dv)."""

def multihead(state: Dict[str, np.ndarray], num_heads: int, query: Array, key: Array,
              value: Array, key_padding_mask: Optional[Array], need_weights: bool,
              attn_mask: Optional[Array], average_attn_weights: bool, is_causal: bool,
              batch_first: bool, training: bool, dropout_p: float, add_zero_attn: bool,
              seed: Optional[int], masked_rows: MaskedRows, kernel: Kernel,
              out: Optional[Array] = ...) -> Tuple[Array, Optional[Array]]: ...

def multi_head_attention(
    query: Array, key: Array, value: Array, embed_dim_to_check: int, num_heads: int,
    in_proj_weight: Optional[Array], in_proj_bias: Optional[Array], bias_k: Optional[Array],
    bias_v: Optional[Array], add_zero_attn: bool, dropout_p: float, out_proj_weight: Array,
    out_proj_bias: Optional[Array], training: bool = ..., key_padding_mask: Optional[Array] = ...,
    need_weights: bool = ..., attn_mask: Optional[Array] = ...,
    use_separate_proj_weight: bool = ..., q_proj_weight: Optional[Array] = ...,
    k_proj_weight: Optional[Array] = ..., v_proj_weight: Optional[Array] = ...,
    static_k: None = ..., static_v: None = ..., average_attn_weights: bool = ...,
    is_causal: bool = ..., *, batch_first: bool = ..., seed: Optional[int] = ...,
    masked_rows: MaskedRows = ..., kernel: Kernel = ...,
    out: Optional[Array] = ...) -> Tuple[Array, Optional[Array]]:
    """query (L,B,E) / (B,L,E) / (L,E) -> (out like query, weights (B,L,S) or (B,H,L,S) or None)."""

def onnx_attention(
    Q: Array, K: Array, V: Array, attn_mask: Optional[Array] = ...,
    past_key: Optional[Array] = ..., past_value: Optional[Array] = ...,
    nonpad_kv_seqlen: Optional[Array] = ..., *, is_causal: int = ...,
    scale: Optional[float] = ..., q_num_heads: int = ..., kv_num_heads: int = ...,
    softcap: float = ..., qk_matmul_output_mode: int = ..., softmax_precision: int = ...,
    left_window_size: int = ..., right_window_size: int = ...,
    kernel: Kernel = ...) -> Tuple[Array, Array, Array, Array]:
    """-> (Y, present_key (B,Hkv,T,d), present_value (B,Hkv,T,dv), qk_matmul_output (B,Hq,L,T))."""

class KVCache:
    batch: int
    kv_heads: int
    capacity: int
    head_dim: int
    value_dim: int
    window: int
    dtype: str
    def __init__(self, batch: int, kv_heads: int, capacity: int, head_dim: int,
                 value_dim: Optional[int] = ..., window: int = ...,
                 dtype: Any = ...) -> None: ...
    def append(self, key: Array, value: Array) -> None:
        """key (B,Hkv,n,d), value (B,Hkv,n,dv)."""
    def reset(self) -> None: ...
    @property
    def position(self) -> int: ...
    def __len__(self) -> int: ...

def attention_decode(query: Array, cache: KVCache, scale: Optional[float] = ...,
                     softcap: float = ..., *, out: Optional[Array] = ...,
                     return_lse: bool = ..., kernel: Kernel = ...) -> Any:
    """query (B,Hq,1,d) -> (B,Hq,1,dv) (and lse (B,Hq,1) with return_lse)."""

def load_safetensors(path: Union[str, bytes, os.PathLike]) -> Dict[str, np.ndarray]: ...
