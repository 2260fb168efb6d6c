"""conftest.py - shared references for the mha Python tests: a NumPy
float64 SDPA (the obviously-correct reference), seeded inputs, and
running work in several threads at once."""
import threading

import numpy as np
import pytest


def ref_sdpa(q, k, v, mask=None, causal=False, scale=None, masked_rows="zero"):
    """float64 softmax(q k^T * scale + mask) v with torch's SDPA conventions:
    q (B,Hq,L,d) k (B,Hkv,S,d) v (B,Hkv,S,dv); bool mask True = attend;
    query head h reads kv head h // (Hq/Hkv); causal top-left."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    g = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.swapaxes(-1, -2) * scale
    L, S = s.shape[-2:]
    keep = np.ones(s.shape, bool)
    if mask is not None:
        if mask.dtype == np.bool_:
            keep &= np.broadcast_to(mask, s.shape)
        else:
            s = s + mask.astype(np.float64)
    if causal:
        keep &= np.tril(np.ones((L, S), bool))
    s = np.where(keep, s, -np.inf)
    dead = ~np.isfinite(s).any(-1, keepdims=True)
    m = np.where(dead, 0.0, s.max(-1, keepdims=True))
    p = np.exp(s - m)
    p = p / np.where(dead, 1.0, p.sum(-1, keepdims=True))
    out = p @ v
    return np.where(dead, np.nan if masked_rows == "nan" else 0.0, out)


@pytest.fixture
def rng():
    return np.random.default_rng(17)


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def run_in_threads(work, n):
    """work(t) for t in 0..n-1, each in its own thread, all started before
    any is joined; re-raises the first exception a thread raised."""
    errors = []

    def run(t):
        try:
            work(t)
        except Exception as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
