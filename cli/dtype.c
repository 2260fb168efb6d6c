/* dtype.c - the tensor conversions behind `--dtype f32|f16|bf16` of
 * `mha attention`, `mha forward` and `mha bench`: inputs converted once
 * to the compute storage (mha_tensor_convert does the rounding). */
#include "cli.h"

#include <string.h>

mha_status cli_tensor_to_dtype(mha_tensor *t, mha_dtype dt) {
    if (t->dtype == dt)
        return MHA_OK;
    mha_tensor c;
    mha_status st = mha_tensor_create(&c, dt, t->ndim, t->shape);
    if (st == MHA_OK && (st = mha_tensor_convert(&c, t)) != MHA_OK)
        mha_tensor_free(&c);
    if (st != MHA_OK)
        return st;
    mha_tensor_free(t);
    *t = c;
    return MHA_OK;
}

mha_status cli_tensor_rounded(mha_tensor *rounded, const mha_tensor *src, mha_dtype dt) {
    memset(rounded, 0, sizeof *rounded);
    mha_tensor half;
    mha_status st = mha_tensor_create(&half, dt, src->ndim, src->shape);
    if (st == MHA_OK && (st = mha_tensor_convert(&half, src)) == MHA_OK)
        st = cli_tensor_to_dtype(&half, MHA_F32);
    if (st != MHA_OK) {
        mha_tensor_free(&half);
        return st;
    }
    *rounded = half;
    return MHA_OK;
}
