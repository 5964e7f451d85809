/*
 * gpumem's memory pool behind a C ABI: PyTorch's CUDAPluggableAllocator and CuPy's
 * CFunctionAllocator entry points, configuration and statistics.
 *
 * Link against libgpumem_capi.so (cdylib) or libgpumem_capi.a (staticlib, with -lpthread -ldl
 * -lm). The documentation of each function is in capi/src/lib.rs (cargo doc -p gpumem-capi);
 * capi/tests/header.rs checks that every declaration here matches the code.
 *
 * Common rules:
 * - A failing call returns NULL, -1, or nothing for the frees, and leaves a message that
 *   gpumem_last_error() returns on the same thread. Every call but gpumem_last_error and
 *   gpumem_version clears the message first.
 * - Every function may be called from any thread at the same time. No panic or exception
 *   leaves a function.
 * - Streams are raw handles: 0 (null stream), 1 (legacy), 2 (per-thread) or a live stream.
 *   An allocation comes from its stream's arena; a chunk freed on another stream is reused only
 *   after the allocation's stream is made to wait for the freeing stream's work.
 *   A handle that cannot be live fails the call (NULL, or a free that frees nothing) with an
 *   error: on the host backend anything but 0, 1, 2 and a stream created and not destroyed; on
 *   CUDA and HIP a value below 4096 or not aligned to a pointer. CUDA and HIP cannot tell
 *   whether an aligned handle is live without dereferencing it: passing a destroyed stream or
 *   another object's address there is undefined behaviour, as in CUDA itself.
 */
#ifndef GPUMEM_H
#define GPUMEM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* ssize_t */

