"""test_half.py - half precision through the Python layer: NumPy float16,
torch float16 and torch bfloat16 query/key/value for
mha.scaled_dot_product_attention and mha.torch (forward and backward).

Each half result is measured against (a) mha's own float32 result on the
same half-valued inputs (upcast exactly), with issue 16's bounds, and (b)
torch 1.13 in float32 on the upcast inputs (softmax(q k^T * scale + mask) v;
torch 1.13 has no F.scaled_dot_product_attention).  The error is
rel = max|half - ref| / max(1, max|ref|).  Plus: dtypes of the results and
of out=, strided views without copies, GQA, causal, masks (bool, float32,
a float mask of the inputs' dtype), and mixed or unsupported dtypes
refused with a clear message."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import mha  # noqa: E402
import mha.torch as mt  # noqa: E402
from mha import _mha  # noqa: E402

# issue 16's bounds for the half path, beyond the output's rounding (excess())
BOUND = {"bfloat16": 2e-3, "float16": 5e-4}
# rel() with the output's rounding: measured on SHAPES x MASKS 3.75e-3 (bf16)
# and 4.54e-4 (fp16), against mha's float32 and torch's alike
REL = {"bfloat16": 4.5e-3, "float16": 6e-4}
TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}

# (B, Hq, Hkv, L, S, d, dv): odd shapes, L=1, d=1, GQA, tile tails
SHAPES = [(1, 1, 1, 1, 1, 1, 1), (2, 3, 3, 7, 5, 4, 6), (3, 4, 2, 5, 11, 3, 5),
          (2, 6, 1, 13, 1, 1, 2), (1, 2, 2, 33, 17, 16, 16), (2, 1, 1, 70, 67, 64, 64),
          (1, 8, 2, 3, 130, 32, 7)]
MASKS = ["none", "bool", "float32", "causal", "causal_bool"]
DTYPES = ["bfloat16", "float16"]


def rel(got, ref):
    got, ref = (np.asarray(x, np.float64) for x in (got, ref))
    return float(np.abs(got - ref).max() / max(1.0, np.abs(ref).max()))


MANTISSA = {"bfloat16": 7, "float16": 10}  # stored fraction bits
TINY = {"bfloat16": 2.0 ** -133, "float16": 2.0 ** -24}  # the subnormal spacing


def half_ulp(x, dtype):
    """Half the spacing of dtype at |x|: what rounding a float to dtype costs."""
    a = np.abs(np.asarray(x, np.float64))
    e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    return np.maximum(2.0 ** (e - MANTISSA[dtype]), TINY[dtype]) / 2


def excess(got, ref, dtype):
    """rel() beyond the output's own rounding: max(|got - ref| - half an ulp
    of dtype at max(|got|, |ref|)) / max(1, max|ref|).  A half result is
    rounded once from float32, which alone costs up to 2^-8 (bf16) / 2^-11
    (fp16) relative; the issue's bounds are on the error of the half path
    (P rounded to value's dtype) on top of that."""
    got, ref = (np.asarray(x, np.float64) for x in (got, ref))
    over = np.abs(got - ref) - half_ulp(np.maximum(np.abs(got), np.abs(ref)), dtype)
    return float(max(0.0, over.max()) / max(1.0, np.abs(ref).max()))


def check(got, ref, dtype):
    """The half result against a float32 one: within the issue's bound beyond
    the output rounding, and within REL (the rounding included)."""
    got = got.float() if isinstance(got, torch.Tensor) else got
    assert excess(got, ref, dtype) <= BOUND[dtype]
    assert rel(got, ref) <= REL[dtype]


def half_tensor(g, dtype, *shape):
    """A standard-normal torch tensor rounded to dtype."""
    return torch.randn(*shape, generator=g).to(TORCH_DTYPES[dtype])


def torch_sdpa_f32(q, k, v, mask=None, causal=False, scale=None):
    """torch's math SDPA in float32 on the upcast inputs (GQA by repeat)."""
    q, k, v = q.float(), k.float(), v.float()
    if q.dim() > 2:
        grp = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(grp, -3), v.repeat_interleave(grp, -3)
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.float()
    if causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v


def make_mask(g, kind, B, H, L, S):
    if kind in ("bool", "causal_bool"):
        m = torch.rand(L, S, generator=g) < 0.7
        m[:, 0] = True
        return m
    if kind == "float32":
        return torch.randn(B, H, L, S, generator=g)
    return None


def inputs(dtype, shape, seed=5):
    B, Hq, Hkv, L, S, d, dv = shape
    g = torch.Generator().manual_seed(seed)
    return (half_tensor(g, dtype, B, Hq, L, d), half_tensor(g, dtype, B, Hkv, S, d),
            half_tensor(g, dtype, B, Hkv, S, dv), g)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("shape", SHAPES)
def test_half_against_float32(dtype, kind, shape):
    q, k, v, g = inputs(dtype, shape)
    B, Hq, Hkv, L, S, d, dv = shape
    m = make_mask(g, kind, B, Hq, L, S)
    causal = kind.startswith("causal")
    gqa = Hq != Hkv
    before = mha.copies()
    got = mha.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal,
                                           enable_gqa=gqa)
    assert mha.copies() == before  # the half inputs are read in place
    assert isinstance(got, torch.Tensor) and got.dtype == q.dtype
    assert got.shape == (B, Hq, L, dv)
    f32 = mha.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=m,
                                           is_causal=causal, enable_gqa=gqa)
    check(got, f32, dtype)
    check(got, torch_sdpa_f32(q, k, v, m, causal), dtype)
    # the float32 path itself is the reference's: nothing half about it
    assert rel(f32, torch_sdpa_f32(q, k, v, m, causal)) <= 1e-5


