/* alloc.c - the library's allocator, with failure injection for tests. */
#include "internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define MHA_ALIGN 64

static _Atomic int64_t alloc_count;  /* allocations attempted so far      */
static _Atomic int64_t fail_at;      /* fail when count reaches this (0: never) */
static _Atomic int fail_persistent;

void mha_test_fail_alloc(int64_t k, int persistent) {
    atomic_store(&fail_persistent, persistent != 0);
    atomic_store(&fail_at, k > 0 ? atomic_load(&alloc_count) + k : 0);
}

int64_t mha_test_alloc_count(void) { return atomic_load(&alloc_count); }

static bool injected_failure(void) {
    int64_t n = atomic_fetch_add(&alloc_count, 1) + 1;
    int64_t at = atomic_load(&fail_at);
    if (at == 0)
        return false;
    return n == at || (atomic_load(&fail_persistent) && n > at);
}

void *mha_malloc(size_t bytes) {
    if (injected_failure())
        return NULL;
    if (bytes == 0)
        bytes = 1;
    size_t rounded = (bytes + MHA_ALIGN - 1) / MHA_ALIGN * MHA_ALIGN;
    if (rounded < bytes)
        return NULL;
    return aligned_alloc(MHA_ALIGN, rounded);
}

void *mha_calloc(size_t count, size_t size) {
    size_t bytes;
    if (mha_size_mul_overflows(count, size, &bytes))
        return NULL;
    void *p = mha_malloc(bytes);
    if (p)
        memset(p, 0, bytes);
    return p;
}

void mha_free(void *p) { free(p); }
