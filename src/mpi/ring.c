/* ring.c - sequence-parallel ring attention over MPI, forward and backward
 * (include/mha_mpi.h; docs/distributed.md).
 *
 * Letter legend: B batch, H query heads, Hkv kv heads, P ranks, n or Ll a
 * rank's local rows, d head dim of q/k, dv head dim of v.
 *
 * ref: Liu, Zaharia, Abbeel, "Ring Attention with Blockwise Transformers for
 * Near-Infinite Context" (2023); the zigzag layout of ring-flash-attention
 * and Megatron-LM's context parallelism.
 *
 * A rank's shard is one segment of global rows (contiguous) or two
 * (zigzag).  At step t = 0..P-1 rank r holds the K/V shard of rank
 * s = r - t (mod P) in one of two packed buffers [K (B,Hkv,n_s,d) | V
 * (B,Hkv,n_s,dv)]; it posts MPI_Isend of that buffer to r+1 and MPI_Irecv
 * of shard s-1 from r-1 into the other buffer, computes its Q pieces
 * against shard s (MPI_Testall between pieces, so the transfer progresses
 * while it computes), then waits.  A shard is sent only when some rank
 * further along the ring can see part of it (causal contiguous: never past
 * the last rank).
 *
 * Forward: per (Q piece, K segment) block, mha_sdpa_forward with the
 * block's causal offset (MHA_CAUSAL_OFFSET, global positions) and lse
 * output; the running result (in the caller's out) and the block are
 * merged by mha_attention_merge through piece-sized scratch, so a rank
 * holds its Q/K/V/O shards, two K/V buffers and O(L/(8P)) rows more.
 * Backward: per block, mha_sdpa_backward with the global out and lse of the
 * rows (P and D = dout.out are then the global ones: the block's gradient is
 * exact); dq adds into the caller's dq; the block's dK/dV go into a zeroed
 * scratch that is added to the accumulator of shard s arriving from r-1,
 * which is then sent on to r+1; after P steps it reaches its owner.
 * Order of every sum is fixed by P and the shapes: bit-identical run to run.
 */
#include "mpi_internal.h"

#include <stdio.h>
#include <string.h>

enum { MAX_SEGS = 2, MAX_PIECES = 16, PIECES_PER_SEG = 8, PIECE_MIN_ROWS = 256 };
enum { TAG_KV = 0x6d68, TAG_DKV = 0x6d69 };
enum { MSG_BYTES = 512 };

/* Rows [start, start + len) of the global sequence, at local row `local`. */
typedef struct segment {
    int64_t start, len, local;
} segment;

typedef enum block_kind { BLOCK_NONE, BLOCK_FULL, BLOCK_DIAG } block_kind;

typedef struct ring {
    MPI_Comm comm; /* our duplicate of the caller's */
    int P, rank;
    int64_t B, H, Hkv, d, dv;
    int64_t *rows;  /* (P) L_r of every rank */
    int64_t *first; /* (P) contiguous layout: o_r */
    int64_t nmax;
    mha_ring_layout layout;
    bool causal;
    int64_t causal_offset; /* global: key j visible from row i when j <= i + offset */
    const mha_tensor *kv_lengths; /* (B) global, or NULL */
    mha_sdpa_options blk;         /* the block calls' options */
    int64_t *kvlen_local;         /* (B) one block's kv_lengths */
    mha_tensor kvlen_t;
    MPI_Request req[8];
    int nreq;
    mha_status status; /* first compute failure; the ring keeps moving */
    mha_ring_stats stats;
} ring;

/* ---- errors agreed by every rank ------------------------------------------ */

static mha_status mpi_fail(int rc, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, s, &n);
    return mha_error(MHA_ERR_IO, "%s failed: %s", what, s);
}

/* Every rank gets the largest status of any rank and that rank's message. */
static mha_status agree(MPI_Comm comm, int rank, mha_status st) {
    int in[2] = {(int)st, rank}, worst[2];
    int rc = MPI_Allreduce(in, worst, 1, MPI_2INT, MPI_MAXLOC, comm);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "MPI_Allreduce");
    if (worst[0] == MHA_OK)
        return MHA_OK;
    char msg[MSG_BYTES] = {0};
    if (rank == worst[1])
        snprintf(msg, sizeof msg, "%s", mha_last_error());
    rc = MPI_Bcast(msg, MSG_BYTES, MPI_CHAR, worst[1], comm);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "MPI_Bcast");
    msg[MSG_BYTES - 1] = 0;
    if (!strncmp(msg, "rank ", 5)) /* already agreed once: keep it */
        return mha_error((mha_status)worst[0], "%s", msg);
    return mha_error((mha_status)worst[0], "rank %d: %s", worst[1], msg);
}

mha_status mha_mpi_agree(MPI_Comm comm, mha_status st) {
    int rank = 0;
    if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS)
        return mha_error(MHA_ERR_IO, "MPI_Comm_rank failed (an invalid communicator?)");
    return agree(comm, rank, st);
}

/* ---- views ----------------------------------------------------------------- */

/* Rows [a, a + n) of dimension 2 of a (B,H,N,x) or (B,H,N) view. */
static mha_tensor rows_of(const mha_tensor *t, int64_t a, int64_t n) {
    mha_tensor r = *t;
    r.data = (float *)t->data + a * t->stride[2];
    r.shape[2] = n;
    return r;
}

