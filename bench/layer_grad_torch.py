#!/usr/bin/python3
"""PyTorch autograd on the shapes of bench/layer_grad_bench.c.

    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/layer_grad_torch.py [threads]

nn.TransformerEncoderLayer / DecoderLayer (batch_first=True, GELU, dropout 0,
train() = the math path), float32; best of 5 after one warm-up: the no-grad
forward, the forward that records the graph, and backward(dY).  One JSON
line per case, same keys as the C bench.
"""
import json
import sys
import time

import torch
import torch.nn as nn

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
torch.set_num_threads(threads)
for B, L, S, E, H, F in ((4, 128, 128, 256, 8, 1024), (2, 512, 512, 256, 4, 1024),
                         (8, 64, 64, 512, 8, 2048)):
    for dec in (0, 1):
        for nf in (0, 1):
            kw = dict(d_model=E, nhead=H, dim_feedforward=F, dropout=0.0, activation="gelu",
                      batch_first=True, norm_first=bool(nf))
            m = (nn.TransformerDecoderLayer if dec else nn.TransformerEncoderLayer)(**kw).train()
            x = torch.randn(B, L, E, requires_grad=True)
            mem = torch.randn(B, S, E, requires_grad=True)
            mask = torch.triu(torch.full((L, L), float("-inf")), 1) if dec else None
            run = (lambda: m(x, mem, tgt_mask=mask)) if dec else (lambda: m(x))
            dy = torch.randn(B, L, E)
            best = [1e30, 1e30, 1e30]
            for rep in range(6):
                t0 = time.perf_counter()
                with torch.no_grad():
                    run()
                t1 = time.perf_counter()
                y = run()
                t2 = time.perf_counter()
                y.backward(dy)
                t3 = time.perf_counter()
                if rep:
                    best = [min(a, b) for a, b in zip(best, (t1 - t0, t2 - t1, t3 - t2))]
            ms = [1e3 * b for b in best]
            print(json.dumps({"op": ("decoder" if dec else "encoder") + "_layer_bwd_torch",
                              "norm_first": nf, "B": B, "L": L, "S": S, "E": E, "H": H, "F": F,
                              "threads": threads, "fwd_ms": round(ms[0], 3),
                              "fwd_train_ms": round(ms[1], 3), "bwd_ms": round(ms[2], 3),
                              "bwd_over_fwd": round(ms[2] / ms[0], 2)}), flush=True)
