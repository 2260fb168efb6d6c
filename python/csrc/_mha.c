/*
 * _mha.c - the CPython extension module `mha._mha`: a thin layer from
 * Python buffers to include/mha.h.
 *
 * Every array argument is any object exporting the buffer protocol with
 * strides (NumPy arrays; torch tensors reach here as their zero-copy
 * .numpy() views): its memory is handed to mha as an mha_tensor view,
 * never copied.  Formats: 'f' float32, 'e' float16 (MHA_F16), '?'/'B'
 * bool (uint8, nonzero = true), 'q'/'l' (8 bytes) int64.  bfloat16 has no
 * buffer-protocol format: it arrives as a bf16 object (the type below)
 * wrapping a 2-byte integer buffer ('h'/'H') that holds the bits; a bare
 * int16/uint16 buffer is refused, never taken as bf16.  Which argument may
 * be half is mha's business (its status says).  Outputs are buffers the caller (the
 * Python layer, python/mha/) allocated, acquired writable.  None means
 * "absent" (a NULL tensor).  The GIL is released around every mha call;
 * the held buffers keep the exporters alive and unresizable meanwhile.
 *
 * Errors: an mha status becomes ValueError (shape, dtype, value, null,
 * overflow, alias), MemoryError (nomem), OSError (io, format) or
 * NotImplementedError (unsupported), the message being
 * "<status string>: <mha_last_error()>".
 *
 * Functions take positional arguments only (METH_FASTCALL): the Python
 * layer owns the torch-style signatures and defaults.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <stdint.h>
#include <string.h>

#include "mha.h"

/* The checkout the module was built from (setup.py), "" when unknown. */
#ifndef MHA_SOURCE_ROOT
#define MHA_SOURCE_ROOT ""
#endif

/* ---- errors ------------------------------------------------------------- */

static PyObject *status_exception(mha_status s) {
    if (s == MHA_ERR_NOMEM)
        return PyExc_MemoryError;
    if (s == MHA_ERR_IO || s == MHA_ERR_FORMAT)
        return PyExc_OSError;
    if (s == MHA_ERR_UNSUPPORTED)
        return PyExc_NotImplementedError;
    return PyExc_ValueError;
}

static PyObject *raise_status(mha_status s) {
    PyErr_Format(status_exception(s), "%s: %s", mha_status_string(s), mha_last_error());
    return NULL;
}

/* ---- buffers -> tensor views ---------------------------------------------- */

/* Raised for a negative stride, which mha's views cannot express: the Python
 * layer then copies that input (counted by mha.copies()) and calls again. */
static PyObject *LayoutError;

#define MAX_HELD 48

/* The buffers of one call: acquired by view(), released by release(). */
typedef struct held {
    int n;
    Py_buffer buf[MAX_HELD];
    mha_tensor t[MAX_HELD];
} held;

static void release(held *h) {
    for (int i = 0; i < h->n; i++)
        PyBuffer_Release(&h->buf[i]);
    h->n = 0;
}

/* ---- bf16: the explicit marking of bfloat16 bits ----------------------------
 * bf16(array): array is any strided buffer of 2-byte integers ('h' or 'H',
 * e.g. torch's bf16_tensor.view(torch.int16).numpy()) holding bfloat16
 * bits; view() reads it as MHA_BF16, zero-copy, input or output. */
typedef struct bf16_object {
    PyObject_HEAD
    PyObject *array; /* the wrapped buffer exporter */
} bf16_object;

static void bf16_dealloc(PyObject *self) {
    Py_XDECREF(((bf16_object *)self)->array);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *bf16_new(PyTypeObject *type, PyObject *args, PyObject *kwds);

static PyMemberDef bf16_members[] = {
    {"array", T_OBJECT, offsetof(bf16_object, array), READONLY,
     "the 2-byte integer buffer holding the bfloat16 bits"},
    {NULL, 0, 0, 0, NULL}};

static PyTypeObject bf16_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mha._mha.bf16",
    .tp_basicsize = sizeof(bf16_object),
    .tp_dealloc = bf16_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "bf16(array): array (int16/uint16 buffer) read as bfloat16 bits",
    .tp_members = bf16_members,
    .tp_new = bf16_new,
};

static PyObject *bf16_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *array;
    if (kwds && PyDict_Size(kwds) != 0) {
        PyErr_SetString(PyExc_TypeError, "bf16() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O:bf16", &array))
        return NULL;
    bf16_object *self = (bf16_object *)type->tp_alloc(type, 0);
    if (self) {
        Py_INCREF(array);
        self->array = array;
    }
    return (PyObject *)self;
}

/* The element format of b without its byte-order prefix ("" if it has
 * more than one character). */
static char format_char(const Py_buffer *b) {
    const char *f = b->format ? b->format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    return f[0] != '\0' && f[1] == '\0' ? f[0] : '\0';
}

static int dtype_of(const Py_buffer *b, int bf16, mha_dtype *dt) {
    char f = format_char(b);
    if (bf16) {
        *dt = MHA_BF16;
        return (f == 'h' || f == 'H') && b->itemsize == 2;
    }
    switch (f) {
    case 'f': *dt = MHA_F32; return b->itemsize == 4;
    case 'e': *dt = MHA_F16; return b->itemsize == 2;
    case '?':
    case 'B': *dt = MHA_BOOL; return b->itemsize == 1;
    case 'q':
    case 'l': *dt = MHA_I64; return b->itemsize == 8;
    default: return 0;
    }
}

/* The view of obj (None -> NULL without error).  *ok is cleared, with a
 * Python exception set, when obj is not a usable buffer. */