/* A packed (B,Hh,n,x) view at base (x = 0: the (B,Hh,n) view). */
static mha_tensor packed(float *base, int64_t B, int64_t Hh, int64_t n, int64_t x) {
    mha_tensor t;
    if (x > 0)
        mha_tensor_init(&t, MHA_F32, base, 4, (int64_t[]){B, Hh, n, x});
    else
        mha_tensor_init(&t, MHA_F32, base, 3, (int64_t[]){B, Hh, n});
    return t;
}

/* dst = src (add: dst += src) over two views of one (B,H,N[,x]) shape. */
static void move_rows(const mha_tensor *dst, const mha_tensor *src, bool add) {
    const int64_t X = dst->ndim == 4 ? dst->shape[3] : 1;
    const int64_t dx = dst->ndim == 4 ? dst->stride[3] : 0, sx = src->ndim == 4 ? src->stride[3] : 0;
    float *o = dst->data;
    const float *s = src->data;
    for (int64_t b = 0; b < dst->shape[0]; b++)
        for (int64_t h = 0; h < dst->shape[1]; h++)
            for (int64_t i = 0; i < dst->shape[2]; i++) {
                float *orow = o + b * dst->stride[0] + h * dst->stride[1] + i * dst->stride[2];
                const float *srow = s + b * src->stride[0] + h * src->stride[1] + i * src->stride[2];
                for (int64_t c = 0; c < X; c++)
                    orow[c * dx] = add ? orow[c * dx] + srow[c * sx] : srow[c * sx];
            }
}

/* The K and V views of a packed shard buffer of n rows. */
static void shard_views(const ring *R, float *buf, int64_t n, mha_tensor *k, mha_tensor *v) {
    *k = packed(buf, R->B, R->Hkv, n, R->d);
    *v = packed(buf + R->B * R->Hkv * n * R->d, R->B, R->Hkv, n, R->dv);
}

/* The caller's k (B,Hkv,n,d), v (B,Hkv,n,dv) into a packed shard buffer. */
static void pack_own_shard(const ring *R, float *buf, int64_t n, const mha_tensor *k,
                           const mha_tensor *v) {
    mha_tensor ks, vs;
    shard_views(R, buf, n, &ks, &vs);
    move_rows(&ks, k, false);
    move_rows(&vs, v, false);
}

static int64_t shard_floats(const ring *R, int64_t n) { return R->B * R->Hkv * n * (R->d + R->dv); }

/* ---- the layout ------------------------------------------------------------ */

static int segments_of(const ring *R, int rank, segment *seg) {
    if (R->layout == MHA_RING_ZIGZAG) {
        const int64_t c = R->rows[rank] / 2;
        seg[0] = (segment){rank * c, c, 0};
        seg[1] = (segment){(2 * (int64_t)R->P - 1 - rank) * c, c, c};
        return 2;
    }
    seg[0] = (segment){R->first[rank], R->rows[rank], 0};
    return 1;
}

/* Q pieces of this rank: each segment cut into up to PIECES_PER_SEG pieces
 * (between pieces the pending transfers are polled). */
static int pieces_of(const ring *R, segment *piece) {
    segment seg[MAX_SEGS];
    const int ns = segments_of(R, R->rank, seg);
    int np = 0;
    for (int g = 0; g < ns; g++) {
        int64_t k = seg[g].len / PIECE_MIN_ROWS;
        k = k < 1 ? 1 : k > PIECES_PER_SEG ? PIECES_PER_SEG : k;
        for (int64_t p = 0; p < k; p++) {
            const int64_t a = seg[g].len * p / k, e = seg[g].len * (p + 1) / k;
            piece[np++] = (segment){seg[g].start + a, e - a, seg[g].local + a};
        }
    }
    return np;
}

/* Which keys of segment ks the rows of qs see (causal only). */
static block_kind classify(const ring *R, segment qs, segment ks, int64_t *offset) {
    if (qs.len == 0 || ks.len == 0)
        return BLOCK_NONE;
    if (!R->causal)
        return BLOCK_FULL;
    *offset = qs.start - ks.start + R->causal_offset; /* local j visible when j <= i + offset */
    if (ks.start > qs.start + qs.len - 1 + R->causal_offset)
        return BLOCK_NONE;
    if (ks.start + ks.len - 1 <= qs.start + R->causal_offset)
        return BLOCK_FULL;
    return BLOCK_DIAG;
}

/* Does rank u see any key of shard s? */
static bool needs(const ring *R, int u, int s) {
    segment qs[MAX_SEGS], ks[MAX_SEGS];
    const int nq = segments_of(R, u, qs), nk = segments_of(R, s, ks);
    int64_t off;
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < nk; j++)
            if (classify(R, qs[i], ks[j], &off) != BLOCK_NONE)
                return true;
    return false;
}

/* Does rank u, holding shard u - t at step t, pass it on to u + 1? */
static bool kv_travels(const ring *R, int u, int t) {
    const int s = ((u - t) % R->P + R->P) % R->P;
    for (int m = 1; m <= R->P - 1 - t; m++)
        if (needs(R, (u + m) % R->P, s))
            return true;
    return false;
}

