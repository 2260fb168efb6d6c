#!/usr/bin/env python3
"""peers.py - mha against pip's PyTorch 2.x and ONNX Runtime, interleaved in one run.

Letter legend: B batch, H query heads, Hkv kv heads, L query length, S key
length (= L), d head dim, E = H*d model width.

Run with the Python of a virtual environment holding torch >= 2.0,
onnxruntime and onnx (not needed by `make test` or CI; see docs/performance.md):

    python3 -m venv /work/venv/st
    /work/venv/st/bin/pip install torch onnxruntime onnx   # several GB of CUDA wheels
    /work/venv/st/bin/python bench/peers.py [--threads 2] [--rounds 3] [--cases default]
        [--kernel avx2 --kernel avx512]   # mha's kernels side by side (default: auto)

For each case and each of --rounds rounds, in this order: `mha bench --json`
(the fused kernel, validated against the reference; forward, --backward,
--mha), then torch's F.scaled_dot_product_attention (forward; backward alone
through torch.autograd.grad on a kept graph), nn.MultiheadAttention
(need_weights=False, eval), and ONNX Runtime's com.microsoft MultiHeadAttention
(a one-node model built with onnx.helper; inputs (B,L,H*d)).  Each timing is
the median of --reps calls after a warm-up; a case's figure is the median over
rounds.  Prints a table of ms and the ratios peer_ms / mha_ms (> 1: mha is
faster) and, with --json, one JSON line per case and side.  Same threads
everywhere: mha --threads, torch.set_num_threads, ORT intra_op_num_threads.
FLOPs: attention 4*B*H*L*S*d (halved when causal), backward counted as 2.5x
the forward, projections 2*M*N*K.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_torch import median_ms  # noqa: E402  (one timing rule for both scripts)

# B H L d causal (the grid: long sequences, the short-sequence
# embedding workload B=32 L=128 H=12 d=32, and B=8 L=512 d=64)
DEFAULT_CASES = [
    (1, 8, 1024, 64, False), (1, 8, 2048, 64, False), (1, 8, 4096, 64, False),
    (1, 8, 1024, 128, False), (1, 8, 2048, 128, False),
    (1, 8, 2048, 64, True), (1, 8, 4096, 64, True),
    (32, 12, 128, 32, False), (8, 8, 512, 64, False),
]
QUICK_CASES = [(1, 8, 1024, 64, False), (1, 8, 1024, 64, True), (32, 12, 128, 32, False)]


def mha_bench(mha, case, threads, reps, extra):
    B, H, L, d, causal = case
    cmd = [mha, "bench", "--batch", str(B), "--heads", str(H), "--seq", str(L), "--head-dim",
           str(d), "--threads", str(threads), "--reps", str(reps), "--json"] + extra
    if causal:
        cmd.append("--causal")
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


class TorchPeer:
    def __init__(self, torch, case):
        self.torch = torch
        F = torch.nn.functional
        B, H, L, d, causal = case
        g = torch.Generator().manual_seed(0)
        self.q, self.k, self.v = (torch.randn(B, H, L, d, generator=g) for _ in range(3))
        self.causal = causal
        self.sdpa = lambda: F.scaled_dot_product_attention(self.q, self.k, self.v,
                                                            is_causal=causal)
        qg, kg, vg = (t.clone().requires_grad_(True) for t in (self.q, self.k, self.v))
        self.graph_out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        self.grad_in = (qg, kg, vg)
        self.dout = torch.randn(self.graph_out.shape, generator=g)
        E = H * d
        self.module = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
        self.x = torch.randn(B, L, E, generator=g)
        self.amask = torch.ones(L, L, dtype=torch.bool).triu(1) if causal else None

    def forward(self, reps):
        with self.torch.no_grad():
            return median_ms(self.sdpa, reps)

    def backward(self, reps):
        return median_ms(lambda: self.torch.autograd.grad(self.graph_out, self.grad_in, self.dout,
                                                          retain_graph=True), reps)

    def module_forward(self, reps):
        with self.torch.no_grad():
            return median_ms(lambda: self.module(self.x, self.x, self.x, need_weights=False,
                                                 attn_mask=self.amask,
                                                 is_causal=False), reps)


class OrtPeer:
    """com.microsoft MultiHeadAttention, one node: query/key/value (B,L,H*d)."""

    def __init__(self, ort, onnx, np, case, threads):
        B, H, L, d, causal = case
        E = H * d
        h = onnx.helper
        f32 = onnx.TensorProto.FLOAT
        attrs = {"num_heads": H}
        if causal:
            attrs["unidirectional"] = 1
        node = h.make_node("MultiHeadAttention", ["query", "key", "value"], ["output"],
                           domain="com.microsoft", **attrs)
        graph = h.make_graph([node], "mha_peer",
                             [h.make_tensor_value_info(n, f32, [B, L, E])
                              for n in ("query", "key", "value")],
                             [h.make_tensor_value_info("output", f32, [B, L, E])])
        model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17),
                                                   h.make_opsetid("com.microsoft", 1)])
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.sess = ort.InferenceSession(model.SerializeToString(), so,
                                         providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        self.feed = {n: rng.standard_normal((B, L, E), dtype=np.float32)
                     for n in ("query", "key", "value")}

    def forward(self, reps):
        return median_ms(lambda: self.sess.run(None, self.feed), reps)


def parse_cases(text):
    if text == "default":
        return DEFAULT_CASES
    if text == "quick":
        return QUICK_CASES
    cases = []
    for item in text.split(";"):
        B, H, L, d, c = item.split()
        cases.append((int(B), int(H), int(L), int(d), c == "1"))
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cases", default="default",
                    help='"default", "quick" or "B H L d causal; ..." (causal 0/1)')
    ap.add_argument("--mha", default=os.path.join(ROOT, os.environ.get("MHA_BUILD", "build"),
                                                   "mha"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--kernel", action="append", default=None,
                    help="mha's attention kernel (auto, avx2, avx512; repeat to time several "
                         "side by side, e.g. --kernel avx2 --kernel avx512); default auto")
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(a.threads))
    try:
        import numpy as np
        import onnx
        import onnxruntime as ort
        import torch
    except ImportError as e:
        print("peers.py: %s (run it with the virtual environment's python: see the "
              "docstring)" % e, file=sys.stderr)
        return 2
    if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        print("peers.py: torch %s has no scaled_dot_product_attention (need >= 2.0)"
              % torch.__version__, file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    print("# mha %s vs torch %s, onnxruntime %s; %d threads, %d rounds x %d reps; %s"
          % (a.mha, torch.__version__, ort.__version__, a.threads, a.rounds, a.reps,
             os.uname().machine))
    hdr = ("case", "mha fwd", "sdpa", "ort", "mha bwd", "sdpa bwd", "mha MHA", "nn.MHA",
           "sdpa/mha", "ort/mha", "bwd/mha", "MHA/mha", "GF/s", "bwd/fwd")
    print("%-30s" % hdr[0] + "".join("%9s" % x for x in hdr[1:]))
    for case in parse_cases(a.cases):
        B, H, L, d, causal = case
        tp, op = TorchPeer(torch, case), OrtPeer(ort, onnx, np, case, a.threads)
        kernels = a.kernel or ["auto"]
        runs = {k: [] for k in ("sdpa", "sdpa_bwd", "nn_mha", "ort")}
        for kern in kernels:
            for k in ("mha", "mha_bwd", "mha_mha"):
                runs[(kern, k)] = []
        for _ in range(a.rounds):
            for kern in kernels:  # mha's kernels interleaved with the peers in each round
                kx = [] if kern == "auto" else ["--kernel", kern]
                runs[(kern, "mha")].append(mha_bench(a.mha, case, a.threads, a.reps, kx)["ms"])
                runs[(kern, "mha_bwd")].append(
                    mha_bench(a.mha, case, a.threads, a.reps, kx + ["--backward"])["ms"])
                runs[(kern, "mha_mha")].append(
                    mha_bench(a.mha, case, a.threads, a.reps, kx + ["--mha"])["ms"])
            runs["sdpa"].append(tp.forward(a.reps))
            runs["sdpa_bwd"].append(tp.backward(a.reps))
            runs["nn_mha"].append(tp.module_forward(a.reps))
            runs["ort"].append(op.forward(a.reps))
        flops = 4.0 * B * H * L * L * d / (2.0 if causal else 1.0)
        for kern in kernels:
            med = {k: statistics.median(runs[k]) for k in ("sdpa", "sdpa_bwd", "nn_mha", "ort")}
            for k in ("mha", "mha_bwd", "mha_mha"):
                med[k] = statistics.median(runs[(kern, k)])
            name = "B%d H%d L%d d%d%s%s" % (B, H, L, d, " causal" if causal else "",
                                            "" if kern == "auto" else " " + kern)
            row = [med["mha"], med["sdpa"], med["ort"], med["mha_bwd"], med["sdpa_bwd"],
                   med["mha_mha"], med["nn_mha"], med["sdpa"] / med["mha"],
                   med["ort"] / med["mha"], med["sdpa_bwd"] / med["mha_bwd"],
                   med["nn_mha"] / med["mha_mha"], flops / (med["mha"] * 1e6),
                   med["mha_bwd"] / med["mha"]]
            print("%-30s" % name + "".join("%9.2f" % x for x in row), flush=True)
            if a.json:
                print(json.dumps({"B": B, "H": H, "L": L, "d": d, "causal": causal,
                                  "kernel": kern, "threads": a.threads,
                                  "ms": {k: round(v, 4) for k, v in med.items()},
                                  "torch": torch.__version__, "onnxruntime": ort.__version__}),
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