static mha_tensor *view(held *h, PyObject *obj, const char *name, int writable, int *ok) {
    if (!*ok || obj == NULL || obj == Py_None)
        return NULL;
    if (h->n == MAX_HELD) {
        PyErr_SetString(PyExc_RuntimeError, "mha: too many array arguments");
        *ok = 0;
        return NULL;
    }
    int bf16 = Py_TYPE(obj) == &bf16_type;
    if (bf16)
        obj = ((bf16_object *)obj)->array;
    Py_buffer *b = &h->buf[h->n];
    if (PyObject_GetBuffer(obj, b, writable ? PyBUF_RECORDS : PyBUF_RECORDS_RO) != 0) {
        PyErr_Format(PyExc_ValueError, "%s: not a %s strided array (%s)", name,
                     writable ? "writable" : "readable", Py_TYPE(obj)->tp_name);
        *ok = 0;
        return NULL;
    }
    h->n++;
    mha_tensor *t = &h->t[h->n - 1];
    memset(t, 0, sizeof *t);
    if (!dtype_of(b, bf16, &t->dtype)) {
        PyErr_Format(PyExc_ValueError,
                     bf16 ? "%s: bf16() wraps element format '%s'; want 2-byte integers "
                            "('h' or 'H') holding bfloat16 bits"
                          : "%s: dtype with element format '%s' is not supported: mha takes "
                            "float32 (float16 or bfloat16 where the function says; convert "
                            "with .astype(np.float32) or .float()); masks bool or float32",
                     name, b->format ? b->format : "B");
        *ok = 0;
        return NULL;
    }
    if (b->ndim > MHA_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s: %d dimensions, mha takes at most %d", name, b->ndim,
                     MHA_MAX_DIMS);
        *ok = 0;
        return NULL;
    }
    t->data = b->buf;
    t->ndim = b->ndim;
    int64_t contiguous = 1;
    for (int i = b->ndim - 1; i >= 0; i--) {
        t->shape[i] = b->shape[i];
        Py_ssize_t s = b->strides ? b->strides[i] : (Py_ssize_t)(contiguous * b->itemsize);
        if (s < 0) { /* an output cannot be copied behind the caller's back */
            PyErr_Format(writable ? PyExc_ValueError : LayoutError,
                         "%s: negative stride in dim %d", name, i);
            *ok = 0;
            return NULL;
        }
        if (s % b->itemsize != 0) {
            PyErr_Format(PyExc_ValueError, "%s: stride %zd bytes is not a multiple of %zd", name,
                         s, b->itemsize);
            *ok = 0;
            return NULL;
        }
        t->stride[i] = s / b->itemsize;
        contiguous *= b->shape[i];
    }
    return t;
}

/* A borrowed dict entry prefix+name, or NULL (absent). */
static PyObject *entry(PyObject *dict, const char *prefix, const char *name) {
    char key[128];
    snprintf(key, sizeof key, "%s%s", prefix, name);
    return PyDict_GetItemString(dict, key);
}

static mha_tensor *wview(held *h, PyObject *dict, const char *prefix, const char *name, int *ok) {
    PyObject *o = entry(dict, prefix, name);
    char full[128];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    return view(h, o, full, 0, ok);
}

/* ---- scalar arguments ------------------------------------------------------ */

static int64_t as_i64(PyObject *o, int *ok) {
    if (!*ok)
        return 0;
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred())
        *ok = 0;
    return v;
}

static uint64_t as_u64(PyObject *o, int *ok) {
    if (!*ok)
        return 0;
    unsigned long long v = PyLong_AsUnsignedLongLongMask(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        *ok = 0;
    return v;
}

static float as_f32(PyObject *o, int *ok) {
    if (!*ok)
        return 0;
    double v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred())
        *ok = 0;
    return (float)v;
}

/* A float option that may be None: *set = 0 then. */
static float as_opt_f32(PyObject *o, int *set, int *ok) {
    *set = o != Py_None;
    return *set ? as_f32(o, ok) : 0.0f;
}

static int check_nargs(Py_ssize_t nargs, Py_ssize_t want, const char *fn) {
    if (nargs == want)
        return 1;
    PyErr_Format(PyExc_TypeError, "_mha.%s: %zd arguments, want %zd", fn, nargs, want);
    return 0;
}

/* Runs the mha call `expr` without the GIL, releases the buffers, and
 * returns None or raises. */
#define RUN_RELEASED(h, expr)                 \
    do {                                      \
        mha_status st_;                       \
        Py_BEGIN_ALLOW_THREADS st_ = (expr);  \
        Py_END_ALLOW_THREADS release(h);      \
        if (st_ != MHA_OK)                    \
            return raise_status(st_);         \
        Py_RETURN_NONE;                       \
    } while (0)

#define FAIL_IF_NOT_OK(h, ok) \
    do {                      \
        if (!(ok)) {          \
            release(h);       \
            return NULL;      \
        }                     \
    } while (0)

/* ---- scaled dot-product attention ---------------------------------------- */

/* The 12 SDPA option arguments shared by forward and backward:
 *   mask, mask_true_masks, key_padding_mask, kpm_true_masks, causal (0..2),
 *   scale (None|float), dropout_p, seed, masked_rows_nan, weights (out|None),
 *   lse (out|None), kernel. */
#define SDPA_OPT_ARGS 12
static void sdpa_options(mha_sdpa_options *opt, held *h, PyObject *const *a, int *ok) {
    mha_sdpa_options_init(opt);
    opt->attn_mask = view(h, a[0], "attn_mask", 0, ok);
    opt->attn_mask_polarity = as_i64(a[1], ok) ? MHA_TRUE_MASKS : MHA_TRUE_KEEPS;
    opt->key_padding_mask = view(h, a[2], "key_padding_mask", 0, ok);
    opt->key_padding_polarity = as_i64(a[3], ok) ? MHA_TRUE_MASKS : MHA_TRUE_KEEPS;
    opt->causal = (mha_causal)as_i64(a[4], ok);
    opt->scale = as_opt_f32(a[5], &opt->scale_set, ok);
    opt->dropout_p = as_f32(a[6], ok);
    opt->training = opt->dropout_p > 0.0f;
    opt->seed = as_u64(a[7], ok);
    opt->masked_rows = as_i64(a[8], ok) ? MHA_MASKED_ROWS_NAN : MHA_MASKED_ROWS_ZERO;
    opt->attn_weights = view(h, a[9], "weights", 1, ok);
    opt->lse = view(h, a[10], "lse", 1, ok);
    opt->kernel = (mha_kernel)as_i64(a[11], ok);
}