/* The options of one block; false when kv_lengths leave it empty. */
static bool block_options(ring *R, segment qs, segment ks, mha_sdpa_options *o) {
    int64_t off = 0;
    const block_kind kind = classify(R, qs, ks, &off);
    if (kind == BLOCK_NONE)
        return false;
    *o = R->blk;
    o->causal = kind == BLOCK_DIAG ? MHA_CAUSAL_OFFSET : MHA_CAUSAL_NONE;
    o->causal_offset = off;
    o->kv_lengths = NULL;
    if (R->kv_lengths) {
        bool any = false, all = true;
        for (int64_t b = 0; b < R->B; b++) {
            int64_t n = ((const int64_t *)R->kv_lengths->data)[b * R->kv_lengths->stride[0]] -
                        ks.start;
            n = n < 0 ? 0 : n > ks.len ? ks.len : n;
            R->kvlen_local[b] = n;
            any |= n > 0;
            all &= n == ks.len;
        }
        if (!any)
            return false;
        if (!all)
            o->kv_lengths = &R->kvlen_t;
    }
    R->stats.blocks++;
    return true;
}

/* ---- communication --------------------------------------------------------- */

static mha_status post(ring *R, bool send, float *buf, int64_t floats, int peer, int tag) {
    MPI_Request *rq = &R->req[R->nreq++];
    int rc = send ? MPI_Isend(buf, (int)floats, MPI_FLOAT, peer, tag, R->comm, rq)
                  : MPI_Irecv(buf, (int)floats, MPI_FLOAT, peer, tag, R->comm, rq);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, send ? "MPI_Isend" : "MPI_Irecv");
    if (send) {
        R->stats.bytes_sent += floats * (int64_t)sizeof(float);
        R->stats.messages++;
    }
    return MHA_OK;
}

/* Lets pending transfers progress (between compute pieces). */
static void poll(ring *R) {
    int done;
    if (R->nreq)
        MPI_Testall(R->nreq, R->req, &done, MPI_STATUSES_IGNORE);
}

static mha_status wait_all(ring *R) {
    const double t0 = MPI_Wtime();
    int rc = R->nreq ? MPI_Waitall(R->nreq, R->req, MPI_STATUSES_IGNORE) : MPI_SUCCESS;
    R->nreq = 0;
    R->stats.wait_seconds += MPI_Wtime() - t0;
    return rc == MPI_SUCCESS ? MHA_OK : mpi_fail(rc, "MPI_Waitall");
}

/* Step t's K/V transfers: shard s out of kv_now to r+1, shard s-1 from r-1
 * into kv_next, each only when someone further on needs it. */
static mha_status post_kv(ring *R, int t, float *kv_now, float *kv_next) {
    if (t >= R->P - 1)
        return MHA_OK;
    const int next = (R->rank + 1) % R->P, prev = (R->rank + R->P - 1) % R->P;
    const int s = (R->rank - t + R->P) % R->P, s_in = (s + R->P - 1) % R->P;
    if (kv_travels(R, R->rank, t))
        MHA_TRY(post(R, true, kv_now, shard_floats(R, R->rows[s]), next, TAG_KV));
    if (kv_travels(R, prev, t))
        MHA_TRY(post(R, false, kv_next, shard_floats(R, R->rows[s_in]), prev, TAG_KV));
    return MHA_OK;
}

/* ---- setup shared by forward and backward ---------------------------------- */

/* A float32 tensor of exactly the shape want (ndim 3 or 4). */
static mha_status check_dims(const mha_tensor *t, const char *name, int ndim, const int64_t *want) {
    char sb[MHA_SHAPE_BUF], wb[MHA_SHAPE_BUF];
    MHA_TRY(mha_check_tensor(t, name, ndim, MHA_F32));
    bool same = true;
    for (int i = 0; i < ndim; i++)
        same &= t->shape[i] == want[i];
    mha_tensor w = {0};
    w.ndim = ndim;
    memcpy(w.shape, want, sizeof(int64_t) * (size_t)ndim);
    MHA_CHECK(same, MHA_ERR_SHAPE, "%s: shape %s, want %s", name, mha_shape_str(t, sb, sizeof sb),
              mha_shape_str(&w, wb, sizeof wb));
    return MHA_OK;
}

static mha_status check4(const mha_tensor *t, const char *name, int64_t a, int64_t b, int64_t c,
                         int64_t e) {
    return check_dims(t, name, 4, (int64_t[]){a, b, c, e});
}

static mha_status check_lse(const mha_tensor *t, const char *name, int64_t B, int64_t H,
                            int64_t n) {
    return check_dims(t, name, 3, (int64_t[]){B, H, n});
}

/* An output: writable, overlapping none of the n inputs. */
static mha_status check_output(const mha_tensor *t, const char *name,
                               const mha_tensor *const *inputs, int n) {
    MHA_TRY(mha_check_writable(t, name));
    for (int i = 0; i < n; i++)
        MHA_CHECK(!inputs[i] || !mha_tensors_overlap(t, inputs[i]), MHA_ERR_ALIAS,
                  "%s: overlaps an input", name);
    return MHA_OK;
}

