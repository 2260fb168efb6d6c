#!/usr/bin/python3
"""grad_layer_pytorch.py MHA SEED - `mha grad --layer` against fresh random
PyTorch layers and stacks (--num-layers).

For encoder and decoder layers (post- and pre-norm, relu/gelu, masks, causal,
unbatched, --prefix) draws a random nn.TransformerEncoderLayer /
DecoderLayer (batch_first=True, dropout 0, train() = PyTorch's math path),
inputs and an upstream gradient dY that are not in the repository, runs
`mha grad --layer`, and checks every written tensor against float64
autograd: max|g - ref| <= 1e-4 * max(1, max|ref|), and that the names in
grad_weights.safetensors are exactly the module's parameters (prefixed).
Prints one FAIL line per failure and "grad-layer-pytorch: N passed, N failed".
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grad_pytorch import load_st, rel_err, save_st  # noqa: E402


def main():
    mha, seed = sys.argv[1], int(sys.argv[2])
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    passed = failed = 0
    configs = []
    for dec in (0, 1):
        for nf in (0, 1):
            for act in ("relu", "gelu"):
                configs.append(dict(dec=dec, nf=nf, act=act))
            configs.append(dict(dec=dec, nf=nf, act="relu", causal=1, kpm=1))
            configs.append(dict(dec=dec, nf=nf, act="gelu", am="float", unbatched=1))
    configs.append(dict(dec=1, nf=0, act="relu", mm=1, mkpm=1, prefix="decoder.layers.0."))
    configs.append(dict(dec=0, nf=1, act="gelu", am="bool", prefix="encoder.layers.3."))
    # stacks (--num-layers): nn.TransformerEncoder / Decoder, with and without a final norm
    configs.append(dict(dec=0, nf=1, act="gelu", stack=2, final_norm=1, kpm=1, prefix="encoder."))
    configs.append(dict(dec=1, nf=0, act="relu", stack=3, final_norm=0, causal=1))
    configs.append(dict(dec=1, nf=1, act="gelu", stack=2, final_norm=1, mm=1))
    for i, c in enumerate(configs):
        E_H = [(6, 2), (9, 3), (12, 4), (10, 5), (8, 1)]
        E, H = E_H[rng.integers(len(E_H))]
        Fw, B, L, S = (int(rng.integers(3, 20)), int(rng.integers(1, 4)),
                       int(rng.integers(1, 7)), int(rng.integers(1, 8)))
        kw = dict(d_model=E, nhead=H, dim_feedforward=Fw, dropout=0.0, activation=c["act"],
                  batch_first=True, norm_first=bool(c["nf"]))
        m = (nn.TransformerDecoderLayer if c["dec"] else nn.TransformerEncoderLayer)(**kw)
        if c.get("stack"):
            norm = nn.LayerNorm(E) if c["final_norm"] else None
            m = (nn.TransformerDecoder(m, c["stack"], norm=norm) if c["dec"] else
                 nn.TransformerEncoder(m, c["stack"], norm=norm, enable_nested_tensor=False))
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn(p.shape) * 0.5)
        m = m.double().train()
        ub = c.get("unbatched", 0)
        x = torch.randn((L, E) if ub else (B, L, E)).float()
        mem = torch.randn((S, E) if ub else (B, S, E)).float()
        args = {}
        am = None
        if c.get("am") == "float":
            am = torch.randn(L, L)
        elif c.get("am") == "bool":
            am = torch.rand(L, L) < 0.3
            am[:, 0] = False
        run_am = am
        if c.get("causal"):
            cm = torch.triu(torch.full((L, L), float("-inf")), 1)
            run_am = cm if am is None else am + cm
        kpm = None
        if c.get("kpm"):
            kpm = torch.rand((L,) if ub else (B, L)) < 0.3
            kpm[..., 0] = False
        mm = mkpm = None
        if c.get("mm"):
            mm = torch.rand(L, S) < 0.3
            mm[:, 0] = False
        if c.get("mkpm"):
            mkpm = torch.rand((S,) if ub else (B, S)) < 0.3
            mkpm[..., 0] = False
        dbl = lambda t: t.double() if t is not None and t.dtype != torch.bool else t
        xd = x.double().requires_grad_(True)
        md = mem.double().requires_grad_(True)
        if c["dec"]:
            y = m(xd, md, tgt_mask=dbl(run_am), tgt_key_padding_mask=kpm, memory_mask=mm,
                  memory_key_padding_mask=mkpm)
        elif c.get("stack"):
            y = m(xd, mask=dbl(run_am), src_key_padding_mask=kpm)
        else:
            y = m(xd, src_mask=dbl(run_am), src_key_padding_mask=kpm)
        dy = torch.randn(y.shape).float()
        (y * dy.double()).sum().backward()
        prefix = c.get("prefix", "")
        with tempfile.TemporaryDirectory() as t:
            save_st(t + "/w.safetensors", {prefix + k: v.detach().float().numpy()
                                           for k, v in m.named_parameters()})
            np.save(t + "/x.npy", x.numpy())
            np.save(t + "/dy.npy", dy.numpy())
            cmd = [mha, "grad", "--layer", "decoder" if c["dec"] else "encoder", "--weights",
                   t + "/w.safetensors", "--heads", str(H), "--query", t + "/x.npy",
                   "--grad-out", t + "/dy.npy", "--out-dir", t + "/out", "--activation",
                   c["act"]]
            if prefix:
                cmd += ["--prefix", prefix]
            if c.get("stack"):
                cmd += ["--num-layers", str(c["stack"])]
            if c["nf"]:
                cmd.append("--norm-first")
            if c.get("causal"):
                cmd.append("--causal")
            if c["dec"]:
                np.save(t + "/m.npy", mem.numpy())
                cmd += ["--memory", t + "/m.npy"]
            for flag, arr in (("--attn-mask", am), ("--key-padding-mask", kpm),
                              ("--memory-mask", mm), ("--memory-key-padding-mask", mkpm)):
                if arr is not None:
                    np.save(t + "/" + flag[2:] + ".npy", arr.numpy())
                    cmd += [flag, t + "/" + flag[2:] + ".npy"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            tag = "case %d %s" % (i, c)
            if r.returncode != 0:
                print("FAIL %s: exit %d: %s" % (tag, r.returncode, r.stderr.strip()))
                failed += 1
                continue
            checks = [("grad_query", np.load(t + "/out/grad_query.npy"), xd.grad.numpy())]
            if c["dec"]:
                checks.append(("grad_memory", np.load(t + "/out/grad_memory.npy"),
                               md.grad.numpy()))
            gw = load_st(t + "/out/grad_weights.safetensors")
            want = {prefix + k for k, _ in m.named_parameters()}
            if set(gw) != want:
                print("FAIL %s: names %s, want %s" % (tag, sorted(set(gw) ^ want), ""))
                failed += 1
            for k, p in m.named_parameters():
                if prefix + k in gw:
                    checks.append((k, gw[prefix + k], p.grad.numpy()))
            for name, got, ref in checks:
                e = rel_err(got, ref)
                if got.shape == ref.shape and e <= 1e-4:
                    passed += 1
                else:
                    print("FAIL %s %s: error %.3g shape %s vs %s" % (tag, name, e, got.shape,
                                                                     ref.shape))
                    failed += 1
    print("grad-layer-pytorch: %d passed, %d failed" % (passed, failed))


main()