/* sdpa(out, q, k, v, <SDPA options>) */
static PyObject *py_sdpa(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    if (!check_nargs(nargs, 4 + SDPA_OPT_ARGS, "sdpa"))
        return NULL;
    held h = {0};
    int ok = 1;
    mha_sdpa_options opt;
    mha_tensor *out = view(&h, a[0], "out", 1, &ok);
    const mha_tensor *q = view(&h, a[1], "query", 0, &ok);
    const mha_tensor *k = view(&h, a[2], "key", 0, &ok);
    const mha_tensor *v = view(&h, a[3], "value", 0, &ok);
    sdpa_options(&opt, &h, a + 4, &ok);
    FAIL_IF_NOT_OK(&h, ok);
    RUN_RELEASED(&h, mha_sdpa_forward(out, q, k, v, &opt));
}

/* sdpa_backward(dq, dk, dv, dout, out, lse, q, k, v, <SDPA options>):
 * gradients are ADDED into dq/dk/dv (mha's gradient rule). */
static PyObject *py_sdpa_backward(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    if (!check_nargs(nargs, 9 + SDPA_OPT_ARGS, "sdpa_backward"))
        return NULL;
    held h = {0};
    int ok = 1;
    mha_sdpa_options opt;
    mha_tensor *dq = view(&h, a[0], "dq", 1, &ok);
    mha_tensor *dk = view(&h, a[1], "dk", 1, &ok);
    mha_tensor *dv = view(&h, a[2], "dv", 1, &ok);
    const mha_tensor *dout = view(&h, a[3], "grad_output", 0, &ok);
    const mha_tensor *out = view(&h, a[4], "out", 0, &ok);
    const mha_tensor *lse = view(&h, a[5], "lse", 0, &ok);
    const mha_tensor *q = view(&h, a[6], "query", 0, &ok);
    const mha_tensor *k = view(&h, a[7], "key", 0, &ok);
    const mha_tensor *v = view(&h, a[8], "value", 0, &ok);
    sdpa_options(&opt, &h, a + 9, &ok);
    opt.attn_weights = NULL;
    FAIL_IF_NOT_OK(&h, ok);
    RUN_RELEASED(&h, mha_sdpa_backward(dq, dk, dv, dout, out, lse, q, k, v, &opt));
}

/* ---- multi-head attention and the layers ----------------------------------- */

/* The nn.MultiheadAttention parameters under prefix in a state_dict. */
static void multihead_weights(mha_multihead_weights *w, held *h, PyObject *sd, const char *prefix,
                              int *ok) {
    memset(w, 0, sizeof *w);
    w->in_proj_weight = wview(h, sd, prefix, "in_proj_weight", ok);
    w->q_proj_weight = wview(h, sd, prefix, "q_proj_weight", ok);
    w->k_proj_weight = wview(h, sd, prefix, "k_proj_weight", ok);
    w->v_proj_weight = wview(h, sd, prefix, "v_proj_weight", ok);
    w->in_proj_bias = wview(h, sd, prefix, "in_proj_bias", ok);
    w->out_proj_weight = wview(h, sd, prefix, "out_proj.weight", ok);
    w->out_proj_bias = wview(h, sd, prefix, "out_proj.bias", ok);
    w->bias_k = wview(h, sd, prefix, "bias_k", ok);
    w->bias_v = wview(h, sd, prefix, "bias_v", ok);
}

static int check_dict(PyObject *d) {
    if (PyDict_Check(d))
        return 1;
    PyErr_SetString(PyExc_TypeError, "_mha: weights must be a dict of arrays");
    return 0;
}

/* multihead(out, query, key, value, state_dict, num_heads, add_zero_attn,
 *           key_padding_mask, attn_mask, causal, masked_rows_nan,
 *           weights_out, average, training, dropout_p, seed, kernel) */
static PyObject *py_multihead(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    if (!check_nargs(nargs, 17, "multihead") || !check_dict(a[4]))
        return NULL;
    held h = {0};
    int ok = 1;
    mha_multihead_weights w;
    mha_multihead_options opt;
    mha_multihead_options_init(&opt);
    mha_tensor *out = view(&h, a[0], "out", 1, &ok);
    const mha_tensor *query = view(&h, a[1], "query", 0, &ok);
    /* self-attention is recognised by mha from identical views */
    const mha_tensor *key = a[2] == a[1] ? query : view(&h, a[2], "key", 0, &ok);
    const mha_tensor *value = a[3] == a[1] ? query : a[3] == a[2] ? key
                                                               : view(&h, a[3], "value", 0, &ok);
    multihead_weights(&w, &h, a[4], "", &ok);
    opt.num_heads = as_i64(a[5], &ok);
    opt.add_zero_attn = (int)as_i64(a[6], &ok);
    opt.key_padding_mask = view(&h, a[7], "key_padding_mask", 0, &ok);
    opt.attn_mask = view(&h, a[8], "attn_mask", 0, &ok);
    opt.causal = (mha_causal)as_i64(a[9], &ok);
    opt.masked_rows = as_i64(a[10], &ok) ? MHA_MASKED_ROWS_NAN : MHA_MASKED_ROWS_ZERO;
    opt.attn_weights = view(&h, a[11], "attn_output_weights", 1, &ok);
    opt.average_attn_weights = (int)as_i64(a[12], &ok);
    opt.training = (int)as_i64(a[13], &ok);
    opt.dropout_p = as_f32(a[14], &ok);
    opt.seed = as_u64(a[15], &ok);
    opt.kernel = (mha_kernel)as_i64(a[16], &ok);
    FAIL_IF_NOT_OK(&h, ok);
    RUN_RELEASED(&h, mha_multihead_forward(out, query, key, value, &w, &opt));
}

/* The 9 layer option arguments: num_heads, norm_first, activation, eps,
 * masked_rows_nan, training, dropout_p, seed, kernel. */