/* This rank's q, k, v and options (outputs are checked by the callers). */
static mha_status check_inputs(ring *R, const mha_tensor *q, const mha_tensor *k,
                               const mha_tensor *v, const mha_ring_options *opt) {
    char s1[MHA_SHAPE_BUF], s2[MHA_SHAPE_BUF];
    MHA_TRY(mha_check_tensor(q, "q", 4, MHA_F32));
    MHA_TRY(mha_check_tensor(k, "k", 4, MHA_F32));
    MHA_TRY(mha_check_tensor(v, "v", 4, MHA_F32));
    R->B = q->shape[0], R->H = q->shape[1], R->d = q->shape[3];
    R->Hkv = k->shape[1], R->dv = v->shape[3];
    const int64_t n = q->shape[2];
    MHA_CHECK(k->shape[0] == R->B && k->shape[2] == n && k->shape[3] == R->d, MHA_ERR_SHAPE,
              "k: shape %s does not fit q %s (want (B,Hkv,Ll,d))", mha_shape_str(k, s1, sizeof s1),
              mha_shape_str(q, s2, sizeof s2));
    MHA_CHECK(v->shape[0] == R->B && v->shape[1] == R->Hkv && v->shape[2] == n, MHA_ERR_SHAPE,
              "v: shape %s does not fit k %s (want (B,Hkv,Ll,dv))",
              mha_shape_str(v, s1, sizeof s1), mha_shape_str(k, s2, sizeof s2));
    MHA_CHECK(R->d > 0 && R->dv > 0, MHA_ERR_SHAPE, "q/v: head dims d = %lld, dv = %lld",
              (long long)R->d, (long long)R->dv);
    MHA_CHECK(R->Hkv > 0 && R->H % R->Hkv == 0, MHA_ERR_SHAPE,
              "k: %lld kv heads do not divide %lld query heads", (long long)R->Hkv,
              (long long)R->H);
    const mha_sdpa_options *o = &opt->sdpa;
    MHA_CHECK(opt->layout == MHA_RING_CONTIGUOUS || opt->layout == MHA_RING_ZIGZAG,
              MHA_ERR_VALUE, "layout: unknown layout %d", (int)opt->layout);
    MHA_CHECK(!o->attn_mask && !o->key_padding_mask && !o->attn_weights && !o->qk_out &&
                  !o->alibi_slopes && !o->sinks && !o->causal_offsets && !o->lse,
              MHA_ERR_UNSUPPORTED,
              "sdpa: attn_mask, key_padding_mask, attn_weights, qk_out, alibi_slopes, sinks, "
              "causal_offsets and lse are not served across ranks (ring attention)");
    MHA_CHECK(!(o->training && o->dropout_p > 0.0f), MHA_ERR_UNSUPPORTED,
              "sdpa: dropout is not served across ranks (ring attention)");
    MHA_CHECK(o->window_left < 0 && o->window_right < 0 && o->rope == MHA_ROPE_NONE,
              MHA_ERR_UNSUPPORTED, "sdpa: window and rope are not served across ranks");
    MHA_CHECK(!o->scale_set || isfinite(o->scale), MHA_ERR_VALUE, "scale: %g is not finite",
              (double)o->scale);
    MHA_CHECK(isfinite(o->softcap) && o->softcap >= 0.0f, MHA_ERR_VALUE,
              "softcap: %g, want >= 0 and finite", (double)o->softcap);
    MHA_CHECK(o->masked_rows == MHA_MASKED_ROWS_ZERO || o->masked_rows == MHA_MASKED_ROWS_NAN,
              MHA_ERR_VALUE, "masked_rows: unknown policy %d", (int)o->masked_rows);
    switch (o->causal) {
    case MHA_CAUSAL_NONE: R->causal = false; break;
    case MHA_CAUSAL_TOP_LEFT: R->causal = true, R->causal_offset = 0; break;
    case MHA_CAUSAL_BOTTOM_RIGHT:
        MHA_CHECK(!o->kv_lengths, MHA_ERR_UNSUPPORTED,
                  "causal: BOTTOM_RIGHT with kv_lengths is not served across ranks");
        R->causal = true, R->causal_offset = 0; /* self-attention: S = L */
        break;
    case MHA_CAUSAL_OFFSET: R->causal = true, R->causal_offset = o->causal_offset; break;
    default: return mha_error(MHA_ERR_VALUE, "causal: unknown mode %d", (int)o->causal);
    }
    const int64_t lim = (int64_t)1 << 60;
    MHA_CHECK(R->causal_offset > -lim && R->causal_offset < lim, MHA_ERR_VALUE,
              "causal_offset: %lld out of range", (long long)R->causal_offset);
    if (o->kv_lengths) {
        const mha_tensor *kl = o->kv_lengths;
        MHA_TRY(mha_check_tensor(kl, "kv_lengths", 1, MHA_I64));
        MHA_CHECK(kl->shape[0] == R->B, MHA_ERR_SHAPE, "kv_lengths: shape %s, want (B) = (%lld)",
                  mha_shape_str(kl, s1, sizeof s1), (long long)R->B);
        for (int64_t b = 0; b < R->B; b++) {
            int64_t x = ((const int64_t *)kl->data)[b * kl->stride[0]];
            MHA_CHECK(x > -lim && x < lim, MHA_ERR_VALUE, "kv_lengths: batch %lld has %lld",
                      (long long)b, (long long)x);
        }
    }
    R->kv_lengths = o->kv_lengths;
    R->layout = opt->layout;
    R->blk = *o;
    R->blk.masked_rows = MHA_MASKED_ROWS_ZERO; /* the policy is applied after the merge */
    return MHA_OK;
}

/* Every rank's sizes and options equal rank 0's (same verdict on every rank:
 * they all judge the same gathered table). */
