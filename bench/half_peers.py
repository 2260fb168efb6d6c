#!/usr/bin/env python3
"""half_peers.py - mha's bf16 attention forward against its own float32 one
and against pip's PyTorch 2.x F.scaled_dot_product_attention on bf16 and
float32 tensors, interleaved in one run.

Letter legend: B batch, H heads, L query length = key length, d head dim.

Run with the Python of the virtual environment of bench/peers.py (torch >= 2.0;
not needed by `make test` or CI):

    /work/venv/st/bin/python bench/half_peers.py [--threads 2] [--rounds 3] [--reps 5]

Per case and round, in this order: `mha bench --dtype bf16 --json`, `mha bench
--dtype f32 --json` (mha's fastest kernel, validated against the reference),
torch SDPA on bf16 and on float32 tensors (B, H, L, d), each the median of
--reps calls after a warm-up; a case's figure is the median over rounds.
Prints ms and the ratios: mha f32 / mha bf16 (the issue's >= 1.8x) and
torch bf16 / mha bf16 (> 1: mha is faster).  Which bf16 products mha ran
(AMX tiles, vdpbf16ps loops, or widening) follows from the CPU: see
docs/performance.md.  FLOPs: 4*B*H*L*L*d, halved when causal.
"""
import argparse
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import mha_bench  # noqa: E402  (one mha invocation rule)
from compare_torch import median_ms  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# B H L d causal
CASES = [(1, 8, 2048, 64, False), (1, 8, 2048, 128, False), (1, 8, 4096, 64, False),
         (1, 8, 4096, 128, False), (1, 8, 4096, 64, True), (32, 12, 128, 32, False)]


def torch_ms(case, dtype, reps):
    B, H, L, d, causal = case
    g = torch.Generator().manual_seed(0)
    q, k, v = [torch.randn(B, H, L, d, generator=g).to(dtype) for _ in range(3)]
    with torch.no_grad():
        return median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), reps)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--mha", default=os.path.join(ROOT, os.environ.get("MHA_BUILD", "build"),
                                                  "mha"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {args.threads}, rounds {args.rounds}")
    print(f"{'case':<28} {'mha bf16':>9} {'mha f32':>9} {'torch bf16':>10} {'torch f32':>9}"
          f" {'f32/bf16':>8} {'torch bf16/mha bf16':>19} {'mha bf16 GFLOP/s':>16}")
    for case in CASES:
        B, H, L, d, causal = case
        runs = {"mb": [], "mf": [], "tb": [], "tf": []}
        for _ in range(args.rounds):
            for key, dt in (("mb", "bf16"), ("mf", "f32")):
                extra = ["--dtype", dt]
                runs[key].append(mha_bench(args.mha, case, args.threads, args.reps, extra)["ms"])
            runs["tb"].append(torch_ms(case, torch.bfloat16, args.reps))
            runs["tf"].append(torch_ms(case, torch.float32, args.reps))
        ms = {key: statistics.median(v) for key, v in runs.items()}
        flops = 4.0 * B * H * L * L * d / (2 if causal else 1)
        name = f"B{B} H{H} L{L} d{d}{' causal' if causal else ''}"
        print(f"{name:<28} {ms['mb']:>9.2f} {ms['mf']:>9.2f} {ms['tb']:>10.2f} {ms['tf']:>9.2f}"
              f" {ms['mf'] / ms['mb']:>8.2f} {ms['tb'] / ms['mb']:>19.2f}"
              f" {flops / (ms['mb'] * 1e6):>16.0f}", flush=True)


if __name__ == "__main__":
    main()