#define LAYER_OPT_ARGS 9
static void layer_options(mha_layer_options *opt, PyObject *const *a, int *ok) {
    mha_layer_options_init(opt);
    opt->num_heads = as_i64(a[0], ok);
    opt->norm_first = (int)as_i64(a[1], ok);
    opt->activation = (mha_activation)as_i64(a[2], ok);
    opt->layer_norm_eps = as_f32(a[3], ok);
    opt->masked_rows = as_i64(a[4], ok) ? MHA_MASKED_ROWS_NAN : MHA_MASKED_ROWS_ZERO;
    opt->training = (int)as_i64(a[5], ok);
    opt->dropout_p = as_f32(a[6], ok);
    opt->seed = as_u64(a[7], ok);
    opt->kernel = (mha_kernel)as_i64(a[8], ok);
}

static void mlp_and_norms(held *h, PyObject *sd, const mha_tensor **l1w, const mha_tensor **l1b,
                          const mha_tensor **l2w, const mha_tensor **l2b,
                          const mha_tensor **norms, int n_norms, int *ok) {
    static const char *names[][2] = {{"norm1.weight", "norm1.bias"},
                                     {"norm2.weight", "norm2.bias"},
                                     {"norm3.weight", "norm3.bias"}};
    *l1w = wview(h, sd, "", "linear1.weight", ok);
    *l1b = wview(h, sd, "", "linear1.bias", ok);
    *l2w = wview(h, sd, "", "linear2.weight", ok);
    *l2b = wview(h, sd, "", "linear2.bias", ok);
    for (int i = 0; i < n_norms; i++) {
        norms[2 * i] = wview(h, sd, "", names[i][0], ok);
        norms[2 * i + 1] = wview(h, sd, "", names[i][1], ok);
    }
}

/* encoder_layer(out, src, state_dict, src_mask, src_key_padding_mask,
 *               is_causal, <layer options>) */
static PyObject *py_encoder_layer(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    if (!check_nargs(nargs, 6 + LAYER_OPT_ARGS, "encoder_layer") || !check_dict(a[2]))
        return NULL;
    held h = {0};
    int ok = 1;
    mha_encoder_layer_weights w;
    mha_layer_masks masks = {0};
    mha_layer_options opt;
    const mha_tensor *norms[4];
    mha_tensor *out = view(&h, a[0], "out", 1, &ok);
    const mha_tensor *src = view(&h, a[1], "src", 0, &ok);
    multihead_weights(&w.self_attn, &h, a[2], "self_attn.", &ok);
    mlp_and_norms(&h, a[2], &w.linear1_weight, &w.linear1_bias, &w.linear2_weight,
                  &w.linear2_bias, norms, 2, &ok);
    w.norm1_weight = norms[0], w.norm1_bias = norms[1];
    w.norm2_weight = norms[2], w.norm2_bias = norms[3];
    masks.attn_mask = view(&h, a[3], "src_mask", 0, &ok);
    masks.key_padding_mask = view(&h, a[4], "src_key_padding_mask", 0, &ok);
    masks.causal = (mha_causal)as_i64(a[5], &ok);
    layer_options(&opt, a + 6, &ok);
    FAIL_IF_NOT_OK(&h, ok);
    RUN_RELEASED(&h, mha_encoder_layer_forward(out, src, &w, &masks, &opt, NULL, 0));
}

/* decoder_layer(out, tgt, memory, state_dict, tgt_mask, tgt_key_padding_mask,
 *               tgt_is_causal, memory_mask, memory_key_padding_mask,
 *               <layer options>) */
static PyObject *py_decoder_layer(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    if (!check_nargs(nargs, 9 + LAYER_OPT_ARGS, "decoder_layer") || !check_dict(a[3]))
        return NULL;
    held h = {0};
    int ok = 1;
    mha_decoder_layer_weights w;
    mha_layer_masks masks = {0};
    mha_layer_options opt;
    const mha_tensor *norms[6];
    mha_tensor *out = view(&h, a[0], "out", 1, &ok);
    const mha_tensor *tgt = view(&h, a[1], "tgt", 0, &ok);
    const mha_tensor *memory = view(&h, a[2], "memory", 0, &ok);
    multihead_weights(&w.self_attn, &h, a[3], "self_attn.", &ok);
    multihead_weights(&w.multihead_attn, &h, a[3], "multihead_attn.", &ok);
    mlp_and_norms(&h, a[3], &w.linear1_weight, &w.linear1_bias, &w.linear2_weight,
                  &w.linear2_bias, norms, 3, &ok);
    w.norm1_weight = norms[0], w.norm1_bias = norms[1];
    w.norm2_weight = norms[2], w.norm2_bias = norms[3];
    w.norm3_weight = norms[4], w.norm3_bias = norms[5];
    masks.attn_mask = view(&h, a[4], "tgt_mask", 0, &ok);
    masks.key_padding_mask = view(&h, a[5], "tgt_key_padding_mask", 0, &ok);
    masks.causal = (mha_causal)as_i64(a[6], &ok);
    masks.memory_mask = view(&h, a[7], "memory_mask", 0, &ok);
    masks.memory_key_padding_mask = view(&h, a[8], "memory_key_padding_mask", 0, &ok);
    layer_options(&opt, a + 9, &ok);
    FAIL_IF_NOT_OK(&h, ok);
    RUN_RELEASED(&h, mha_decoder_layer_forward(out, tgt, memory, &w, &masks, &opt, NULL, 0));
}

/* ---- the ONNX Attention operator -------------------------------------------- */

/* The 10 ONNX attribute arguments: is_causal, scale (None|float),
 * q_num_heads, kv_num_heads, softcap, qk_matmul_output_mode,
 * softmax_precision, left_window_size, right_window_size, kernel. */
#define ONNX_OPT_ARGS 10
static void onnx_options(mha_onnx_attention_options *opt, PyObject *const *a, int *ok) {
    mha_onnx_attention_options_init(opt);
    opt->is_causal = (int)as_i64(a[0], ok);
    opt->scale = as_opt_f32(a[1], &opt->scale_set, ok);
    opt->q_num_heads = as_i64(a[2], ok);
    opt->kv_num_heads = as_i64(a[3], ok);
    opt->softcap = as_f32(a[4], ok);
    opt->qk_matmul_output_mode = (int)as_i64(a[5], ok);
    opt->softmax_precision = (int)as_i64(a[6], ok);
    opt->left_window_size = as_i64(a[7], ok);
    opt->right_window_size = as_i64(a[8], ok);
    opt->kernel = (mha_kernel)as_i64(a[9], ok);
}