static mha_status check_agreement(ring *R, int64_t n, const mha_ring_options *opt) {
    enum { F = 14 };
    const mha_sdpa_options *o = &opt->sdpa;
    uint32_t scale_bits = 0, cap_bits = 0;
    float scale = o->scale_set ? o->scale : 0.0f;
    memcpy(&scale_bits, &scale, 4);
    memcpy(&cap_bits, &o->softcap, 4);
    const int64_t mine[F] = {R->B,          R->H,          R->Hkv,       R->d,
                             R->dv,         R->layout,     o->causal,    R->causal_offset,
                             scale_bits,    cap_bits,      !!o->kv_lengths, o->masked_rows,
                             o->onnx_scale, n};
    static const char *const names[F - 1] = {"B", "H", "Hkv", "d", "dv", "layout", "causal",
                                             "causal_offset", "scale", "softcap",
                                             "kv_lengths given", "masked_rows", "onnx_scale"};
    int64_t *all = mha_malloc(sizeof(int64_t) * F * (size_t)R->P);
    MHA_CHECK(all, MHA_ERR_NOMEM, "ring: out of memory for %d ranks", R->P);
    int rc = MPI_Allgather(mine, F, MPI_INT64_T, all, F, MPI_INT64_T, R->comm);
    if (rc != MPI_SUCCESS) {
        mha_free(all);
        return mpi_fail(rc, "MPI_Allgather");
    }
    mha_status st = MHA_OK;
    for (int p = 1; p < R->P && st == MHA_OK; p++)
        for (int f = 0; f < F - 1 && st == MHA_OK; f++)
            if (all[p * F + f] != all[f])
                st = mha_error(MHA_ERR_VALUE, "rank %d: %s is %lld but rank 0 has %lld", p,
                               names[f], (long long)all[p * F + f], (long long)all[f]);
    int64_t total = 0;
    for (int p = 0; p < R->P; p++) {
        R->rows[p] = all[p * F + F - 1];
        R->first[p] = total;
        total += R->rows[p];
        R->nmax = R->rows[p] > R->nmax ? R->rows[p] : R->nmax;
    }
    mha_free(all);
    MHA_TRY(st);
    if (R->layout == MHA_RING_ZIGZAG)
        for (int p = 0; p < R->P; p++)
            MHA_CHECK(R->rows[p] == R->rows[0] && R->rows[p] % 2 == 0, MHA_ERR_SHAPE,
                      "layout zigzag: rank %d holds %lld rows and rank 0 %lld; zigzag needs "
                      "every rank to hold 2 of 2P = %d equal chunks (L = %lld rows in all; "
                      "use the contiguous layout for uneven shards)",
                      p, (long long)R->rows[p], (long long)R->rows[0], 2 * R->P, (long long)total);
    int64_t floats;
    MHA_CHECK(mha_product((int64_t[]){R->B, R->Hkv, R->nmax, R->d + R->dv}, 4, &floats) &&
                  floats <= INT32_MAX,
              MHA_ERR_OVERFLOW,
              "k/v: a shard of (B,Hkv,Ll,d+dv) = (%lld,%lld,%lld,%lld) floats exceeds one MPI "
              "message (2^31-1 elements); use more ranks",
              (long long)R->B, (long long)R->Hkv, (long long)R->nmax, (long long)(R->d + R->dv));
    if (R->kv_lengths) { /* the same key lengths everywhere (they steer the ring) */
        int64_t *root = mha_malloc(sizeof(int64_t) * (size_t)(R->B ? R->B : 1));
        MHA_CHECK(root, MHA_ERR_NOMEM, "ring: out of memory");
        for (int64_t b = 0; b < R->B; b++)
            root[b] = ((const int64_t *)R->kv_lengths->data)[b * R->kv_lengths->stride[0]];
        rc = MPI_Bcast(root, (int)R->B, MPI_INT64_T, 0, R->comm);
        for (int64_t b = 0; b < R->B && rc == MPI_SUCCESS && st == MHA_OK; b++)
            if (root[b] != ((const int64_t *)R->kv_lengths->data)[b * R->kv_lengths->stride[0]])
                st = mha_error(MHA_ERR_VALUE, "kv_lengths: batch %lld differs from rank 0's",
                               (long long)b);
        mha_free(root);
        if (rc != MPI_SUCCESS)
            return mpi_fail(rc, "MPI_Bcast");
    }
    return st;
}

/* A zeroed ring and this rank's checked inputs; *n its rows. */
static mha_status ring_init(ring *R, const mha_tensor *q, const mha_tensor *k, const mha_tensor *v,
                            const mha_ring_options *opt, int64_t *n) {
    memset(R, 0, sizeof *R);
    R->comm = MPI_COMM_NULL;
    MHA_TRY(check_inputs(R, q, k, v, opt));
    *n = q->shape[2];
    return MHA_OK;
}

/* Duplicates comm, checks locally, agrees, gathers the sizes; on failure
 * every rank returns the same status. */
static mha_status ring_begin(ring *R, MPI_Comm comm, mha_status local, int64_t n,
                             const mha_ring_options *opt) {
    int rc = MPI_Comm_dup(comm, &R->comm);
    if (rc != MPI_SUCCESS)
        return mpi_fail(rc, "MPI_Comm_dup");
    MPI_Comm_set_errhandler(R->comm, MPI_ERRORS_RETURN);
    MPI_Comm_size(R->comm, &R->P);
    MPI_Comm_rank(R->comm, &R->rank);
    MHA_TRY(agree(R->comm, R->rank, local));
    R->rows = mha_calloc((size_t)R->P * 2 + (size_t)(R->B > 0 ? R->B : 1), sizeof(int64_t));
    mha_status st = R->rows ? MHA_OK : mha_error(MHA_ERR_NOMEM, "ring: out of memory");
    MHA_TRY(agree(R->comm, R->rank, st));
    R->first = R->rows + R->P;
    R->kvlen_local = R->first + R->P;
    mha_tensor_init(&R->kvlen_t, MHA_I64, R->kvlen_local, 1, (int64_t[]){R->B});
    st = check_agreement(R, n, opt);
    return agree(R->comm, R->rank, st);
}