#ifdef __cplusplus
extern "C" {
#endif

/* CUDA's stream type. Declared exactly as CUDA's driver_types.h does (an opaque pointer), so
 * this header and CUDA's may be included in either order. With HIP, cast hipStream_t. */
#ifndef __DRIVER_TYPES_H__
typedef struct CUstream_st *cudaStream_t;
#endif

/* Pool statistics of one device (the byte fields and n_free_blocks) and the ABI's counters over
 * all devices since the process started (the rest). */
typedef struct gpumem_stats {
    size_t used_bytes;             /* lent out, in rounded (512-byte multiple) sizes */
    size_t free_bytes;             /* cached and free: total_bytes - used_bytes */
    size_t total_bytes;            /* held from the device by this device's pool */
    size_t limit_bytes;            /* this device's limit; 0 when unlimited */
    size_t n_free_blocks;          /* free chunks cached by this device's pool */
    size_t peak_held_bytes;        /* most bytes held from devices at once, all devices */
    uint64_t n_live;               /* addresses lent and not yet freed */
    uint64_t n_mallocs;            /* successful allocations (size 0 not counted) */
    uint64_t n_frees;              /* successful frees (address 0 not counted) */
    uint64_t n_cross_stream_frees; /* frees on another stream than the allocation's */
    uint64_t n_failed_mallocs;     /* failed allocation calls */
    uint64_t n_failed_frees;       /* failed frees: unknown address, double free, mismatch */
    uint64_t n_failed_other;       /* failed calls of the other functions */
    uint64_t n_raw_allocs;         /* driver allocations (cuMemAlloc) made by the pool */
    uint64_t n_raw_frees;          /* driver frees (cuMemFree) made by the pool */
} gpumem_stats;

/* PyTorch (torch.cuda.memory.CUDAPluggableAllocator(path, "gpumem_torch_malloc",
 * "gpumem_torch_free")). Size 0 returns NULL without error. PyTorch does not check for NULL: a
 * caller that wants torch.OutOfMemoryError wraps malloc to throw it (the Python package
 * gpumem_runtime does). */
void *gpumem_torch_malloc(ssize_t size, int device, cudaStream_t stream);
void gpumem_torch_free(void *ptr, ssize_t size, int device, cudaStream_t stream);

/* CuPy (cupy.cuda.memory.CFunctionAllocator(param, malloc, free, owner)); param is ignored.
 * Allocations come from the null stream's arena (CuPy's default stream). */
void *gpumem_cupy_malloc(void *param, size_t size, int device_id);
void gpumem_cupy_free(void *param, void *ptr, int device_id);

/* The last failure's message on this thread, or NULL; valid until this thread's next call. */
const char *gpumem_last_error(void);
/* "MAJOR.MINOR.PATCH"; static. */
const char *gpumem_version(void);

/* Configuration. 0 on success, -1 on failure (see gpumem_last_error). */
int gpumem_set_limit(int device, size_t bytes);
int gpumem_set_limit_fraction(int device, double fraction);
int gpumem_get_limit(int device, size_t *bytes);
/* "cache_until_out_of_memory", "release_before_grow", "hold_peak_in_use" or "segments" (default;
   its blocks grow in place where the backend has virtual memory, unless GPUMEM_EXPANDABLE_SEGMENTS=0). */
int gpumem_set_growth_policy(int device, const char *name);
const char *gpumem_get_growth_policy(int device);

/* Statistics and cache control. */
int gpumem_get_stats(int device, gpumem_stats *stats);
int gpumem_free_all_blocks(int device);

/* Memory used on another stream: not reused before `stream`'s work queued up to the free
 * completes (PyTorch's recordStream). 0, or -1 for an address gpumem did not lend. */
int gpumem_record_stream(void *ptr, cudaStream_t stream);

/* Text into the caller's buffer, snprintf-style: as much as fits in len bytes, NUL-terminated;
 * returns the full length (call with len 0 to learn it), or -1 on failure. */
/* Statistics as JSON with PyTorch's memory_stats() keys ("allocated_bytes.all.current",
 * "reserved_bytes.all.peak", "num_alloc_retries", "num_ooms", ...). */
ssize_t gpumem_memory_stats(int device, char *buf, size_t len);
/* The statistics as a table (PyTorch's memory_summary()). */
ssize_t gpumem_memory_summary(int device, char *buf, size_t len);
/* Every peak set to its current value (PyTorch's reset_peak_memory_stats()). 0 or -1. */
int gpumem_reset_peak_stats(int device);
/* Segments and blocks as JSON, in PyTorch's _snapshot() format. */
ssize_t gpumem_snapshot_json(int device, char *buf, size_t len);
/* The same as a pickle file torch.cuda._memory_viz opens. 0 or -1. */
int gpumem_export_snapshot(int device, const char *path);

/* A plan learned from the loop. gpumem_step(device) marks the end of an iteration (a training
 * step, a served batch); the first call turns planning on. Once two iterations in a row make the
 * same allocations in the same order, later iterations are served from one planned block with no
 * driver call; anything that departs from the plan is served by the pool as before, with no
 * error. 0, or -1 (unknown device, a device failure; no memory for the plan is not a failure).
 * gpumem_plan_automatically(device) plans with no gpumem_step calls: the pool finds the loop's
 * period from its allocations and marks the iterations itself (0 or -1); a later gpumem_step
 * turns that off. GPUMEM_PLAN_AUTOMATICALLY=1 in the environment does it for every device. gpumem_reset_planning drops the plan and stops planning (0 or -1).
 * gpumem_plan_state: 0 off, 1 recording, 2 a plan in force, 3 watching for the loop's period,
 * -1 on failure. */
int gpumem_step(int device);
int gpumem_plan_automatically(int device);
int gpumem_reset_planning(int device);
int gpumem_plan_state(int device);

/* Process-wide recording (every thread, every stream) into a trace file gpumem-trace reads.
 * start: 0 or -1; stop: the number of lines written, or -1. */
int gpumem_recorder_start(const char *path);
int64_t gpumem_recorder_stop(void);

/* Called on the allocating thread before an out-of-memory error returns, with the message
 * (valid during the call). It must not allocate through gpumem. 0 or -1. */
typedef void (*gpumem_oom_observer)(void *user_data, int device, const char *message);
int gpumem_add_oom_observer(int device, gpumem_oom_observer observer, void *user_data);
int gpumem_clear_oom_observers(int device);

/* CuPy's DebugPrintHook JSON lines, for the calling thread's allocations, into a file. */
int gpumem_debug_print_hook_begin(const char *path);
int gpumem_debug_print_hook_end(void);

#ifdef __cplusplus
}
#endif

#endif /* GPUMEM_H */
