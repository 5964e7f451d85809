/*
 * Calls every entry point of gpumem.h from C, on the host backend (CI builds and runs it with
 * capi/tests/c/run.sh). Exits non-zero, naming the check, on the first failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"

static int failures = 0;

#define CHECK(cond)                                                                             \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            const char *e = gpumem_last_error();                                                \
            fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__, __LINE__,   \
                    #cond, e ? e : "none");                                                     \
            failures++;                                                                         \
        }                                                                                       \
    } while (0)

static gpumem_stats stats(int device) {
    gpumem_stats s;
    memset(&s, 0, sizeof s);
    CHECK(gpumem_get_stats(device, &s) == 0);
    return s;
}

static int oom_calls = 0;

static void count_oom(void *user_data, int device, const char *message) {
    CHECK(user_data == (void *)&oom_calls && device == 0 && strstr(message, "Out of memory") != NULL);
    oom_calls++;
}

/* One iteration of a loop: three allocations, freed in another order. */
static void iteration(void) {
    void *a = gpumem_torch_malloc(8192, 0, (cudaStream_t)0);
    void *b = gpumem_torch_malloc(1000, 0, (cudaStream_t)0);
    void *c = gpumem_torch_malloc(4096, 0, (cudaStream_t)0);
    CHECK(a != NULL && b != NULL && c != NULL);
    gpumem_torch_free(a, 8192, 0, (cudaStream_t)0);
    gpumem_torch_free(c, 4096, 0, (cudaStream_t)0);
    gpumem_torch_free(b, 1000, 0, (cudaStream_t)0);
}

/* The plan learned from the loop: off until the first step, in force once two iterations in a
 * row repeat, then no driver call; dropped by the reset. */
static void plan_checks(void) {
    CHECK(gpumem_plan_state(0) == 0);
    CHECK(gpumem_step(0) == 0);
    CHECK(gpumem_plan_state(0) == 1);
    for (int i = 0; i < 4; i++) {
        iteration();
        CHECK(gpumem_step(0) == 0);
    }
    CHECK(gpumem_plan_state(0) == 2);
    gpumem_stats planned = stats(0);
    for (int i = 0; i < 10; i++) {
        iteration();
        CHECK(gpumem_step(0) == 0);
    }
    gpumem_stats after = stats(0);
    CHECK(after.n_raw_allocs == planned.n_raw_allocs && after.n_raw_frees == planned.n_raw_frees);
    CHECK(gpumem_step(42) == -1 && gpumem_last_error() != NULL);
    CHECK(gpumem_plan_state(42) == -1);
    CHECK(gpumem_reset_planning(0) == 0);
    CHECK(gpumem_plan_state(0) == 0);

    /* With no gpumem_step: the pool finds the loop's period itself. */
    CHECK(gpumem_plan_automatically(0) == 0);
    CHECK(gpumem_plan_state(0) == 3);
    int iterations = 0;
    while (gpumem_plan_state(0) != 2 && iterations < 8) {
        iteration();
        iterations++;
    }
    CHECK(gpumem_plan_state(0) == 2);
    iteration();
    planned = stats(0);
    for (int i = 0; i < 10; i++) {
        iteration();
    }
    after = stats(0);
    CHECK(after.n_raw_allocs == planned.n_raw_allocs && after.n_raw_frees == planned.n_raw_frees);
    CHECK(gpumem_plan_automatically(42) == -1);
    CHECK(gpumem_reset_planning(0) == 0);
    CHECK(gpumem_plan_state(0) == 0);
    CHECK(gpumem_free_all_blocks(0) == 0);
    CHECK(stats(0).total_bytes == 0);
}

/* The memory tools: statistics with PyTorch's keys, summary, peak reset, snapshots, recorder,
 * OOM observers and record_stream. */