static void ring_end(ring *R, const mha_ring_options *opt, double t0, mha_status st) {
    if (st == MHA_OK && opt && opt->stats) {
        R->stats.total_seconds = MPI_Wtime() - t0;
        *opt->stats = R->stats;
    }
    mha_free(R->rows);
    if (R->comm != MPI_COMM_NULL)
        MPI_Comm_free(&R->comm);
}

void mha_ring_options_init(mha_ring_options *opt) {
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    mha_sdpa_options_init(&opt->sdpa);
    opt->layout = MHA_RING_CONTIGUOUS;
}

/* ---- forward --------------------------------------------------------------- */

typedef struct fwd_state {
    mha_tensor out, lse;    /* (B,H,n,dv) the caller's out, (B,H,n) its lse */
    float *blk, *mrg;       /* piece-sized scratch: a block's out+lse, the merge's */
    bool started[MAX_PIECES]; /* the piece holds a partial result */
    segment piece[MAX_PIECES];
    int npieces;
} fwd_state;

/* Packed (B,H,rows,dv) out and (B,H,rows) lse views of a piece scratch. */
static void scratch_views(const ring *R, float *base, int64_t rows, mha_tensor *o, mha_tensor *l) {
    *o = packed(base, R->B, R->H, rows, R->dv);
    *l = packed(base + R->B * R->H * rows * R->dv, R->B, R->H, rows, 0);
}

/* This rank's Q pieces against shard s (views k, v of the shard buffer).
 * A piece's first block writes straight into out/lse; a later one into the
 * block scratch, merged with the running result into the merge scratch,
 * which is copied back (merge's output must not alias its parts). */
static void forward_shard(ring *R, fwd_state *F, const mha_tensor *q, int s, const mha_tensor *k,
                          const mha_tensor *v) {
    segment ks[MAX_SEGS];
    const int nk = segments_of(R, s, ks);
    const double t0 = MPI_Wtime();
    for (int p = 0; p < F->npieces && R->status == MHA_OK; p++)
        for (int j = 0; j < nk && R->status == MHA_OK; j++) {
            mha_sdpa_options o;
            const segment qp = F->piece[p];
            if (!block_options(R, qp, ks[j], &o))
                continue;
            const mha_tensor qv = rows_of(q, qp.local, qp.len);
            const mha_tensor kv = rows_of(k, ks[j].local, ks[j].len);
            const mha_tensor vv = rows_of(v, ks[j].local, ks[j].len);
            mha_tensor acc_o = rows_of(&F->out, qp.local, qp.len);
            mha_tensor acc_l = rows_of(&F->lse, qp.local, qp.len);
            mha_tensor blk_o, blk_l, mrg_o, mrg_l;
            scratch_views(R, F->blk, qp.len, &blk_o, &blk_l);
            scratch_views(R, F->mrg, qp.len, &mrg_o, &mrg_l);
            const bool first = !F->started[p];
            o.lse = first ? &acc_l : &blk_l;
            mha_status st = mha_sdpa_forward(first ? &acc_o : &blk_o, &qv, &kv, &vv, &o);
            if (st == MHA_OK && !first) {
                const mha_tensor *parts_out[2] = {&acc_o, &blk_o}, *parts_lse[2] = {&acc_l, &blk_l};
                st = mha_attention_merge(&mrg_o, &mrg_l, 2, parts_out, parts_lse);
                move_rows(&acc_o, &mrg_o, false);
                move_rows(&acc_l, &mrg_l, false);
            }
            F->started[p] = true;
            R->status = st;
            poll(R);
        }
    R->stats.compute_seconds += MPI_Wtime() - t0;
}

/* Rows no key reached: lse -inf and the masked-rows policy; lse out. */
static void forward_finish(const ring *R, fwd_state *F, mha_tensor *lse, mha_masked_rows policy) {
    const mha_tensor *o0 = &F->out, *l0 = &F->lse;
    for (int p = 0; p < F->npieces; p++)
        for (int64_t b = 0; b < R->B; b++)
            for (int64_t h = 0; h < R->H; h++)
                for (int64_t i = F->piece[p].local; i < F->piece[p].local + F->piece[p].len; i++) {
                    float *l = (float *)l0->data + b * l0->stride[0] + h * l0->stride[1] + i * l0->stride[2];
                    float *o = (float *)o0->data + b * o0->stride[0] + h * o0->stride[1] + i * o0->stride[2];
                    if (!F->started[p])
                        *l = -INFINITY;
                    if (*l == -INFINITY)
                        for (int64_t c = 0; c < R->dv; c++)
                            o[c * o0->stride[3]] = policy == MHA_MASKED_ROWS_NAN ? NAN : 0.0f;
                }
    if (lse)
        move_rows(lse, &F->lse, false);
}

