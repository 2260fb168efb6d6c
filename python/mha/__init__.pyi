from ._arrays import copies as copies
from .functional import (KVCache as KVCache, attention_decode as attention_decode,
                         load_safetensors as load_safetensors,
                         multi_head_attention as multi_head_attention,
                         onnx_attention as onnx_attention,
                         scaled_dot_product_attention as scaled_dot_product_attention)
from .functional import Kernel
from .embedder import Embedder as Embedder, find_model_dir as find_model_dir
from .modules import (MultiheadAttention as MultiheadAttention,
                      TransformerDecoderLayer as TransformerDecoderLayer,
                      TransformerEncoderLayer as TransformerEncoderLayer)

__version__: str
library_version: str

def set_num_threads(n: int) -> None: ...
def get_num_threads() -> int: ...
def kernel_name(kernel: Kernel = ...) -> str: ...
