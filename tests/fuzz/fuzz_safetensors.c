/* fuzz_safetensors.c - libFuzzer target for the safetensors reader; without
 * MHA_LIBFUZZER a plain program replaying files and directories:
 *     fuzz_safetensors tests/corpus/safetensors tests/fixtures/io
 * Accepted inputs are walked completely: every tensor converted and viewed,
 * every metadata pair read. */
#include "../../src/io/io.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mha_file f;
    mha_file_open_mem(&f, data, size, "fuzz.safetensors");
    mha_safetensors *st;
    if (mha_safetensors_read(&f, &st) != MHA_OK)
        return 0;
    volatile size_t sink = 0;
    for (int64_t i = 0; i < mha_safetensors_count(st); i++) {
        const char *name = mha_safetensors_name(st, i);
        mha_tensor t, v;
        if (mha_safetensors_get_f32(st, name, &t) == MHA_OK) {
            int64_t n;
            if (mha_tensor_numel(&t, &n) == MHA_OK && n > 0)
                sink += ((const uint8_t *)t.data)[n * 4 - 1]; /* touch the last byte */
            mha_tensor_free(&t);
        }
        if (mha_safetensors_view_f32(st, name, &v) == MHA_OK) {
            int64_t n;
            if (mha_tensor_numel(&v, &n) == MHA_OK && n > 0)
                sink += ((const uint8_t *)v.data)[n * 4 - 1];
        }
    }
    for (int64_t i = 0; i < mha_safetensors_metadata_count(st); i++)
        sink += strlen(mha_safetensors_metadata_key(st, i)) +
                strlen(mha_safetensors_metadata_value(st, i));
    (void)sink;
    mha_safetensors_free(st);
    return 0;
}

#ifndef MHA_LIBFUZZER
#include "replay.h"
int main(int argc, char **argv) { return fuzz_replay_main(argc, argv, LLVMFuzzerTestOneInput); }
#endif