mha_status mha_ring_attention_forward(MPI_Comm comm, mha_tensor *out, mha_tensor *lse,
                                      const mha_tensor *q, const mha_tensor *k,
                                      const mha_tensor *v, const mha_ring_options *opt) {
    MHA_OPTIONS_DEFAULT(mha_ring_options, opt);
    const double t0 = MPI_Wtime();
    ring R;
    int64_t n = 0;
    mha_status st = ring_init(&R, q, k, v, opt, &n);
    if (st == MHA_OK) {
        const mha_tensor *in[] = {q, k, v};
        st = check4(out, "out", R.B, R.H, n, R.dv);
        if (st == MHA_OK)
            st = check_output(out, "out", in, 3);
        if (st == MHA_OK && lse)
            st = check_lse(lse, "lse", R.B, R.H, n);
        if (st == MHA_OK && lse)
            st = check_output(lse, "lse", (const mha_tensor *[]){q, k, v, out}, 4);
    }
    if ((st = ring_begin(&R, comm, st, n, opt)) != MHA_OK) {
        ring_end(&R, opt, t0, st);
        return st;
    }
    fwd_state F;
    memset(&F, 0, sizeof F);
    F.npieces = pieces_of(&R, F.piece);
    int64_t rows = 0;
    for (int p = 0; p < F.npieces; p++)
        rows = F.piece[p].len > rows ? F.piece[p].len : rows;
    /* one allocation: two K/V shard buffers, the running lse (B,H,n), two
     * piece scratches of (B,H,rows,dv) + (B,H,rows) */
    const int64_t kvf = shard_floats(&R, R.nmax), sf = R.B * R.H * rows * (R.dv + 1);
    float *buf = mha_malloc(sizeof(float) * (size_t)(2 * kvf + R.B * R.H * n + 2 * sf + 1));
    st = agree(R.comm, R.rank, buf ? MHA_OK : mha_error(MHA_ERR_NOMEM, "ring: out of memory"));
    if (st != MHA_OK) {
        mha_free(buf);
        ring_end(&R, opt, t0, st);
        return st;
    }
    float *kvb[2] = {buf, buf + kvf};
    F.out = *out;
    F.lse = packed(buf + 2 * kvf, R.B, R.H, n, 0);
    F.blk = buf + 2 * kvf + R.B * R.H * n;
    F.mrg = F.blk + sf;

    mha_tensor ks, vs;
    pack_own_shard(&R, kvb[0], n, k, v);
    int cur = 0;
    for (int t = 0; t < R.P && st == MHA_OK; t++) {
        const int s = (R.rank - t + R.P) % R.P;
        st = post_kv(&R, t, kvb[cur], kvb[1 - cur]);
        if (st == MHA_OK && needs(&R, R.rank, s)) {
            shard_views(&R, kvb[cur], R.rows[s], &ks, &vs);
            forward_shard(&R, &F, q, s, &ks, &vs);
        }
        if (st == MHA_OK)
            st = wait_all(&R);
        cur = 1 - cur;
    }
    if (st == MHA_OK)
        st = R.status;
    st = agree(R.comm, R.rank, st);
    if (st == MHA_OK)
        forward_finish(&R, &F, lse, opt->sdpa.masked_rows);
    mha_free(buf);
    ring_end(&R, opt, t0, st);
    return st;
}

/* ---- backward -------------------------------------------------------------- */

typedef struct bwd_args {
    mha_tensor *dq;
    const mha_tensor *dout, *out, *lse, *q;
} bwd_args;

/* Gradients of this rank's Q pieces against shard s: dq into the caller's,
 * dK/dV into the shard-shaped buffer grad. */
static void backward_shard(ring *R, const bwd_args *a, const segment *piece, int npieces, int s,
                           const mha_tensor *k, const mha_tensor *v, float *grad) {
    segment ks[MAX_SEGS];
    const int nk = segments_of(R, s, ks);
    mha_tensor gk, gv;
    shard_views(R, grad, R->rows[s], &gk, &gv);
    const double t0 = MPI_Wtime();
    for (int p = 0; p < npieces && R->status == MHA_OK; p++)
        for (int j = 0; j < nk && R->status == MHA_OK; j++) {
            mha_sdpa_options o;
            const segment qp = piece[p];
            if (!block_options(R, qp, ks[j], &o))
                continue;
            mha_tensor dq = a->dq ? rows_of(a->dq, qp.local, qp.len) : (mha_tensor){0};
            const mha_tensor dout = rows_of(a->dout, qp.local, qp.len);
            const mha_tensor out = rows_of(a->out, qp.local, qp.len);
            const mha_tensor lse = rows_of(a->lse, qp.local, qp.len);
            const mha_tensor qv = rows_of(a->q, qp.local, qp.len);
            const mha_tensor kv = rows_of(k, ks[j].local, ks[j].len);
            const mha_tensor vv = rows_of(v, ks[j].local, ks[j].len);
            mha_tensor dk = rows_of(&gk, ks[j].local, ks[j].len);
            mha_tensor dv = rows_of(&gv, ks[j].local, ks[j].len);
            R->status = mha_sdpa_backward(a->dq ? &dq : NULL, &dk, &dv, &dout, &out, &lse, &qv,
                                          &kv, &vv, &o);
            poll(R);
        }
    R->stats.compute_seconds += MPI_Wtime() - t0;
}