static void tools_checks(void) {
    char small[16];
    ssize_t n = gpumem_memory_stats(0, NULL, 0);
    CHECK(n > 0);
    char *text = malloc((size_t)n + 1);
    CHECK(text != NULL && gpumem_memory_stats(0, text, (size_t)n + 1) == n);
    CHECK(strstr(text, "\"allocated_bytes.all.current\":") != NULL && strstr(text, "\"num_ooms\":") != NULL);
    free(text);
    CHECK(gpumem_memory_summary(0, small, sizeof small) > (ssize_t)sizeof small && small[sizeof small - 1] == 0);
    CHECK(gpumem_memory_stats(0, NULL, 4) == -1 && gpumem_last_error() != NULL);
    CHECK(gpumem_reset_peak_stats(0) == 0);

    void *p = gpumem_torch_malloc(4096, 0, (cudaStream_t)0);
    CHECK(p != NULL);
    CHECK(gpumem_snapshot_json(0, NULL, 0) > 0);
    CHECK(gpumem_export_snapshot(0, "/nonexistent-dir/snapshot.pickle") == -1);
    CHECK(gpumem_record_stream(p, (cudaStream_t)0) == 0);
    CHECK(gpumem_record_stream((char *)p + 512, (cudaStream_t)0) == -1);

    CHECK(gpumem_recorder_start("abi_test_trace.jsonl") == 0);
    CHECK(gpumem_recorder_start("abi_test_trace.jsonl") == -1);
    gpumem_torch_free(p, 4096, 0, (cudaStream_t)0);
    CHECK(gpumem_recorder_stop() >= 1);
    CHECK(gpumem_recorder_stop() == -1);
    remove("abi_test_trace.jsonl");

    size_t old = 0;
    CHECK(gpumem_get_limit(0, &old) == 0);
    CHECK(gpumem_add_oom_observer(0, count_oom, &oom_calls) == 0);
    CHECK(gpumem_add_oom_observer(0, NULL, NULL) == -1);
    CHECK(gpumem_set_limit(0, 1 << 20) == 0);
    CHECK(gpumem_torch_malloc(4 << 20, 0, (cudaStream_t)0) == NULL && oom_calls == 1);
    CHECK(gpumem_clear_oom_observers(0) == 0);
    CHECK(gpumem_torch_malloc(4 << 20, 0, (cudaStream_t)0) == NULL && oom_calls == 1);
    CHECK(gpumem_set_limit(0, old) == 0);
}