static PyObject *shape_tuple(const int64_t *s, int n) {
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t && i < n; i++)
        PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(s[i]));
    return t;
}

/* onnx_attention_shapes(q, k, v, attn_mask, past_key, past_value,
 *     nonpad_kv_seqlen, <ONNX options>) -> (y, present_key, present_value, qk) */
static PyObject *py_onnx_shapes(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    if (!check_nargs(nargs, 7 + ONNX_OPT_ARGS, "onnx_attention_shapes"))
        return NULL;
    held h = {0};
    int ok = 1;
    mha_onnx_attention_options opt;
    mha_onnx_attention_shapes s;
    const mha_tensor *in[7];
    static const char *names[7] = {"Q", "K", "V", "attn_mask", "past_key", "past_value",
                                   "nonpad_kv_seqlen"};
    for (int i = 0; i < 7; i++)
        in[i] = view(&h, a[i], names[i], 0, &ok);
    onnx_options(&opt, a + 7, &ok);
    FAIL_IF_NOT_OK(&h, ok);
    mha_status st = mha_onnx_attention_shapes_get(&s, in[0], in[1], in[2], in[3], in[4], in[5],
                                                  in[6], &opt);
    release(&h);
    if (st != MHA_OK)
        return raise_status(st);
    return Py_BuildValue("(NNNN)", shape_tuple(s.y, s.y_ndim), shape_tuple(s.present_key, 4),
                         shape_tuple(s.present_value, 4), shape_tuple(s.qk, 4));
}

/* onnx_attention(y, present_key, present_value, qk, q, k, v, attn_mask,
 *                past_key, past_value, nonpad_kv_seqlen, <ONNX options>) */
static PyObject *py_onnx_attention(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    if (!check_nargs(nargs, 11 + ONNX_OPT_ARGS, "onnx_attention"))
        return NULL;
    held h = {0};
    int ok = 1;
    mha_onnx_attention_options opt;
    static const char *onames[4] = {"Y", "present_key", "present_value", "qk_matmul_output"};
    static const char *inames[7] = {"Q", "K", "V", "attn_mask", "past_key", "past_value",
                                    "nonpad_kv_seqlen"};
    mha_tensor *o[4];
    const mha_tensor *in[7];
    for (int i = 0; i < 4; i++)
        o[i] = view(&h, a[i], onames[i], 1, &ok);
    for (int i = 0; i < 7; i++)
        in[i] = view(&h, a[4 + i], inames[i], 0, &ok);
    onnx_options(&opt, a + 11, &ok);
    FAIL_IF_NOT_OK(&h, ok);
    RUN_RELEASED(&h, mha_onnx_attention(o[0], o[1], o[2], o[3], in[0], in[1], in[2], in[3],
                                        in[4], in[5], in[6], &opt));
}

/* ---- KV cache and decode ------------------------------------------------------ */

#define KV_CAPSULE "mha._mha.kv_cache"

static void kv_cache_destroy(PyObject *capsule) {
    mha_kv_cache_free(PyCapsule_GetPointer(capsule, KV_CAPSULE));
}

static mha_kv_cache *kv_cache_of(PyObject *o) {
    return PyCapsule_GetPointer(o, KV_CAPSULE); /* sets TypeError-ish on a wrong object */
}

/* kv_cache_create(B, Hkv, capacity, d, dv, window, dtype (mha_dtype code))
 * -> capsule */
static PyObject *py_kv_cache_create(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    if (!check_nargs(nargs, 7, "kv_cache_create"))
        return NULL;
    int ok = 1;
    int64_t v[7];
    for (int i = 0; i < 7; i++)
        v[i] = as_i64(a[i], &ok);
    if (!ok)
        return NULL;
    mha_kv_cache *c = NULL;
    mha_status st =
        mha_kv_cache_create(&c, (mha_dtype)v[6], v[0], v[1], v[2], v[3], v[4], v[5]);
    if (st != MHA_OK)
        return raise_status(st);
    PyObject *cap = PyCapsule_New(c, KV_CAPSULE, kv_cache_destroy);
    if (!cap)
        mha_kv_cache_free(c);
    return cap;
}

/* kv_cache_append(cache, k, v); the caller serialises calls on one cache */
static PyObject *py_kv_cache_append(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    if (!check_nargs(nargs, 3, "kv_cache_append"))
        return NULL;
    mha_kv_cache *c = kv_cache_of(a[0]);
    if (!c)
        return NULL;
    held h = {0};
    int ok = 1;
    const mha_tensor *k = view(&h, a[1], "key", 0, &ok);
    const mha_tensor *v = view(&h, a[2], "value", 0, &ok);
    FAIL_IF_NOT_OK(&h, ok);
    RUN_RELEASED(&h, mha_kv_cache_append(c, k, v));
}

static PyObject *py_kv_cache_reset(PyObject *self, PyObject *cap) {
    mha_kv_cache *c = kv_cache_of(cap);
    if (!c)
        return NULL;
    mha_kv_cache_reset(c);
    Py_RETURN_NONE;
}

/* kv_cache_info(cache) -> (position, length) */
static PyObject *py_kv_cache_info(PyObject *self, PyObject *cap) {
    mha_kv_cache *c = kv_cache_of(cap);
    if (!c)
        return NULL;
    return Py_BuildValue("(LL)", (long long)mha_kv_cache_position(c),
                         (long long)mha_kv_cache_length(c));
}