static mha_status check_backward(const ring *R, mha_tensor *dq, mha_tensor *dk, mha_tensor *dv,
                                 const mha_tensor *dout, const mha_tensor *out,
                                 const mha_tensor *lse, const mha_tensor *q, const mha_tensor *k,
                                 const mha_tensor *v, const mha_ring_options *opt) {
    const int64_t n = q->shape[2];
    MHA_CHECK(out && lse, MHA_ERR_NULL,
              "out/lse: the backward needs the forward's out and lse (global statistics)");
    MHA_TRY(check4(dout, "dout", R->B, R->H, n, R->dv));
    MHA_TRY(check4(out, "out", R->B, R->H, n, R->dv));
    MHA_TRY(check_lse(lse, "lse", R->B, R->H, n));
    MHA_CHECK(mha_kernel_resolve(opt->sdpa.kernel) != MHA_KERNEL_REF, MHA_ERR_UNSUPPORTED,
              "kernel: the reference backward recomputes each block's softmax instead of "
              "reading the global lse; use AUTO, SCALAR or AVX2 across ranks");
    const mha_tensor *in[] = {q, k, v, dout, out, lse};
    mha_tensor *g[3] = {dq, dk, dv};
    const char *names[3] = {"dq", "dk", "dv"};
    const int64_t rows[3] = {R->H, R->Hkv, R->Hkv}, cols[3] = {R->d, R->d, R->dv};
    for (int i = 0; i < 3; i++) {
        if (!g[i])
            continue;
        MHA_TRY(check4(g[i], names[i], R->B, rows[i], n, cols[i]));
        MHA_TRY(check_output(g[i], names[i], in, 6));
        for (int j = 0; j < i; j++)
            MHA_CHECK(!g[j] || !mha_tensors_overlap(g[i], g[j]), MHA_ERR_ALIAS,
                      "%s: overlaps %s", names[i], names[j]);
    }
    return MHA_OK;
}

mha_status mha_ring_attention_backward(MPI_Comm comm, mha_tensor *dq, mha_tensor *dk,
                                       mha_tensor *dv, const mha_tensor *dout,
                                       const mha_tensor *out, const mha_tensor *lse,
                                       const mha_tensor *q, const mha_tensor *k,
                                       const mha_tensor *v, const mha_ring_options *opt) {
    MHA_OPTIONS_DEFAULT(mha_ring_options, opt);
    const double t0 = MPI_Wtime();
    ring R;
    int64_t n = 0;
    mha_status st = ring_init(&R, q, k, v, opt, &n);
    if (st == MHA_OK)
        st = check_backward(&R, dq, dk, dv, dout, out, lse, q, k, v, opt);
    if ((st = ring_begin(&R, comm, st, n, opt)) != MHA_OK) {
        ring_end(&R, opt, t0, st);
        return st;
    }
    /* one allocation: two K/V shard buffers, two dK/dV accumulators, one
     * block-gradient scratch, all shard-shaped */
    const int64_t kvf = shard_floats(&R, R.nmax);
    float *buf = mha_malloc(sizeof(float) * (size_t)(5 * kvf + 1));
    st = agree(R.comm, R.rank, buf ? MHA_OK : mha_error(MHA_ERR_NOMEM, "ring: out of memory"));
    if (st != MHA_OK) {
        mha_free(buf);
        ring_end(&R, opt, t0, st);
        return st;
    }
    float *kvb[2] = {buf, buf + kvf}, *acc[2] = {buf + 2 * kvf, buf + 3 * kvf};
    float *gblk = buf + 4 * kvf;
    segment piece[MAX_PIECES];
    const int npieces = pieces_of(&R, piece);
    const bwd_args a = {dq, dout, out, lse, q};
    const int next = (R.rank + 1) % R.P, prev = (R.rank + R.P - 1) % R.P;

    mha_tensor ks, vs;
    pack_own_shard(&R, kvb[0], n, k, v);
    int cur = 0;
    for (int t = 0; t < R.P && st == MHA_OK; t++) {
        const int s = (R.rank - t + R.P) % R.P;
        const int64_t nf = shard_floats(&R, R.rows[s]);
        float *into = t == 0 ? acc[0] : gblk, *mine = acc[t % 2];
        st = post_kv(&R, t, kvb[cur], kvb[1 - cur]);
        if (st == MHA_OK && t > 0) /* shard s's accumulator, from r-1's step t-1 */
            st = post(&R, false, mine, nf, prev, TAG_DKV);
        memset(into, 0, sizeof(float) * (size_t)nf);
        if (st == MHA_OK && needs(&R, R.rank, s)) {
            shard_views(&R, kvb[cur], R.rows[s], &ks, &vs);
            backward_shard(&R, &a, piece, npieces, s, &ks, &vs, into);
        }
        if (st == MHA_OK)
            st = wait_all(&R);
        if (st == MHA_OK && t > 0)
            for (int64_t i = 0; i < nf; i++)
                mine[i] += gblk[i];
        if (st == MHA_OK && R.P > 1) /* on to r+1; after step P-1 that is the owner */
            st = post(&R, true, mine, nf, next, TAG_DKV);
        cur = 1 - cur;
    }
    float *own = acc[R.P > 1 ? R.P % 2 : 0];
    if (st == MHA_OK && R.P > 1)
        st = post(&R, false, own, shard_floats(&R, n), prev, TAG_DKV);
    if (st == MHA_OK)
        st = wait_all(&R);
    if (st == MHA_OK)
        st = R.status;
    st = agree(R.comm, R.rank, st);
    if (st == MHA_OK) {
        shard_views(&R, own, n, &ks, &vs);
        if (dk)
            move_rows(dk, &ks, true);
        if (dv)
            move_rows(dv, &vs, true);
    }
    mha_free(buf);
    ring_end(&R, opt, t0, st);
    return st;
}