int main(void) {
    const char *version = gpumem_version();
    CHECK(version != NULL && strchr(version, '.') != NULL);
    printf("gpumem %s\n", version);

    /* PyTorch's entry points, on the null stream. */
    gpumem_stats before = stats(0);
    void *p = gpumem_torch_malloc(1000, 0, (cudaStream_t)0);
    CHECK(p != NULL && gpumem_last_error() == NULL);
    CHECK(((size_t)p) % 512 == 0);
    gpumem_stats during = stats(0);
    CHECK(during.used_bytes - before.used_bytes == 1024);
    CHECK(during.n_live - before.n_live == 1);
    gpumem_torch_free(p, 1000, 0, (cudaStream_t)0);
    CHECK(gpumem_last_error() == NULL);
    CHECK(stats(0).n_live == before.n_live);

    /* Errors: a message, no crash, nothing freed. */
    gpumem_torch_free(p, 1000, 0, (cudaStream_t)0);
    CHECK(gpumem_last_error() != NULL && strstr(gpumem_last_error(), "not an address gpumem lent") != NULL);
    gpumem_torch_free((void *)0x1234, 8, 0, (cudaStream_t)0);
    CHECK(gpumem_last_error() != NULL);
    CHECK(gpumem_torch_malloc(-5, 0, (cudaStream_t)0) == NULL);
    CHECK(gpumem_last_error() != NULL && strcmp(gpumem_last_error(), "gpumem_torch_malloc: negative size -5") == 0);
    CHECK(gpumem_torch_malloc(0, 0, (cudaStream_t)0) == NULL && gpumem_last_error() == NULL);

    /* A free on another stream (the per-thread default stream, raw value 2). */
    void *q = gpumem_torch_malloc(4096, 0, (cudaStream_t)0);
    CHECK(q != NULL);
    gpumem_torch_free(q, 4096, 0, (cudaStream_t)2);
    CHECK(gpumem_last_error() == NULL);
    CHECK(stats(0).n_cross_stream_frees - before.n_cross_stream_frees == 1);

    /* Handles that cannot be live streams are refused before use, and a refused free keeps the
     * chunk lent (CA08-CA10). */
    CHECK(gpumem_torch_malloc(512, 0, (cudaStream_t)0xdeadbeef) == NULL);
    CHECK(gpumem_last_error() != NULL && strstr(gpumem_last_error(), "stream 0xdeadbeef") != NULL);
    CHECK(gpumem_torch_malloc(512, 0, (cudaStream_t)3) == NULL && gpumem_last_error() != NULL);
    void *b = gpumem_torch_malloc(512, 0, (cudaStream_t)0);
    CHECK(b != NULL);
    uint64_t live = stats(0).n_live;
    gpumem_torch_free(b, 512, 0, (cudaStream_t)0x4000);
    CHECK(gpumem_last_error() != NULL && strstr(gpumem_last_error(), "stream 0x4000") != NULL);
    CHECK(stats(0).n_live == live);
    gpumem_torch_free(b, 512, 0, (cudaStream_t)0);
    CHECK(gpumem_last_error() == NULL && stats(0).n_live == live - 1);

    /* CuPy's entry points. */
    void *c = gpumem_cupy_malloc(NULL, 24, 0);
    CHECK(c != NULL);
    gpumem_cupy_free(NULL, c, 0);
    CHECK(gpumem_last_error() == NULL);
    gpumem_cupy_free(NULL, c, 0);
    CHECK(gpumem_last_error() != NULL);

    /* Configuration. */
    size_t limit = 1;
    CHECK(gpumem_set_limit(0, 1 << 20) == 0);
    CHECK(gpumem_get_limit(0, &limit) == 0 && limit == (1 << 20));
    /* Larger than anything the pool holds, so it cannot come from the cache. */
    CHECK(gpumem_torch_malloc(64 << 20, 0, (cudaStream_t)0) == NULL);
    CHECK(gpumem_last_error() != NULL && strstr(gpumem_last_error(), "limit set to: 1,048,576 bytes") != NULL);
    CHECK(gpumem_set_limit(0, 0) == 0);
    CHECK(gpumem_set_limit_fraction(0, 2.0) == -1 && gpumem_last_error() != NULL);
    CHECK(gpumem_set_limit_fraction(0, 0.0) == 0);
    CHECK(gpumem_set_growth_policy(0, "hold_peak_in_use") == 0);
    CHECK(strcmp(gpumem_get_growth_policy(0), "hold_peak_in_use") == 0);
    CHECK(gpumem_set_growth_policy(0, "no_such_policy") == -1);
    CHECK(gpumem_set_growth_policy(0, "cache_until_out_of_memory") == 0);
    CHECK(gpumem_free_all_blocks(0) == 0);
    CHECK(stats(0).total_bytes == 0);
    CHECK(gpumem_get_stats(42, &during) == -1 && gpumem_last_error() != NULL);

    /* The debug-print hook. */
    const char *path = "gpumem-capi-c-test.jsonl";
    CHECK(gpumem_debug_print_hook_begin(path) == 0);
    void *x = gpumem_cupy_malloc(NULL, 24, 0);
    gpumem_cupy_free(NULL, x, 0);
    CHECK(gpumem_debug_print_hook_end() == 0);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (f) {
        char line[512];
        int n = 0;
        while (fgets(line, sizeof line, f)) {
            if (n == 0) CHECK(strstr(line, "\"hook\":\"alloc\"") != NULL);
            if (n == 1) CHECK(strstr(line, "\"hook\":\"malloc\"") != NULL && strstr(line, "\"size\":24") != NULL);
            if (n == 2) CHECK(strstr(line, "\"hook\":\"free\"") != NULL);
            n++;
        }
        CHECK(n == 3);
        fclose(f);
        remove(path);
    }

    gpumem_stats end = stats(0);
    CHECK(end.n_live == before.n_live);
    printf("mallocs %llu, frees %llu, failed mallocs %llu, failed frees %llu, raw allocs %llu\n",
           (unsigned long long)end.n_mallocs, (unsigned long long)end.n_frees,
           (unsigned long long)end.n_failed_mallocs, (unsigned long long)end.n_failed_frees,
           (unsigned long long)end.n_raw_allocs);
    tools_checks();
    plan_checks();
    if (failures) {
        fprintf(stderr, "abi_test: %d check(s) failed\n", failures);
        return 1;
    }
    printf("abi_test: all checks passed\n");
    return 0;
}
