#!/usr/bin/python3
"""Checks an `mha train` checkpoint from outside with PyTorch (1.13).

    train_pytorch.py DIR

Reads DIR/model.safetensors with a hand-written reader (Debian has no
`safetensors` package): 8-byte little-endian header length, JSON header
{name: {dtype, shape, data_offsets}, "__metadata__": {...}}, raw data.  Builds
the matching PyTorch module (docs/training.md), loads the tensors with a
STRICT load_state_dict (and the encoder.* subset strictly into a bare
nn.TransformerEncoder), then runs DIR/sample_tokens.npy through it and
compares with DIR/sample_logits.npy: max|y - ref| <= 1e-4 * max(1, max|ref|).
Also checks the optimizer file's names/shapes and metadata.
Prints "train-pytorch: N passed, N failed".
"""
import json
import struct
import sys

import numpy as np
import torch
import torch.nn as nn

passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what)


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    dt = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
    out = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        out[name] = torch.from_numpy(
            np.frombuffer(data[a:b], dtype=dt[h["dtype"]]).reshape(h["shape"]).copy())
    return out, meta


class Model(nn.Module):
    """The module whose state_dict names mha's checkpoint uses."""

    def __init__(self, V, T, E, H, F, N, norm_first, causal, activation, dropout, eps):
        super().__init__()
        self.causal = causal
        self.tok_emb = nn.Embedding(V, E)
        self.pos_emb = nn.Embedding(T, E)
        layer = nn.TransformerEncoderLayer(E, H, F, dropout, activation, layer_norm_eps=eps,
                                           batch_first=True, norm_first=norm_first)
        self.encoder = nn.TransformerEncoder(layer, N, norm=nn.LayerNorm(E, eps=eps)
                                             if norm_first else None, enable_nested_tensor=False)
        self.head = nn.Linear(E, V)

    def forward(self, tokens):
        T = tokens.shape[1]
        x = self.tok_emb(tokens) + self.pos_emb(torch.arange(T))
        mask = None
        if self.causal:
            mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
        return self.head(self.encoder(x, mask=mask))


def main():
    d = sys.argv[1]
    sd, meta = read_safetensors(d + "/model.safetensors")
    check("step" in meta and "seed" in meta, "metadata has step and seed: %s" % meta)
    acts = ["relu", "gelu", "gelu_tanh", "silu"]
    act = acts[int(meta["activation"])]
    if act not in ("relu", "gelu"):
        act = {"gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
               "silu": torch.nn.functional.silu}[act]
    m = Model(int(meta["vocab"]), int(meta["max_len"]), int(meta["dim"]), int(meta["heads"]),
              int(meta["ffn"]), int(meta["layers"]), bool(int(meta["norm_first"])),
              bool(int(meta["causal"])), act, float(meta["dropout"]),
              float(meta["layer_norm_eps"]))
    try:
        m.load_state_dict(sd, strict=True)
        check(True, "")
    except RuntimeError as e:
        check(False, "strict load_state_dict: %s" % e)
        return
    enc = {k[len("encoder."):]: v for k, v in sd.items() if k.startswith("encoder.")}
    bare = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(int(meta["dim"]), int(meta["heads"]), int(meta["ffn"]),
                                   batch_first=True, norm_first=bool(int(meta["norm_first"]))),
        int(meta["layers"]), norm=nn.LayerNorm(int(meta["dim"])) if int(meta["norm_first"])
        else None, enable_nested_tensor=False)
    try:
        bare.load_state_dict(enc, strict=True)
        check(True, "")
    except RuntimeError as e:
        check(False, "strict load_state_dict into nn.TransformerEncoder: %s" % e)
    m.train()  # the math path (dropout is 0 in the tests' runs, or eval below)
    if float(meta["dropout"]) > 0:
        m.eval()
    tokens = torch.from_numpy(np.load(d + "/sample_tokens.npy").astype(np.int64))
    ref = np.load(d + "/sample_logits.npy")
    with torch.no_grad():
        y = m(tokens).numpy()
    err = np.abs(y - ref).max() / max(1.0, np.abs(ref).max())
    check(err <= 1e-4, "logits of the loaded module vs mha's: error %.3g" % err)
    osd, ometa = read_safetensors(d + "/optimizer.safetensors")
    check(ometa.get("step") == meta["step"], "optimizer step %s vs %s" % (ometa.get("step"),
                                                                          meta["step"]))
    check(set(osd) == {"%s.%s" % (k, n) for n in sd for k in ("exp_avg", "exp_avg_sq")},
          "optimizer names are exp_avg.<param>, exp_avg_sq.<param>")
    check(all(osd["exp_avg_sq." + n].shape == sd[n].shape and
              float(osd["exp_avg_sq." + n].min()) >= 0 for n in sd),
          "exp_avg_sq shapes and signs")
    print("logits error %.3g" % err)


main()
print("train-pytorch: %d passed, %d failed" % (passed, failed))