/* attention_decode(out, q, cache, scale (None|float), softcap, lse, kernel) */
static PyObject *py_attention_decode(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    if (!check_nargs(nargs, 7, "attention_decode"))
        return NULL;
    mha_kv_cache *c = kv_cache_of(a[2]);
    if (!c)
        return NULL;
    held h = {0};
    int ok = 1;
    mha_sdpa_options opt;
    mha_sdpa_options_init(&opt);
    mha_tensor *out = view(&h, a[0], "out", 1, &ok);
    const mha_tensor *q = view(&h, a[1], "query", 0, &ok);
    opt.scale = as_opt_f32(a[3], &opt.scale_set, &ok);
    opt.softcap = as_f32(a[4], &ok);
    opt.lse = view(&h, a[5], "lse", 1, &ok);
    opt.kernel = (mha_kernel)as_i64(a[6], &ok);
    FAIL_IF_NOT_OK(&h, ok);
    RUN_RELEASED(&h, mha_attention_decode(out, q, c, &opt));
}

/* ---- files ------------------------------------------------------------------- */

/* safetensors_load(path) -> [(name, shape, float32 bytes)], file order */
static PyObject *py_safetensors_load(PyObject *self, PyObject *arg) {
    PyObject *bytes_path = NULL;
    if (!PyUnicode_FSConverter(arg, &bytes_path))
        return NULL;
    mha_safetensors *st = NULL;
    mha_status s;
    const char *path = PyBytes_AS_STRING(bytes_path);
    Py_BEGIN_ALLOW_THREADS s = mha_safetensors_open(&st, path);
    Py_END_ALLOW_THREADS Py_DECREF(bytes_path);
    if (s != MHA_OK)
        return raise_status(s);
    int64_t n = mha_safetensors_count(st);
    PyObject *list = PyList_New(0);
    for (int64_t i = 0; list && i < n; i++) {
        const char *name = mha_safetensors_name(st, i);
        mha_tensor t;
        int64_t numel = 0;
        if ((s = mha_safetensors_get_f32(st, name, &t)) != MHA_OK ||
            (s = mha_tensor_numel(&t, &numel)) != MHA_OK) {
            Py_CLEAR(list);
            mha_safetensors_free(st);
            return raise_status(s);
        }
        PyObject *item = Py_BuildValue("(sNy#)", name, shape_tuple(t.shape, t.ndim),
                                       (const char *)t.data, (Py_ssize_t)(numel * 4));
        mha_tensor_free(&t);
        if (!item || PyList_Append(list, item) != 0)
            Py_CLEAR(list);
        Py_XDECREF(item);
    }
    mha_safetensors_free(st);
    return list;
}

/* ---- the sentence embedder ---------------------------------------------------
 * A sentence-transformers model directory as mha_bert + mha_tokenizer (as
 * cli/embedder.c opens them).  Letters: n texts, T their ids packed, D the
 * hidden width.  Texts reach C as a tuple of str, read through their
 * cached UTF-8 (the tuple and its strings are immutable, so the pointers
 * stay valid without the GIL); tokenizing and embedding both run without
 * it.  The tokenizer is immutable (concurrent encodes are safe) but a model
 * runs one mha_bert_embed at a time (it keeps its workspace): embed takes
 * the embedder's lock, waiting for it without the GIL. */

#define EMBEDDER_CAPSULE "mha._mha.embedder"

typedef struct embedder {
    mha_bert *bert;
    mha_tokenizer *tok;
    PyThread_type_lock lock; /* held around mha_bert_embed */
} embedder;

static void embedder_free(embedder *e) {
    if (!e)
        return;
    mha_tokenizer_free(e->tok);
    mha_bert_free(e->bert);
    if (e->lock)
        PyThread_free_lock(e->lock);
    PyMem_RawFree(e);
}

static void embedder_destroy(PyObject *capsule) {
    embedder_free(PyCapsule_GetPointer(capsule, EMBEDDER_CAPSULE));
}

static embedder *embedder_of(PyObject *o) {
    return PyCapsule_GetPointer(o, EMBEDDER_CAPSULE);
}

/* embedder_open(model_dir) -> capsule: the model (config.json,
 * model.safetensors, modules.json, ...) and model_dir/tokenizer.json, whose
 * vocab must be the config's vocab_size. */
static PyObject *py_embedder_open(PyObject *self, PyObject *arg) {
    PyObject *bytes_dir = NULL;
    if (!PyUnicode_FSConverter(arg, &bytes_dir))
        return NULL;
    embedder *e = PyMem_RawCalloc(1, sizeof *e);
    if (!e || !(e->lock = PyThread_allocate_lock())) {
        Py_DECREF(bytes_dir);
        embedder_free(e);
        return PyErr_NoMemory();
    }
    const char *dir = PyBytes_AS_STRING(bytes_dir);
    size_t cap = strlen(dir) + sizeof "/tokenizer.json";
    char *tok_path = PyMem_RawMalloc(cap);
    if (!tok_path) {
        Py_DECREF(bytes_dir);
        embedder_free(e);
        return PyErr_NoMemory();
    }
    snprintf(tok_path, cap, "%s/tokenizer.json", dir);
    mha_status st;
    Py_BEGIN_ALLOW_THREADS st = mha_bert_open(&e->bert, dir);
    if (st == MHA_OK)
        st = mha_tokenizer_open(&e->tok, tok_path);
    Py_END_ALLOW_THREADS PyMem_RawFree(tok_path);
    if (st != MHA_OK) {
        Py_DECREF(bytes_dir);
        embedder_free(e);
        return raise_status(st);
    }
    int64_t vocab = mha_bert_get_info(e->bert)->vocab;
    if (mha_tokenizer_vocab_size(e->tok) != vocab) {
        PyErr_Format(PyExc_OSError, "%s/tokenizer.json has %lld tokens but config.json "
                     "vocab_size is %lld", dir, (long long)mha_tokenizer_vocab_size(e->tok),
                     (long long)vocab);
        Py_DECREF(bytes_dir);
        embedder_free(e);
        return NULL;
    }
    Py_DECREF(bytes_dir);
    PyObject *capsule = PyCapsule_New(e, EMBEDDER_CAPSULE, embedder_destroy);
    if (!capsule)
        embedder_free(e);
    return capsule;
}

