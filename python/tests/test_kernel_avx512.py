"""test_kernel_avx512.py - kernel="avx512": on a CPU with AVX-512 F/DQ/BW/VL
it matches the float64 reference on odd shapes; elsewhere it is refused with
an error naming AVX-512 (never a silent fallback to avx2).  The C suites
check the AVX-512 loops themselves, natively or emulated (docs/performance.md,
"AVX-512 kernels")."""
import numpy as np
import pytest

import mha
from conftest import randn, ref_sdpa


def cpu_has_avx512():
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        return False
    return all(x in flags for x in ("avx512f", "avx512dq", "avx512bw", "avx512vl"))


@pytest.mark.skipif(not cpu_has_avx512(), reason="this CPU lacks AVX-512")
@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 1, 1, 1), (2, 3, 3, 7, 5, 4, 6),
                                   (1, 8, 2, 37, 130, 33, 17), (1, 2, 2, 70, 67, 64, 64)])
def test_avx512_matches_reference(rng, shape):
    B, Hq, Hkv, L, S, d, dv = shape
    q, k, v = randn(rng, B, Hq, L, d), randn(rng, B, Hkv, S, d), randn(rng, B, Hkv, S, dv)
    got = mha.scaled_dot_product_attention(q, k, v, enable_gqa=Hq != Hkv, kernel="avx512")
    np.testing.assert_allclose(got, ref_sdpa(q, k, v), rtol=1e-4, atol=2e-5)
    assert mha.kernel_name("avx512") == "avx512"


@pytest.mark.skipif(cpu_has_avx512(), reason="this CPU has AVX-512: nothing to refuse")
def test_avx512_refused_without_the_cpu(rng):
    q = randn(rng, 1, 1, 3, 4)
    with pytest.raises(Exception, match="AVX-512"):
        mha.scaled_dot_product_attention(q, q, q, kernel="avx512")
