/* alloc.c - the library's allocator, with failure injection in test builds
 * (-DMHA_TEST_HOOKS, docs/errors.md "Test hooks"). */
#include "internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define MHA_ALIGN 64

#ifdef MHA_TEST_HOOKS
static _Atomic int64_t alloc_count;  /* allocations attempted so far      */
static _Atomic int64_t fail_at;      /* fail when count reaches this (0: never) */
static _Atomic int fail_persistent;
static _Atomic int64_t live_count;   /* successful allocations not yet freed */
static _Atomic int env_read;         /* MHA_TEST_FAIL_ALLOC read (0 no, 1 busy, 2 done) */

/* Test hook for whole programs (the CLI tests): MHA_TEST_FAIL_ALLOC=k fails
 * the k-th allocation of the process, MHA_TEST_FAIL_ALLOC=k+ that one and
 * every later one.  Read once, at the first allocation; unset = no effect. */
static void read_env_hook(void) {
    int expected = 0;
    if (atomic_load(&env_read) == 2 || !atomic_compare_exchange_strong(&env_read, &expected, 1))
        return;
    const char *env = getenv("MHA_TEST_FAIL_ALLOC");
    if (env && *env) {
        char *end;
        long long k = strtoll(env, &end, 10);
        if (k > 0 && (*end == '\0' || (*end == '+' && end[1] == '\0'))) {
            atomic_store(&fail_persistent, *end == '+');
            atomic_store(&fail_at, (int64_t)k);
        }
    }
    atomic_store(&env_read, 2);
}

void mha_test_fail_alloc(int64_t k, int persistent) {
    read_env_hook(); /* so a later first allocation cannot override this call */
    atomic_store(&fail_persistent, persistent != 0);
    atomic_store(&fail_at, k > 0 ? atomic_load(&alloc_count) + k : 0);
}

int64_t mha_test_alloc_count(void) { return atomic_load(&alloc_count); }

int64_t mha_test_live_allocs(void) { return atomic_load(&live_count); }

static bool injected_failure(void) {
    if (atomic_load(&env_read) != 2)
        read_env_hook();
    int64_t n = atomic_fetch_add(&alloc_count, 1) + 1;
    int64_t at = atomic_load(&fail_at);
    if (at == 0)
        return false;
    return n == at || (atomic_load(&fail_persistent) && n > at);
}
#define COUNT_LIVE(delta) atomic_fetch_add(&live_count, (delta))
#else  /* release build: no hook, no counters */
static inline bool injected_failure(void) { return false; }
#define COUNT_LIVE(delta) ((void)0)
#endif

void *mha_malloc(size_t bytes) {
    if (injected_failure())
        return NULL;
    if (bytes == 0)
        bytes = 1;
    /* malloc's block has MHA_ALIGN bytes to spare; the caller gets its first
     * 64-byte boundary past the start, and the distance back (16-64 bytes:
     * malloc aligns to 16) is stored just before that boundary.  Not
     * aligned_alloc: glibc's memalign asks for the size plus the alignment
     * and frees the slack, which small allocations then take, so a freed
     * block no longer fits the next equal request: a workspace of 26 MiB
     * per call (MHA forward B 32 L 128 E 384) grew the heap by fresh pages,
     * a page fault per 4 KiB, on each of the first 9 calls (1.3-1.4x the
     * later calls' time). */
    size_t padded;
    if (__builtin_add_overflow(bytes, (size_t)MHA_ALIGN, &padded)) /* GCOVR_EXCL_BR_LINE */
        return NULL; /* GCOVR_EXCL_LINE: callers never ask SIZE_MAX-63+ bytes */
    unsigned char *raw = malloc(padded);
    if (!raw)
        return NULL;
    unsigned char *p = (unsigned char *)(((uintptr_t)raw + MHA_ALIGN) & ~(uintptr_t)(MHA_ALIGN - 1));
    const size_t back = (size_t)(p - raw);
    memcpy(p - sizeof back, &back, sizeof back);
    COUNT_LIVE(1);
    return p;
}

void *mha_calloc(size_t count, size_t size) {
    size_t bytes;
    if (mha_size_mul_overflows(count, size, &bytes)) /* GCOVR_EXCL_BR_LINE: callers check */
        return NULL;                                 /* GCOVR_EXCL_LINE */
    void *p = mha_malloc(bytes);
    if (p)
        memset(p, 0, bytes);
    return p;
}

void mha_free(void *p) {
    if (!p)
        return;
    COUNT_LIVE(-1);
    size_t back;
    memcpy(&back, (unsigned char *)p - sizeof back, sizeof back);
    free((unsigned char *)p - back);
}

mha_status mha_workspace_get(void *workspace, size_t workspace_bytes, size_t need,
                             const char *what, float **ws, float **owned) {
    *owned = NULL;
    if (workspace) {
        MHA_CHECK(workspace_bytes >= need, MHA_ERR_VALUE, "%s: workspace of %zu bytes, need %zu",
                  what, workspace_bytes, need);
        MHA_CHECK((uintptr_t)workspace % sizeof(float) == 0, MHA_ERR_VALUE,
                  "%s: workspace must be float-aligned", what);
        *ws = workspace;
        return MHA_OK;
    }
    *ws = *owned = mha_malloc(need ? need : 1);
    MHA_CHECK(*ws != NULL, MHA_ERR_NOMEM, "%s: cannot allocate %zu bytes of workspace", what, need);
    return MHA_OK;
}
