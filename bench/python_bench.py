#!/usr/bin/env python3
"""python_bench.py - what calling mha from Python costs (docs/python.md).

1. Per-call overhead: a tiny problem (B=H=L=S=d=1) through each layer of
   the package, timeit, best of --repeat runs of --number calls, in
   microseconds per call: the bare extension call that does nothing
   (_mha.noop), the extension's sdpa (buffers -> views -> mha, GIL
   released), the public function on NumPy arrays (with and without out=),
   on torch tensors, and mha.torch's autograd function (no grad).
   CPU time of the process (and wall time); overhead = that minus the
   C call alone (`mha bench` on the same case, median wall time).
   Target: overhead of the public function <= 5 us per call.
2. Large cases (L >= 512): the same SDPA timed by `mha bench` (median of
   --reps runs of the C call) and from Python (median of --reps calls with
   out=, same threads), alternated --rounds times; the ratio python/C per
   round and its median.  Target: within 5 %.

Validation before timing: the Python result is compared with the float64
NumPy reference on the tiny case and on the window of the last 8 query
rows of each large case.  One JSON line per measurement.

    python3 bench/python_bench.py [--mha build/mha] [--rounds 3] [--reps 5]
(with the package importable: pip install ./python, or PYTHONPATH=...)
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
import timeit

import numpy as np

import mha
from mha import _mha


def ref_rows(q, k, v, causal, rows):
    """float64 SDPA of the last `rows` query rows (B,H,rows,d)."""
    L, S = q.shape[2], k.shape[2]
    qq = q[:, :, L - rows:].astype(np.float64)
    s = qq @ k.astype(np.float64).swapaxes(-1, -2) / np.sqrt(q.shape[3])
    if causal:
        i = np.arange(L - rows, L)[:, None]
        s = np.where(np.arange(S)[None, :] <= i, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)


def overhead(mha_bin, number, repeat):
    """Per-call cost on one mha thread (an OpenMP wake-up is the library's
    cost, not Python's); overhead = the public call - the C call timed by
    `mha bench` on the same tiny case."""
    threads = mha.get_num_threads()
    mha.set_num_threads(1)
    c_ms = c_bench(mha_bin, 1, 1, 1, 1, False, 2001, threads=1)[0]
    print(json.dumps({"op": "python_overhead", "case": "cli_c_call", "us_per_call": c_ms * 1e3}))
    q = np.ones((1, 1, 1, 1), np.float32)
    out = np.empty_like(q)
    got = mha.scaled_dot_product_attention(q, q, q)
    assert np.allclose(got, 1.0), got
    cases = {
        "noop_call": lambda: _mha.noop(out, q, q, q),
        "extension_sdpa": lambda: _mha.sdpa(out, q, q, q, None, 0, None, 0, 0, None, 0.0, 0, 0,
                                            None, None, 0),
        "sdpa_numpy": lambda: mha.scaled_dot_product_attention(q, q, q),
        "sdpa_numpy_out": lambda: mha.scaled_dot_product_attention(q, q, q, out=out),
    }
    try:
        import torch
        import mha.torch as mt
        t = torch.ones(1, 1, 1, 1)
        tout = torch.empty(1, 1, 1, 1)
        cases["sdpa_torch"] = lambda: mha.scaled_dot_product_attention(t, t, t)
        cases["sdpa_torch_out"] = lambda: mha.scaled_dot_product_attention(t, t, t, out=tout)
        with torch.no_grad():
            cases["mha_torch_autograd_fn"] = lambda: mt.scaled_dot_product_attention(t, t, t)
    except ImportError:
        pass
    for name, fn in cases.items():
        # CPU time of this process: on a shared, oversubscribed machine the
        # wall clock also counts the time spent waiting for a core
        cpu = min(timeit.repeat(fn, number=number, repeat=repeat, timer=time.process_time))
        wall = min(timeit.repeat(fn, number=number, repeat=repeat))
        cpu, wall = cpu / number * 1e6, wall / number * 1e6
        print(json.dumps({"op": "python_overhead", "case": name, "us_per_call_cpu": round(cpu, 3),
                          "us_per_call_wall": round(wall, 3),
                          "overhead_us": round(cpu - c_ms * 1e3, 3), "number": number}))
    mha.set_num_threads(threads)


def c_bench(mha_bin, B, H, L, d, causal, reps, threads=None):
    cmd = [mha_bin, "bench", "--batch", str(B), "--heads", str(H), "--seq", str(L),
           "--head-dim", str(d), "--json", "--reps", str(reps)] + (["--causal"] if causal else [])
    if threads:
        cmd += ["--threads", str(threads)]
    lines = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout.split("\n")
    rec = [json.loads(x) for x in lines if x.startswith("{")]
    return rec[-1]["ms"], rec[-1]["threads"], rec[-1]["kernel"]


def py_bench(q, k, v, out, causal, reps):
    times = []
    for _ in range(reps + 1):  # one warm-up
        t0 = time.perf_counter()
        mha.scaled_dot_product_attention(q, k, v, is_causal=causal, out=out)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]) * 1e3


def large(mha_bin, rounds, reps):
    rng = np.random.default_rng(0)
    for B, H, L, d, causal in ((1, 8, 512, 64, False), (1, 8, 512, 64, True),
                               (1, 8, 1024, 64, True)):
        q, k, v = (rng.standard_normal((B, H, L, d)).astype(np.float32) for _ in range(3))
        out = np.empty_like(q)
        mha.scaled_dot_product_attention(q, k, v, is_causal=causal, out=out)
        err = float(np.abs(out[:, :, L - 8:] - ref_rows(q, k, v, causal, 8)).max())
        assert err < 1e-4, err
        ratios = []
        for r in range(rounds):
            c_ms, threads, kernel = c_bench(mha_bin, B, H, L, d, causal, reps)
            p_ms = py_bench(q, k, v, out, causal, reps)
            ratios.append(p_ms / c_ms)
            print(json.dumps({"op": "python_vs_cli", "B": B, "H": H, "L": L, "d": d,
                              "causal": causal, "threads": threads, "kernel": kernel,
                              "round": r, "cli_ms": c_ms, "python_ms": round(p_ms, 4),
                              "ratio": round(p_ms / c_ms, 4), "max_err": err}))
        print(json.dumps({"op": "python_vs_cli_median", "L": L, "causal": causal,
                          "ratio": round(statistics.median(ratios), 4)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mha", default="build/mha", help="the mha command (default build/mha)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--number", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--overhead-only", action="store_true")
    a = ap.parse_args()
    print(json.dumps({"op": "python_bench", "python": sys.version.split()[0],
                      "numpy": np.__version__, "mha": mha.library_version,
                      "kernel": mha.kernel_name(), "threads": mha.get_num_threads()}))
    overhead(a.mha, a.number, a.repeat)
    if not a.overhead_only:
        large(a.mha, a.rounds, a.reps)


if __name__ == "__main__":
    main()
