from typing import Any, Optional, Tuple

import torch

from .functional import Kernel, MaskedRows

class ScaledDotProductAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                attn_mask: Optional[torch.Tensor], opts: tuple) -> Any: ...
    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor, *unused: Any) -> Tuple[Any, ...]: ...

def scaled_dot_product_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = ..., dropout_p: float = ..., is_causal: bool = ...,
    scale: Optional[float] = ..., enable_gqa: bool = ..., *, seed: Optional[int] = ...,
    masked_rows: MaskedRows = ..., kernel: Kernel = ...) -> torch.Tensor:
    """query (..., Hq, L, d), key (..., Hkv, S, d), value (..., Hkv, S, dv) -> (..., Hq, L, dv)."""

def use_mha_attention(model: torch.nn.Module) -> torch.nn.Module: ...