@pytest.mark.parametrize("dtype", DTYPES)
def test_error_is_measured_not_zero(dtype):
    """The half path really rounds (P to value's dtype, the output once):
    its error against float32 is above the float32 noise, below the bound."""
    q, k, v, _ = inputs(dtype, (2, 4, 4, 64, 96, 32, 32))
    got = mha.scaled_dot_product_attention(q, k, v)
    ref = torch_sdpa_f32(q, k, v)
    unit = 2.0 ** -(MANTISSA[dtype] + 1)  # half an ulp at 1
    assert unit / 8 < rel(got.float(), ref) <= REL[dtype]
    assert excess(got.float(), ref, dtype) <= BOUND[dtype]
    # mha's half path ran (P rounded to value's dtype before P.V), not a
    # float32 computation rounded at the end
    f32 = mha.scaled_dot_product_attention(q.float(), k.float(), v.float())
    assert not torch.equal(got, f32.to(q.dtype))


@pytest.mark.parametrize("kernel", ["ref", "scalar", "auto"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_each_kernel(dtype, kernel):
    q, k, v, _ = inputs(dtype, (2, 3, 3, 9, 40, 8, 5))
    got = mha.scaled_dot_product_attention(q, k, v, scale=0.3, kernel=kernel)
    assert got.dtype == q.dtype
    check(got.float(), torch_sdpa_f32(q, k, v, scale=0.3), dtype)


def test_numpy_float16_in_numpy_float16_out():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(s).astype(np.float16)
               for s in ((2, 3, 7, 8), (2, 3, 9, 8), (2, 3, 9, 5)))
    before = mha.copies()
    got = mha.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert mha.copies() == before
    assert type(got) is np.ndarray and got.dtype == np.float16 and got.shape == (2, 3, 7, 5)
    want = mha.scaled_dot_product_attention(*(x.astype(np.float32) for x in (q, k, v)),
                                            is_causal=True)
    check(got, want, "float16")


def test_numpy_slices_and_negative_strides():
    rng = np.random.default_rng(4)
    base = rng.standard_normal((2, 3, 14, 16)).astype(np.float16)
    q, k, v = base[:, :, ::2, :8], base[:, :, 1::2, 8:], base[:, :, :7, ::2]  # strided views
    want = mha.scaled_dot_product_attention(*(x.astype(np.float32) for x in (q, k, v)))
    before = mha.copies()
    got = mha.scaled_dot_product_attention(q, k, v)
    assert mha.copies() == before and got.dtype == np.float16
    check(got, want, "float16")
    flipped = mha.scaled_dot_product_attention(q[:, :, ::-1], k, v)  # negative: one copy
    assert mha.copies() == before + 1
    check(flipped, want[:, :, ::-1], "float16")


@pytest.mark.parametrize("dtype", DTYPES)
def test_non_contiguous_torch_views(dtype):
    g = torch.Generator().manual_seed(8)
    x = half_tensor(g, dtype, 2, 9, 3, 4)  # (B,L,H,d)
    q = x.transpose(1, 2)  # (B,H,L,d), non-contiguous
    kv = half_tensor(g, dtype, 2, 3, 12, 10)
    k, v = kv[:, :, ::2, :4], kv[:, :, 1::2, 4:]  # every other key, a slice of the channels
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    before = mha.copies()
    got = mha.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert mha.copies() == before and got.dtype == q.dtype
    check(got.float(), torch_sdpa_f32(q, k, v, causal=True), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead", [(), (3,), (2, 2, 3)])
def test_ranks(dtype, lead):
    g = torch.Generator().manual_seed(9)
    q, k, v = (half_tensor(g, dtype, *lead, n, c) for n, c in ((6, 4), (5, 4), (5, 3)))
    got = mha.scaled_dot_product_attention(q, k, v)
    assert got.shape == lead + (6, 3) and got.dtype == q.dtype
    check(got.float(), torch_sdpa_f32(q, k, v), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_out_has_the_inputs_dtype(dtype):
    q, k, v, _ = inputs(dtype, (1, 2, 2, 5, 6, 4, 3))
    out = torch.empty(1, 2, 5, 3, dtype=q.dtype)
    r = mha.scaled_dot_product_attention(q, k, v, out=out)
    assert r is out
    assert torch.equal(out, mha.scaled_dot_product_attention(q, k, v))
    for bad in (torch.empty(1, 2, 5, 3), np.empty((1, 2, 5, 3), np.float32),
                torch.empty(1, 2, 5, 3, dtype=torch.float16 if dtype == "bfloat16"
                            else torch.bfloat16)):
        with pytest.raises(ValueError, match="out: dtype .* want %s" % dtype):
            mha.scaled_dot_product_attention(q, k, v, out=bad)
    with pytest.raises(ValueError, match="out: shape"):
        mha.scaled_dot_product_attention(q, k, v, out=torch.empty(1, 2, 5, 4, dtype=q.dtype))


def test_float32_inputs_refuse_a_half_out():
    q = np.ones((1, 1, 2, 2), np.float32)
    for bad in (np.empty((1, 1, 2, 2), np.float16), torch.empty(1, 1, 2, 2, dtype=torch.bfloat16)):
        with pytest.raises(ValueError, match="out: dtype"):
            mha.scaled_dot_product_attention(q, q, q, out=bad)


@pytest.mark.parametrize("pair", [("bfloat16", "float32"), ("float16", "bfloat16"),
                                  ("float32", "float16")])
def test_mixed_dtypes_refused(pair):
    q = torch.ones(1, 1, 2, 2, dtype=getattr(torch, pair[0]))
    k = torch.ones(1, 1, 2, 2, dtype=getattr(torch, pair[1]))
    with pytest.raises(ValueError, match="must share one dtype.*same dtype"):
        mha.scaled_dot_product_attention(q, k, k)
    with pytest.raises(ValueError, match="same dtype"):
        mt.scaled_dot_product_attention(q, q, k)


def test_mixed_numpy_dtypes_refused():
    a, b = np.ones((1, 1, 2, 2), np.float32), np.ones((1, 1, 2, 2), np.float16)
    with pytest.raises(ValueError, match="dtypes float32, float16, float32; they must share"):
        mha.scaled_dot_product_attention(a, b, a)


@pytest.mark.parametrize("make", [lambda: np.ones((1, 1, 2, 2), np.int16),
                                  lambda: np.ones((1, 1, 2, 2), np.uint16),
                                  lambda: torch.ones(1, 1, 2, 2, dtype=torch.int16),
                                  lambda: np.ones((1, 1, 2, 2), np.float64)])
def test_integer_16_bit_is_never_bfloat16(make):
    x = make()
    with pytest.raises(ValueError, match="dtype .* is not supported"):
        mha.scaled_dot_product_attention(x, x, x)


def test_extension_reads_bf16_only_when_marked():
    bits = torch.randn(1, 1, 3, 4).bfloat16().view(torch.int16).numpy()
    out = torch.empty(1, 1, 3, 4, dtype=torch.bfloat16)
    args = (None, 0, None, 0, 0, None, 0.0, 0, 0, None, None, 0)
    with pytest.raises(ValueError, match="element format 'h' is not supported"):
        _mha.sdpa(out.view(torch.int16).numpy(), bits, bits, bits, *args)
    with pytest.raises(ValueError, match="bf16\\(\\) wraps element format 'f'"):
        _mha.sdpa(_mha.bf16(np.empty((1, 1, 3, 4), np.float32)), *(_mha.bf16(bits),) * 3, *args)
    _mha.sdpa(_mha.bf16(out.view(torch.int16).numpy()), *(_mha.bf16(bits),) * 3, *args)
    x = torch.from_numpy(bits).view(torch.bfloat16)
    assert torch.equal(out, mha.scaled_dot_product_attention(x, x, x))
    assert _mha.bf16(bits).array is bits


@pytest.mark.parametrize("dtype", DTYPES)
def test_masks_for_half_inputs(dtype):
    q, k, v, g = inputs(dtype, (2, 3, 3, 6, 9, 4, 4))
    fm = torch.randn(2, 1, 6, 9, generator=g)
    want = mha.scaled_dot_product_attention(q, k, v, attn_mask=fm.to(q.dtype).float())
    before = mha.copies()
    half_mask = fm.to(q.dtype).requires_grad_()  # torch allows a mask of q's dtype
    got = mha.scaled_dot_product_attention(q, k, v, attn_mask=half_mask)
    assert mha.copies() == before + 1  # widened to the float32 mask mha reads
    assert torch.equal(got, want)
    if dtype == "float16":  # NumPy float16 throughout
        a = [x.numpy() for x in (q, k, v)]
        assert np.array_equal(mha.scaled_dot_product_attention(
            *a, attn_mask=fm.half().numpy()), want.numpy())
    other = torch.float16 if dtype == "bfloat16" else torch.bfloat16
    for bad in (fm.to(other), fm.double()):
        with pytest.raises(ValueError, match="attn_mask: dtype .*want bool, float32 or the "
                                             "query's dtype"):
            mha.scaled_dot_product_attention(q, k, v, attn_mask=bad)
    with pytest.raises(ValueError, match="attn_mask: dtype"):  # float32 inputs: no half mask
        mha.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=fm.half())


@pytest.mark.parametrize("dtype", DTYPES)
def test_same_bits_for_any_thread_count_and_dropout_seed(dtype):
    q, k, v, _ = inputs(dtype, (2, 4, 2, 37, 45, 16, 16))
    n = mha.get_num_threads()
    try:
        mha.set_num_threads(1)
        one = mha.scaled_dot_product_attention(q, k, v, enable_gqa=True, dropout_p=0.3, seed=7)
        mha.set_num_threads(3)
        three = mha.scaled_dot_product_attention(q, k, v, enable_gqa=True, dropout_p=0.3, seed=7)
    finally:
        mha.set_num_threads(n)
    assert torch.equal(one, three)
    f32 = mha.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True,
                                           dropout_p=0.3, seed=7)  # the same keep decisions
    check(one, f32, dtype)


# ---- mha.torch: the autograd Function -------------------------------------

GRAD_CASES = [(1, 1, 1, 1, 1, 1, 1, None, False), (2, 3, 3, 7, 5, 4, 6, None, True),
              (3, 4, 2, 5, 11, 3, 5, "bool", False), (2, 2, 1, 9, 9, 8, 8, "float32", True),
              (2, 1, 1, 70, 67, 64, 64, "bool", True)]
# The backward computes in float32 from the half tensors, the saved output
# included (half, as FlashAttention saves it: D = rowsum(dout * out) carries
# its rounding), and rounds each gradient once.  rel() against torch's
# float32 autograd measured on GRAD_CASES: 9.95e-3 (bf16), 5.32e-4 (fp16).
GRAD_BOUND = {"bfloat16": 1.5e-2, "float16": 1e-3}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", GRAD_CASES)
def test_backward_gradients_in_the_inputs_dtype(dtype, case):
    B, Hq, Hkv, L, S, d, dv, kind, causal = case
    q, k, v, g = inputs(dtype, (B, Hq, Hkv, L, S, d, dv), seed=12)
    m = make_mask(g, kind, B, Hq, L, S)
    dout = half_tensor(g, dtype, B, Hq, L, dv)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = mt.scaled_dot_product_attention(*leaves, attn_mask=m, is_causal=causal,
                                          enable_gqa=Hq != Hkv)
    assert out.dtype == q.dtype
    out.backward(dout)
    f32 = [x.float().requires_grad_() for x in (q, k, v)]
    out32 = mt.scaled_dot_product_attention(*f32, attn_mask=m, is_causal=causal,
                                            enable_gqa=Hq != Hkv)
    out32.backward(dout.float())
    ref = [x.float().requires_grad_() for x in (q, k, v)]
    torch_sdpa_f32(*ref, m, causal).backward(dout.float())
    check(out.detach(), out32.detach(), dtype)
    for leaf, mine32, torch32 in zip(leaves, f32, ref):
        assert leaf.grad.dtype == q.dtype and leaf.grad.shape == leaf.shape
        assert rel(leaf.grad.float(), mine32.grad) <= GRAD_BOUND[dtype]
        assert rel(leaf.grad.float(), torch32.grad) <= GRAD_BOUND[dtype]


def test_swapped_bfloat16_multihead_attention():
    """use_mha_attention on a bfloat16 nn.MultiheadAttention (torch 1.13 has
    no float16 linear on the CPU): output, weights and gradients in bf16,
    at least as close to the float32 module as torch's own bf16 module."""
    torch.manual_seed(2)
    ref32 = torch.nn.MultiheadAttention(16, 4)
    theirs = torch.nn.MultiheadAttention(16, 4).bfloat16()
    theirs.load_state_dict({n: p.bfloat16() for n, p in ref32.state_dict().items()})
    ours = mt.use_mha_attention(torch.nn.MultiheadAttention(16, 4).bfloat16())
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(7, 2, 16).bfloat16()
    want, want_w = ref32(x.float(), x.float(), x.float())
    t_out, t_w = theirs(x, x, x)
    o_out, o_w = ours(x, x, x)
    assert o_out.dtype == o_w.dtype == torch.bfloat16
    # measured: output 2.7e-3 (torch's bf16 module 4.2e-3), weights 6.0e-4 (1.2e-3)
    assert rel(o_out.detach().float(), want.detach()) <= 1.2 * rel(t_out.detach().float(),
                                                                   want.detach())
    assert rel(o_w.detach().float(), want_w.detach()) <= 1.2 * rel(t_w.detach().float(),
                                                                   want_w.detach())
    o_out.float().square().sum().backward()
    assert ours.in_proj_weight.grad.dtype == torch.bfloat16