/* embedder_info(capsule) -> dict of mha_bert_info (+ num_special) */
static PyObject *py_embedder_info(PyObject *self, PyObject *capsule) {
    embedder *e = embedder_of(capsule);
    if (!e)
        return NULL;
    const mha_bert_info *i = mha_bert_get_info(e->bert);
    return Py_BuildValue("{sLsLsLsLsLsLsLsLsfsssisL}", "hidden", (long long)i->hidden,
                         "heads", (long long)i->heads, "layers", (long long)i->layers,
                         "intermediate", (long long)i->intermediate, "vocab",
                         (long long)i->vocab, "max_positions", (long long)i->max_positions,
                         "max_seq_length", (long long)i->max_seq_length, "type_vocab",
                         (long long)i->type_vocab, "layer_norm_eps", (double)i->layer_norm_eps,
                         "pooling", i->pooling == MHA_BERT_POOL_CLS ? "cls" : "mean",
                         "normalize", i->normalize, "num_special",
                         (long long)mha_tokenizer_num_special(e->tok));
}

/* n texts as UTF-8: text[i][0..len[i]), pointers into the tuple's strings. */
typedef struct texts {
    Py_ssize_t n;
    const char **text;
    size_t *len;
} texts;

static void texts_free(texts *t) {
    PyMem_RawFree(t->text);
    PyMem_RawFree(t->len);
}

static int texts_of(PyObject *tuple, texts *t) {
    memset(t, 0, sizeof *t);
    if (!PyTuple_Check(tuple)) {
        PyErr_SetString(PyExc_TypeError, "_mha: texts must be a tuple of str");
        return 0;
    }
    t->n = PyTuple_GET_SIZE(tuple);
    t->text = PyMem_RawMalloc(sizeof *t->text * (size_t)(t->n + 1));
    t->len = PyMem_RawMalloc(sizeof *t->len * (size_t)(t->n + 1));
    if (!t->text || !t->len) {
        texts_free(t);
        PyErr_NoMemory();
        return 0;
    }
    for (Py_ssize_t i = 0; i < t->n; i++) {
        PyObject *s = PyTuple_GET_ITEM(tuple, i);
        Py_ssize_t len = 0;
        if (!PyUnicode_Check(s)) {
            PyErr_Format(PyExc_TypeError, "sentences[%zd]: %s is not a str", i,
                         Py_TYPE(s)->tp_name);
            texts_free(t);
            return 0;
        }
        if (!(t->text[i] = PyUnicode_AsUTF8AndSize(s, &len))) { /* a lone surrogate */
            texts_free(t);
            return 0;
        }
        t->len[i] = (size_t)len;
    }
    return 1;
}

/* ids[off[i] .. off[i+1]) = text i tokenized and truncated to max_length
 * ids (ids holds n * max_length); on failure *bad is the text's index.
 * Runs without the GIL. */
static mha_status encode_texts(const mha_tokenizer *tok, const texts *t, int64_t max_length,
                               int32_t *ids, int64_t *off, Py_ssize_t *bad) {
    off[0] = 0;
    for (Py_ssize_t i = 0; i < t->n; i++) {
        int64_t k = 0;
        mha_status st = mha_tokenizer_encode(tok, t->text[i], t->len[i], max_length,
                                             ids + off[i], max_length, &k);
        if (st != MHA_OK) {
            *bad = i;
            return st;
        }
        off[i + 1] = off[i] + k;
    }
    return MHA_OK;
}

/* Tokenizes the texts of tuple (n) without the GIL into *ids (T) and *off
 * (n+1), owned by the caller (PyMem_RawFree), or raises. */
static int tokenize_tuple(embedder *e, PyObject *tuple, PyObject *max_length_obj, texts *t,
                          int32_t **ids, int64_t **off) {
    int ok = 1;
    int64_t max_length = as_i64(max_length_obj, &ok);
    *ids = NULL, *off = NULL;
    if (!ok || !texts_of(tuple, t))
        return 0;
    const int64_t P = mha_bert_get_info(e->bert)->max_positions;
    if (max_length < 1 || max_length > P) {
        PyErr_Format(PyExc_ValueError, "max_seq_length: %lld, want 1..%lld (the model's "
                     "max_position_embeddings)", (long long)max_length, (long long)P);
        texts_free(t);
        return 0;
    }
    *ids = PyMem_RawMalloc(sizeof **ids * (size_t)(t->n * max_length + 1));
    *off = PyMem_RawMalloc(sizeof **off * (size_t)(t->n + 1));
    if (!*ids || !*off) {
        PyMem_RawFree(*ids), PyMem_RawFree(*off);
        texts_free(t);
        PyErr_NoMemory();
        return 0;
    }
    mha_status st;
    Py_ssize_t bad = -1;
    Py_BEGIN_ALLOW_THREADS st = encode_texts(e->tok, t, max_length, *ids, *off, &bad);
    Py_END_ALLOW_THREADS
    if (st == MHA_OK)
        return 1;
    PyErr_Format(status_exception(st), "%s: sentences[%zd]: %s", mha_status_string(st), bad,
                 mha_last_error());
    PyMem_RawFree(*ids), PyMem_RawFree(*off);
    texts_free(t);
    return 0;
}

/* embedder_tokenize(capsule, texts, max_length) -> [[id, ...], ...] */
static PyObject *py_embedder_tokenize(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    if (!check_nargs(nargs, 3, "embedder_tokenize"))
        return NULL;
    embedder *e = embedder_of(a[0]);
    texts t;
    int32_t *ids;
    int64_t *off;
    if (!e || !tokenize_tuple(e, a[1], a[2], &t, &ids, &off))
        return NULL;
    PyObject *list = PyList_New(t.n);
    for (Py_ssize_t i = 0; list && i < t.n; i++) {
        PyObject *row = PyList_New((Py_ssize_t)(off[i + 1] - off[i]));
        for (int64_t j = off[i]; row && j < off[i + 1]; j++) {
            PyObject *id = PyLong_FromLong(ids[j]);
            if (!id)
                Py_CLEAR(row);
            else
                PyList_SET_ITEM(row, (Py_ssize_t)(j - off[i]), id);
        }
        if (!row)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, row);
    }
    PyMem_RawFree(ids), PyMem_RawFree(off);
    texts_free(&t);
    return list;
}

