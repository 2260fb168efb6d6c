/* fuzz_npy.c - libFuzzer target for the .npy reader; without MHA_LIBFUZZER
 * a plain program replaying files and directories:
 *     fuzz_npy tests/corpus/npy tests/fixtures/io
 * Any status is fine; crashes, sanitizer reports and leaks are findings.
 * Each input is read as every kind a caller can ask for. */
#include "../../src/io/io.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const struct {
        mha_dtype want;
        int keep, mask;
    } modes[] = {{MHA_F32, 0, 0}, {MHA_BOOL, 0, 0}, {MHA_I64, 0, 0},
                 {MHA_F16, 0, 0}, {MHA_F32, 1, 1},  {MHA_F32, 1, 0}};
    for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
        mha_file f;
        mha_file_open_mem(&f, data, size, "fuzz.npy");
        mha_tensor t;
        mha_dtype fd;
        if (mha_npy_read(&f, modes[m].want, modes[m].keep, modes[m].mask, &t, &fd) == MHA_OK) {
            int64_t n;
            if (mha_tensor_numel(&t, &n) == MHA_OK && n > 0) {
                volatile uint8_t sink = ((const uint8_t *)t.data)[n * (int64_t)mha_dtype_size(t.dtype) - 1];
                (void)sink;
            }
            mha_tensor_free(&t);
        }
    }
    return 0;
}

#ifndef MHA_LIBFUZZER
#include "replay.h"
int main(int argc, char **argv) { return fuzz_replay_main(argc, argv, LLVMFuzzerTestOneInput); }
#endif
