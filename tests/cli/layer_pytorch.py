#!/usr/bin/python3
"""Random nn.TransformerEncoderLayer/DecoderLayer/stacks, not in the repo,
saved as safetensors (written here by hand: header JSON + raw F32) with .npy
inputs; prints one line per case: <dir> <mha forward args...>.
Usage: layer_pytorch.py OUTDIR SEED"""
import json, os, struct, sys
import numpy as np
import torch
import torch.nn as nn

def save_st(path, sd):
    header, blobs, off = {}, [], 0
    for k, v in sd.items():
        a = np.ascontiguousarray(v.detach().numpy().astype("<f4"))
        header[k] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes()); off += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h))); f.write(h)
        for b in blobs: f.write(b)

out, seed = sys.argv[1], int(sys.argv[2])
g = torch.Generator().manual_seed(seed)
rng = np.random.default_rng(seed)
cases = [("encoder", 0, 0, "relu", 1), ("encoder", 1, 1, "gelu", 1), ("decoder", 0, 1, "gelu", 1),
         ("decoder", 1, 0, "relu", 1), ("encoder", 1, 1, "relu", 2), ("decoder", 0, 1, "gelu", 3)]
for ci, (kind, nf, causal, act, nl) in enumerate(cases):
    H = int(rng.choice([1, 2, 3])); E = H * int(rng.integers(2, 6)); Fw = int(rng.integers(3, 20))
    B, L, S = int(rng.integers(1, 4)), int(rng.integers(1, 8)), int(rng.integers(1, 8))
    kw = dict(d_model=E, nhead=H, dim_feedforward=Fw, dropout=0.0, activation=act,
              batch_first=True, norm_first=bool(nf), layer_norm_eps=1e-5)
    lay = (nn.TransformerDecoderLayer if kind == "decoder" else nn.TransformerEncoderLayer)(**kw)
    if nl > 1:
        norm = nn.LayerNorm(E)
        mod = (nn.TransformerDecoder(lay, nl, norm=norm) if kind == "decoder"
               else nn.TransformerEncoder(lay, nl, norm=norm, enable_nested_tensor=False))
    else:
        mod = lay
    with torch.no_grad():
        for p in mod.parameters(): p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    mod.train()
    d = os.path.join(out, "c%d" % ci); os.makedirs(d)
    x = torch.randn(B, L, E, generator=g); np.save(d + "/x.npy", x.numpy())
    kpm = torch.rand(B, L, generator=g) < 0.3; kpm[:, 0] = False
    np.save(d + "/kpm.npy", kpm.numpy())
    cm = torch.triu(torch.ones(L, L, dtype=torch.bool), 1) if causal else None
    args = ["--layer", kind, "--weights", d + "/w.safetensors", "--heads", str(H), "--query",
            d + "/x.npy", "--key-padding-mask", d + "/kpm.npy", "--activation", act, "--out", d + "/y.npy"]
    if nf: args.append("--norm-first")
    if causal: args.append("--causal")
    if nl > 1: args += ["--num-layers", str(nl)]
    with torch.no_grad():
        if kind == "decoder":
            m = torch.randn(B, S, E, generator=g); np.save(d + "/m.npy", m.numpy())
            mk = torch.rand(B, S, generator=g) < 0.3; mk[:, 0] = False
            np.save(d + "/mk.npy", mk.numpy())
            args += ["--memory", d + "/m.npy", "--memory-key-padding-mask", d + "/mk.npy"]
            y = mod(x, m, tgt_mask=cm, tgt_key_padding_mask=kpm, memory_key_padding_mask=mk)
        else:
            y = (mod(x, mask=cm, src_key_padding_mask=kpm) if nl > 1
                 else mod(x, src_mask=cm, src_key_padding_mask=kpm))
    np.save(d + "/ref.npy", y.numpy())
    save_st(d + "/w.safetensors", mod.state_dict())
    print(d, " ".join(args))
