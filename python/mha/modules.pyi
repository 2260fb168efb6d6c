from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Type, TypeVar, Union

import numpy as np

from .functional import Array, Kernel, MaskedRows

L = TypeVar("L", bound="_Layer")

class _Module:
    training: bool
    def train(self, mode: bool = ...) -> "_Module": ...
    def eval(self) -> "_Module": ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

class MultiheadAttention(_Module):
    embed_dim: int
    num_heads: int
    dropout: float
    add_zero_attn: bool
    batch_first: bool
    kdim: int
    vdim: int
    state: Dict[str, np.ndarray]
    def __init__(self, embed_dim: int, num_heads: int, dropout: float = ..., bias: bool = ...,
                 add_bias_kv: bool = ..., add_zero_attn: bool = ..., kdim: Optional[int] = ...,
                 vdim: Optional[int] = ..., batch_first: bool = ..., *,
                 state_dict: Mapping[str, Array] = ..., masked_rows: MaskedRows = ...,
                 kernel: Kernel = ...) -> None: ...
    @classmethod
    def from_torch(cls, module: Any, **kwargs: Any) -> "MultiheadAttention": ...
    def forward(self, query: Array, key: Array, value: Array,
                key_padding_mask: Optional[Array] = ..., need_weights: bool = ...,
                attn_mask: Optional[Array] = ..., average_attn_weights: bool = ...,
                is_causal: bool = ..., *, seed: Optional[int] = ...
                ) -> Tuple[Array, Optional[Array]]: ...

class _Layer(_Module):
    state: Dict[str, np.ndarray]
    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = ...,
                 dropout: float = ..., activation: Union[str, Callable[..., Any]] = ...,
                 layer_norm_eps: float = ..., batch_first: bool = ..., norm_first: bool = ...,
                 bias: bool = ..., *, state_dict: Mapping[str, Array] = ...,
                 masked_rows: MaskedRows = ..., kernel: Kernel = ...) -> None: ...
    @classmethod
    def from_torch(cls: Type[L], layer: Any, **kwargs: Any) -> L: ...

class TransformerEncoderLayer(_Layer):
    def forward(self, src: Array, src_mask: Optional[Array] = ...,
                src_key_padding_mask: Optional[Array] = ..., is_causal: bool = ..., *,
                seed: Optional[int] = ...) -> Array: ...

class TransformerDecoderLayer(_Layer):
    def forward(self, tgt: Array, memory: Array, tgt_mask: Optional[Array] = ...,
                memory_mask: Optional[Array] = ..., tgt_key_padding_mask: Optional[Array] = ...,
                memory_key_padding_mask: Optional[Array] = ..., tgt_is_causal: bool = ...,
                memory_is_causal: bool = ..., *, seed: Optional[int] = ...) -> Array: ...
