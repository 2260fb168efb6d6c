"""mha - multi-head attention and the Transformer layers of the mha C
library, with PyTorch's names and argument conventions, on NumPy arrays
and CPU torch tensors (zero-copy for float32), without the GIL.

    import numpy as np, mha
    q = k = v = np.random.rand(2, 4, 16, 8).astype(np.float32)   # (B,H,L,d)
    out = mha.scaled_dot_product_attention(q, k, v, is_causal=True)

    emb = mha.Embedder().encode(["a sentence", "another"])   # (2, 384) float32

mha.torch has the autograd Function (mha's fused backward) and the helper
that puts mha's attention into torch.nn.MultiheadAttention modules.
docs/python.md is the manual.
"""
from . import _mha
from ._arrays import copies
from .functional import (KVCache, attention_decode, load_safetensors, multi_head_attention,
                         onnx_attention, scaled_dot_product_attention)
from .modules import MultiheadAttention, TransformerDecoderLayer, TransformerEncoderLayer
from .embedder import Embedder, find_model_dir

__version__ = "0.3.0"
library_version = _mha.version


def set_num_threads(n):
    """Threads mha uses inside each call (0 = OpenMP's default); results do
    not depend on it.  Process-wide."""
    _mha.set_num_threads(n)


def get_num_threads():
    return _mha.get_num_threads()


def kernel_name(kernel="auto"):
    """The attention kernel a request resolves to on this CPU ("ref",
    "scalar", "avx2", "avx512"); MHA_KERNEL=ref|scalar|avx2|avx512 overrides
    "auto"."""
    from ._arrays import kernel_id
    return _mha.kernel_name(kernel_id(kernel))


__all__ = ["scaled_dot_product_attention", "multi_head_attention", "onnx_attention",
           "attention_decode", "KVCache", "MultiheadAttention", "TransformerEncoderLayer",
           "TransformerDecoderLayer", "Embedder", "find_model_dir", "load_safetensors", "copies", "set_num_threads",
           "get_num_threads", "kernel_name", "library_version"]
