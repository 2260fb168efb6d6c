#!/usr/bin/python3
"""compare_torch.py - PyTorch baselines for `mha bench`, same shapes and threads.

Letter legend: B batch, H heads, L query length, S key length, d head dim,
E = H*d model width.

Times, in fp32 on the CPU, median of --reps runs after one warm-up:
  unfused   softmax(q k^T * scale [+ causal mask]) v  (what PyTorch 1.13 runs)
  sdpa      F.scaled_dot_product_attention, when this torch has it (>= 2.0)
  mha       nn.MultiheadAttention(E, H, batch_first=True) self-attention,
            need_weights=False
Prints one JSON object per line with the fields of `mha bench --json`
(op, kernel, B, H, Hkv, L, S, d, causal, threads, ms, gflops).  FLOPs:
attention 4*B*H*L*S*d (halved when causal), projections 2*M*N*K per GEMM.
Cases whose L x L score buffer would pass --max-score-gib are skipped.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def median_ms(fn, reps):
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def emit(op, kernel, B, H, L, d, causal, threads, ms, flops):
    print(json.dumps({"op": op, "kernel": kernel, "B": B, "H": H, "Hkv": H, "L": L, "S": L,
                      "d": d, "causal": causal, "threads": threads, "ms": round(ms, 4),
                      "gflops": round(flops / (ms * 1e6), 2), "torch": torch.__version__}),
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mha", action="store_true", help="time nn.MultiheadAttention only")
    ap.add_argument("--max-score-gib", type=float, default=4.0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    B, H, L, d = a.batch, a.heads, a.seq, a.head_dim
    E = H * d
    attn_flops = 4.0 * B * H * L * L * d / (2.0 if a.causal else 1.0)
    score_gib = 4.0 * B * H * L * L / 2**30
    if score_gib > a.max_score_gib:
        print(f"compare_torch: skip L={L}: scores need {score_gib:.1f} GiB", file=sys.stderr)
        return 0
    mask = None
    if a.causal:
        mask = torch.full((L, L), float("-inf")).triu(1)
    with torch.no_grad():
        if not a.mha:
            q = torch.randn(B, H, L, d)
            k = torch.randn(B, H, L, d)
            v = torch.randn(B, H, L, d)
            scale = 1.0 / math.sqrt(d)

            def unfused():
                s = torch.matmul(q, k.transpose(-2, -1)) * scale
                if mask is not None:
                    s = s + mask
                return torch.matmul(torch.softmax(s, dim=-1), v)

            emit("attention", "torch_unfused", B, H, L, d, a.causal, a.threads,
                 median_ms(unfused, a.reps), attn_flops)
            if hasattr(F, "scaled_dot_product_attention"):
                ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v,
                                                                      is_causal=a.causal),
                               a.reps)
                emit("attention", "torch_sdpa", B, H, L, d, a.causal, a.threads, ms, attn_flops)
        else:
            m = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
            x = torch.randn(B, L, E)
            amask = None
            if a.causal:
                amask = torch.ones(L, L, dtype=torch.bool).triu(1)  # True = masked
            ms = median_ms(lambda: m(x, x, x, need_weights=False, attn_mask=amask), a.reps)
            flops = attn_flops + 2.0 * B * L * 3 * E * E + 2.0 * B * L * E * E
            emit("mha", "torch_mha", B, H, L, d, a.causal, a.threads, ms, flops)
    return 0


if __name__ == "__main__":
    sys.exit(main())