/* embedder_embed(capsule, out (n,D) float32, texts (n), max_length) */
static PyObject *py_embedder_embed(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    if (!check_nargs(nargs, 4, "embedder_embed"))
        return NULL;
    embedder *e = embedder_of(a[0]);
    if (!e)
        return NULL;
    held h = {0};
    int ok = 1;
    mha_tensor *out = view(&h, a[1], "out", 1, &ok);
    FAIL_IF_NOT_OK(&h, ok);
    texts t;
    int32_t *ids;
    int64_t *off;
    if (!tokenize_tuple(e, a[2], a[3], &t, &ids, &off)) {
        release(&h);
        return NULL;
    }
    mha_status st;
    Py_BEGIN_ALLOW_THREADS PyThread_acquire_lock(e->lock, WAIT_LOCK);
    st = mha_bert_embed(e->bert, out, ids, off, (int64_t)t.n);
    PyThread_release_lock(e->lock);
    Py_END_ALLOW_THREADS PyMem_RawFree(ids), PyMem_RawFree(off);
    texts_free(&t);
    release(&h);
    if (st != MHA_OK)
        return raise_status(st);
    Py_RETURN_NONE;
}

/* ---- execution control ------------------------------------------------------ */

static PyObject *py_set_num_threads(PyObject *self, PyObject *arg) {
    int ok = 1;
    int64_t n = as_i64(arg, &ok);
    if (!ok)
        return NULL;
    if (n < 0 || n > 4096)
        return PyErr_Format(PyExc_ValueError, "num_threads: %lld, want 0..4096", (long long)n);
    mha_set_num_threads((int)n);
    Py_RETURN_NONE;
}

static PyObject *py_get_num_threads(PyObject *self, PyObject *unused) {
    return PyLong_FromLong(mha_get_num_threads());
}

static PyObject *py_kernel_name(PyObject *self, PyObject *arg) {
    int ok = 1;
    int64_t k = as_i64(arg, &ok);
    if (!ok)
        return NULL;
    return PyUnicode_FromString(mha_kernel_name(mha_kernel_resolve((mha_kernel)k)));
}

static PyObject *py_noop(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"sdpa", (PyCFunction)(void (*)(void))py_sdpa, METH_FASTCALL, "mha_sdpa_forward"},
    {"sdpa_backward", (PyCFunction)(void (*)(void))py_sdpa_backward, METH_FASTCALL,
     "mha_sdpa_backward (adds into dq, dk, dv)"},
    {"multihead", (PyCFunction)(void (*)(void))py_multihead, METH_FASTCALL,
     "mha_multihead_forward"},
    {"encoder_layer", (PyCFunction)(void (*)(void))py_encoder_layer, METH_FASTCALL,
     "mha_encoder_layer_forward"},
    {"decoder_layer", (PyCFunction)(void (*)(void))py_decoder_layer, METH_FASTCALL,
     "mha_decoder_layer_forward"},
    {"onnx_attention_shapes", (PyCFunction)(void (*)(void))py_onnx_shapes, METH_FASTCALL,
     "mha_onnx_attention_shapes_get"},
    {"onnx_attention", (PyCFunction)(void (*)(void))py_onnx_attention, METH_FASTCALL,
     "mha_onnx_attention"},
    {"kv_cache_create", (PyCFunction)(void (*)(void))py_kv_cache_create, METH_FASTCALL,
     "mha_kv_cache_create"},
    {"kv_cache_append", (PyCFunction)(void (*)(void))py_kv_cache_append, METH_FASTCALL,
     "mha_kv_cache_append"},
    {"kv_cache_reset", py_kv_cache_reset, METH_O, "mha_kv_cache_reset"},
    {"kv_cache_info", py_kv_cache_info, METH_O, "(position, length)"},
    {"attention_decode", (PyCFunction)(void (*)(void))py_attention_decode, METH_FASTCALL,
     "mha_attention_decode"},
    {"safetensors_load", py_safetensors_load, METH_O, "[(name, shape, float32 bytes)]"},
    {"embedder_open", py_embedder_open, METH_O, "mha_bert_open + mha_tokenizer_open"},
    {"embedder_info", py_embedder_info, METH_O, "mha_bert_get_info as a dict"},
    {"embedder_tokenize", (PyCFunction)(void (*)(void))py_embedder_tokenize, METH_FASTCALL,
     "mha_tokenizer_encode of each text"},
    {"embedder_embed", (PyCFunction)(void (*)(void))py_embedder_embed, METH_FASTCALL,
     "tokenize + mha_bert_embed"},
    {"set_num_threads", py_set_num_threads, METH_O, "mha_set_num_threads"},
    {"get_num_threads", py_get_num_threads, METH_NOARGS, "mha_get_num_threads"},
    {"kernel_name", py_kernel_name, METH_O, "name of the kernel a request resolves to"},
    {"noop", (PyCFunction)(void (*)(void))py_noop, METH_FASTCALL,
     "does nothing: the floor of a call, for bench/python_bench.py"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_mha",
                                    "mha's C library behind the buffer protocol", -1, methods};

PyMODINIT_FUNC PyInit__mha(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    if (PyType_Ready(&bf16_type) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&bf16_type);
    if (PyModule_AddObject(m, "bf16", (PyObject *)&bf16_type) != 0) {
        Py_DECREF(&bf16_type);
        Py_DECREF(m);
        return NULL;
    }
    LayoutError = PyErr_NewException("mha._mha.LayoutError", PyExc_ValueError, NULL);
    Py_XINCREF(LayoutError); /* one reference for the module, one for this file */
    if (!LayoutError || PyModule_AddObject(m, "LayoutError", LayoutError) != 0 ||
        PyModule_AddStringConstant(m, "version", mha_version()) != 0 ||
        PyModule_AddStringConstant(m, "source_root", MHA_SOURCE_ROOT) != 0)
        Py_CLEAR(m);
    return m;
}
