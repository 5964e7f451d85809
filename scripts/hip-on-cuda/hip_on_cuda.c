/*
 * A HIP runtime on the CUDA runtime, for testing gpumem-hip on NVIDIA GPUs; not for shipping.
 *
 * Exports, with HIP 5.2's ABI (the signatures, enums and status numbers of Debian's
 * /usr/include/hip/hip_runtime_api.h, HIP 5.2.3), every hip* entry point gpumem-hip resolves
 * (backend-hip/src/result.rs, `sys`), plus hipStreamCreateWithFlags for its tests. Each is
 * implemented on the CUDA runtime API; every status code goes through `to_hip` (CUDA's numbering
 * to HIP's) and callbacks receive HIP's numbering. Built as libamdhip64.so by
 * scripts/gpu-hip-tests.sh:
 *
 *   nvcc -shared -Xcompiler -fPIC -o lib/libamdhip64.so hip_on_cuda.c -lcuda
 *
 * The virtual-memory entry points go to the driver API (cuMem*), which the runtime API lacks; the
 * runtime's cudaSetDevice makes the device's primary context current for them.
 *
 * With -DHIP_ON_CUDA_STUB it compiles against cuda_stub.h instead of the toolkit's headers (a
 * syntax check on machines without CUDA; the result does not run).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef HIP_ON_CUDA_STUB
#include "cuda_stub.h"
#else
#include <cuda.h>
#include <cuda_runtime_api.h>
#endif

#define EXPORT __attribute__((visibility("default")))

/* HIP 5.2's types, as its ABI has them: handles are pointers, enums are int-sized. */
typedef int hipError_t;
typedef void *hipStream_t;
typedef void *hipEvent_t;
typedef void *hipMemPool_t;
typedef int hipDeviceAttribute_t;
typedef int hipMemPoolAttr;
typedef int hipMemcpyKind;
typedef void (*hipStreamCallback_t)(hipStream_t stream, hipError_t status, void *user_data);

/* hipPointerAttribute_t of HIP 5.2 (32 bytes; hipMemoryType Host 0, Device 1, Array 2, Unified 3). */
typedef struct {
    int memoryType;
    int device;
    void *devicePointer;
    void *hostPointer;
    int isManaged;
    unsigned allocationFlags;
} hipPointerAttribute_t;

enum { hipMemoryTypeHost = 0, hipMemoryTypeDevice = 1, hipMemoryTypeUnified = 3 };

/* HIP 5.2's device attributes gpumem-hip reads, by HIP's numbering. */
enum {
    hipDeviceAttributeComputeCapabilityMajor = 23,
    hipDeviceAttributeComputeCapabilityMinor = 61,
    hipDeviceAttributeMultiprocessorCount = 63,
    hipDeviceAttributeUnifiedAddressing = 85,
    hipDeviceAttributeMemoryPoolsSupported = 88,
};

enum {
    hipMemPoolAttrReleaseThreshold = 4,
    hipMemPoolAttrReservedMemCurrent = 5,
    hipMemPoolAttrUsedMemCurrent = 7
};

/* HIP 5.2's runtime version, HIP_VERSION's numbering (major * 10^7 + minor * 10^5 + patch): the
 * backend reads hipMemoryType with HIP 5's numbering below major 6. */
#define HIP_ON_CUDA_VERSION 50200000

/*
 * The status table: each HIP 5.2 code with its name and the CUDA runtime code it stands for.
 * Many numbers are the same; those that differ are marked. Codes HIP has and CUDA lacks map
 * from nothing (-1); CUDA codes missing here become hipErrorUnknown (999), as HIP 5.2's own
 * hipGetErrorName answers codes it does not know.
 */
typedef struct {
    hipError_t hip;
    const char *name;
    int cuda;
} status_entry;

static const status_entry STATUS[] = {
    {0, "hipSuccess", 0},
    {1, "hipErrorInvalidValue", 1},
    {2, "hipErrorOutOfMemory", 2},                 /* cudaErrorMemoryAllocation */
    {3, "hipErrorNotInitialized", 3},              /* cudaErrorInitializationError */
    {4, "hipErrorDeinitialized", 4},               /* cudaErrorCudartUnloading */
    {5, "hipErrorProfilerDisabled", 5},
    {6, "hipErrorProfilerNotInitialized", 6},
    {7, "hipErrorProfilerAlreadyStarted", 7},
    {8, "hipErrorProfilerAlreadyStopped", 8},
    {9, "hipErrorInvalidConfiguration", 9},
    {12, "hipErrorInvalidPitchValue", 12},
    {13, "hipErrorInvalidSymbol", 13},
    {17, "hipErrorInvalidDevicePointer", 17},
    {21, "hipErrorInvalidMemcpyDirection", 21},
    {35, "hipErrorInsufficientDriver", 35},
    {52, "hipErrorMissingConfiguration", 52},
    {53, "hipErrorPriorLaunchFailure", 53},
    {98, "hipErrorInvalidDeviceFunction", 98},
    {100, "hipErrorNoDevice", 100},
    {101, "hipErrorInvalidDevice", 101},
    {200, "hipErrorInvalidImage", 200},            /* cudaErrorInvalidKernelImage */
    {201, "hipErrorInvalidContext", 201},          /* cudaErrorDeviceUninitialized */
    {205, "hipErrorMapFailed", 205},               /* cudaErrorMapBufferObjectFailed */
    {206, "hipErrorUnmapFailed", 206},
    {207, "hipErrorArrayIsMapped", 207},
    {208, "hipErrorAlreadyMapped", 208},
    {209, "hipErrorNoBinaryForGpu", 209},          /* cudaErrorNoKernelImageForDevice */
    {210, "hipErrorAlreadyAcquired", 210},
    {211, "hipErrorNotMapped", 211},
    {212, "hipErrorNotMappedAsArray", 212},
    {213, "hipErrorNotMappedAsPointer", 213},
    {214, "hipErrorECCNotCorrectable", 214},       /* cudaErrorECCUncorrectable */
    {215, "hipErrorUnsupportedLimit", 215},
    {216, "hipErrorContextAlreadyInUse", 216},     /* cudaErrorDeviceAlreadyInUse */
    {217, "hipErrorPeerAccessUnsupported", 217},
    {218, "hipErrorInvalidKernelFile", 218},       /* cudaErrorInvalidPtx */
    {219, "hipErrorInvalidGraphicsContext", 219},
    {300, "hipErrorInvalidSource", 300},
    {301, "hipErrorFileNotFound", 301},
    {302, "hipErrorSharedObjectSymbolNotFound", 302},
    {303, "hipErrorSharedObjectInitFailed", 303},
    {304, "hipErrorOperatingSystem", 304},
    {400, "hipErrorInvalidHandle", 400},           /* cudaErrorInvalidResourceHandle */
    {401, "hipErrorIllegalState", 401},
    {500, "hipErrorNotFound", 500},                /* cudaErrorSymbolNotFound */
    {600, "hipErrorNotReady", 600},
    {700, "hipErrorIllegalAddress", 700},
    {701, "hipErrorLaunchOutOfResources", 701},
    {702, "hipErrorLaunchTimeOut", 702},
    {704, "hipErrorPeerAccessAlreadyEnabled", 704},
    {705, "hipErrorPeerAccessNotEnabled", 705},
    {708, "hipErrorSetOnActiveProcess", 708},
    {709, "hipErrorContextIsDestroyed", 709},
    {710, "hipErrorAssert", 710},
    {712, "hipErrorHostMemoryAlreadyRegistered", 712},
    {713, "hipErrorHostMemoryNotRegistered", 713},
    {719, "hipErrorLaunchFailure", 719},
    {720, "hipErrorCooperativeLaunchTooLarge", 720},
    {801, "hipErrorNotSupported", 801},
    {900, "hipErrorStreamCaptureUnsupported", 900},
    {901, "hipErrorStreamCaptureInvalidated", 901},
    {902, "hipErrorStreamCaptureMerge", 902},
    {903, "hipErrorStreamCaptureUnmatched", 903},
    {904, "hipErrorStreamCaptureUnjoined", 904},
    {905, "hipErrorStreamCaptureIsolation", 905},
    {906, "hipErrorStreamCaptureImplicit", 906},
    {907, "hipErrorCapturedEvent", 907},
    {908, "hipErrorStreamCaptureWrongThread", 908},
    {910, "hipErrorGraphExecUpdateFailure", 910},
    /* CUDA codes with no HIP 5.2 code of their own, read as the nearest HIP one. */
    {100, "hipErrorNoDevice", 34},                 /* cudaErrorStubLibrary */
    {35, "hipErrorInsufficientDriver", 36},        /* cudaErrorCallRequiresNewerDriver */
    {999, "hipErrorUnknown", 999},
    {1052, "hipErrorRuntimeMemory", -1},
    {1053, "hipErrorRuntimeOther", -1},
};

#define STATUS_COUNT (sizeof STATUS / sizeof STATUS[0])

/* CUDA's numbering to HIP's. */
static hipError_t to_hip(cudaError_t code) {
    for (size_t i = 0; i < STATUS_COUNT; i++) {
        if (STATUS[i].cuda == (int)code) {
            return STATUS[i].hip;
        }
    }
    return 999; /* hipErrorUnknown */
}

/* HIP's numbering to CUDA's (the first entry of the code); -1 when CUDA has none. */
static int to_cuda(hipError_t code) {
    for (size_t i = 0; i < STATUS_COUNT; i++) {
        if (STATUS[i].hip == code) {
            return STATUS[i].cuda;
        }
    }
    return -1;
}

EXPORT const char *hipGetErrorName(hipError_t code) {
    for (size_t i = 0; i < STATUS_COUNT; i++) {
        if (STATUS[i].hip == code) {
            return STATUS[i].name;
        }
    }
    return "hipErrorUnknown";
}

EXPORT const char *hipGetErrorString(hipError_t code) {
    int cuda = to_cuda(code);
    /* HIP 5.2's own answer for a code it does not know is the name, not a sentence. */
    return cuda < 0 ? hipGetErrorName(code) : cudaGetErrorString((cudaError_t)cuda);
}

EXPORT hipError_t hipGetLastError(void) { return to_hip(cudaGetLastError()); }

EXPORT hipError_t hipRuntimeGetVersion(int *version) {
    if (version == NULL) {
        return 1;
    }
    *version = HIP_ON_CUDA_VERSION;
    return 0;
}

/* Devices */

EXPORT hipError_t hipGetDeviceCount(int *count) { return to_hip(cudaGetDeviceCount(count)); }
EXPORT hipError_t hipSetDevice(int device) { return to_hip(cudaSetDevice(device)); }

EXPORT hipError_t hipDeviceGetName(char *name, int len, int device) {
    struct cudaDeviceProp prop;
    if (name == NULL || len <= 0) {
        return 1;
    }
    cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess) {
        return to_hip(e);
    }
    strncpy(name, prop.name, (size_t)len - 1);
    name[len - 1] = '\0';
    return 0;
}

EXPORT hipError_t hipDeviceTotalMem(size_t *bytes, int device) {
    struct cudaDeviceProp prop;
    if (bytes == NULL) {
        return 1;
    }
    cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e == cudaSuccess) {
        *bytes = prop.totalGlobalMem;
    }
    return to_hip(e);
}

EXPORT hipError_t hipDeviceGetAttribute(int *value, hipDeviceAttribute_t attr, int device) {
    enum cudaDeviceAttr cuda;
    switch (attr) {
    case hipDeviceAttributeComputeCapabilityMajor: cuda = cudaDevAttrComputeCapabilityMajor; break;
    case hipDeviceAttributeComputeCapabilityMinor: cuda = cudaDevAttrComputeCapabilityMinor; break;
    case hipDeviceAttributeMultiprocessorCount: cuda = cudaDevAttrMultiProcessorCount; break;
    case hipDeviceAttributeUnifiedAddressing: cuda = cudaDevAttrUnifiedAddressing; break;
    case hipDeviceAttributeMemoryPoolsSupported: cuda = cudaDevAttrMemoryPoolsSupported; break;
    default: return 1; /* an attribute this shim does not translate: as HIP for one it lacks */
    }
    return to_hip(cudaDeviceGetAttribute(value, cuda, device));
}

EXPORT hipError_t hipMemGetInfo(size_t *free_bytes, size_t *total) {
    return to_hip(cudaMemGetInfo(free_bytes, total));
}
EXPORT hipError_t hipDeviceSynchronize(void) { return to_hip(cudaDeviceSynchronize()); }
EXPORT hipError_t hipDeviceCanAccessPeer(int *can, int device, int peer) {
    return to_hip(cudaDeviceCanAccessPeer(can, device, peer));
}
EXPORT hipError_t hipDeviceEnablePeerAccess(int peer, unsigned flags) {
    return to_hip(cudaDeviceEnablePeerAccess(peer, flags));
}

/* HIP 5 answers hipErrorInvalidValue for host memory it did not allocate or register, where
 * CUDA 11+ answers success with cudaMemoryTypeUnregistered; the shim answers as HIP 5 does, and
 * renumbers the memory type to HIP 5's. */
EXPORT hipError_t hipPointerGetAttributes(hipPointerAttribute_t *out, const void *ptr) {
    struct cudaPointerAttributes a;
    if (out == NULL) {
        return 1;
    }
    cudaError_t e = cudaPointerGetAttributes(&a, ptr);
    if (e != cudaSuccess) {
        return to_hip(e);
    }
    if (a.type == cudaMemoryTypeUnregistered) {
        return 1;
    }
    memset(out, 0, sizeof *out);
    out->memoryType = a.type == cudaMemoryTypeHost     ? hipMemoryTypeHost
                      : a.type == cudaMemoryTypeDevice ? hipMemoryTypeDevice
                                                       : hipMemoryTypeUnified;
    out->device = a.device;
    out->devicePointer = a.devicePointer;
    out->hostPointer = a.hostPointer;
    out->isManaged = a.type == cudaMemoryTypeManaged;
    return 0;
}

/* Memory */

EXPORT hipError_t hipMalloc(void **ptr, size_t size) { return to_hip(cudaMalloc(ptr, size)); }
EXPORT hipError_t hipFree(void *ptr) { return to_hip(cudaFree(ptr)); }
/* hipHostMallocPortable (1) is cudaHostAllocPortable (1); HIP's other flags are not passed on. */
EXPORT hipError_t hipHostMalloc(void **ptr, size_t size, unsigned flags) {
    return to_hip(cudaHostAlloc(ptr, size, flags & 1u));
}
EXPORT hipError_t hipHostFree(void *ptr) { return to_hip(cudaFreeHost(ptr)); }
EXPORT hipError_t hipDeviceGetDefaultMemPool(hipMemPool_t *pool, int device) {
    return to_hip(cudaDeviceGetDefaultMemPool((cudaMemPool_t *)pool, device));
}
EXPORT hipError_t hipMemPoolSetAttribute(hipMemPool_t pool, hipMemPoolAttr attr, void *value) {
    if (attr != hipMemPoolAttrReleaseThreshold) {
        return 1;
    }
    return to_hip(cudaMemPoolSetAttribute((cudaMemPool_t)pool, cudaMemPoolAttrReleaseThreshold, value));
}
/* The three attributes gpumem reads have CUDA's numbers in HIP too. */
EXPORT hipError_t hipMemPoolGetAttribute(hipMemPool_t pool, hipMemPoolAttr attr, void *value) {
    if (attr != hipMemPoolAttrReleaseThreshold && attr != hipMemPoolAttrReservedMemCurrent &&
        attr != hipMemPoolAttrUsedMemCurrent) {
        return 1;
    }
    return to_hip(cudaMemPoolGetAttribute((cudaMemPool_t)pool, (enum cudaMemPoolAttr)attr, value));
}
EXPORT hipError_t hipMemPoolTrimTo(hipMemPool_t pool, size_t min_bytes_to_hold) {
    return to_hip(cudaMemPoolTrimTo((cudaMemPool_t)pool, min_bytes_to_hold));
}
EXPORT hipError_t hipMallocAsync(void **ptr, size_t size, hipStream_t stream) {
    return to_hip(cudaMallocAsync(ptr, size, (cudaStream_t)stream));
}
EXPORT hipError_t hipFreeAsync(void *ptr, hipStream_t stream) {
    return to_hip(cudaFreeAsync(ptr, (cudaStream_t)stream));
}
/* hipMemcpyKind has CUDA's numbering (HostToHost 0 ... Default 4). */
EXPORT hipError_t hipMemcpy(void *dst, const void *src, size_t size, hipMemcpyKind kind) {
    return to_hip(cudaMemcpy(dst, src, size, (enum cudaMemcpyKind)kind));
}
EXPORT hipError_t hipMemcpyAsync(void *dst, const void *src, size_t size, hipMemcpyKind kind, hipStream_t stream) {
    return to_hip(cudaMemcpyAsync(dst, src, size, (enum cudaMemcpyKind)kind, (cudaStream_t)stream));
}
EXPORT hipError_t hipMemset(void *dst, int value, size_t size) { return to_hip(cudaMemset(dst, value, size)); }
EXPORT hipError_t hipMemsetAsync(void *dst, int value, size_t size, hipStream_t stream) {
    return to_hip(cudaMemsetAsync(dst, value, size, (cudaStream_t)stream));
}

/* Streams. HIP's null stream (0) is CUDA's legacy default stream (the runtime's 0 as well), and
 * hipStreamPerThread (2) is cudaStreamPerThread (2); both pass through as they are. The flags
 * (hipStreamNonBlocking 1) are CUDA's. */

EXPORT hipError_t hipDeviceGetStreamPriorityRange(int *least, int *greatest) {
    return to_hip(cudaDeviceGetStreamPriorityRange(least, greatest));
}
EXPORT hipError_t hipStreamCreateWithPriority(hipStream_t *stream, unsigned flags, int priority) {
    return to_hip(cudaStreamCreateWithPriority((cudaStream_t *)stream, flags, priority));
}
EXPORT hipError_t hipStreamCreateWithFlags(hipStream_t *stream, unsigned flags) {
    return to_hip(cudaStreamCreateWithFlags((cudaStream_t *)stream, flags));
}
EXPORT hipError_t hipStreamDestroy(hipStream_t stream) { return to_hip(cudaStreamDestroy((cudaStream_t)stream)); }
/* HIP refuses the null stream's flags (hipErrorInvalidValue) where CUDA answers 0. */
EXPORT hipError_t hipStreamGetFlags(hipStream_t stream, unsigned *flags) {
    if (stream == NULL) {
        return 1;
    }
    return to_hip(cudaStreamGetFlags((cudaStream_t)stream, flags));
}
EXPORT hipError_t hipStreamGetPriority(hipStream_t stream, int *priority) {
    return to_hip(cudaStreamGetPriority((cudaStream_t)stream, priority));
}
EXPORT hipError_t hipStreamQuery(hipStream_t stream) { return to_hip(cudaStreamQuery((cudaStream_t)stream)); }
EXPORT hipError_t hipStreamSynchronize(hipStream_t stream) {
    return to_hip(cudaStreamSynchronize((cudaStream_t)stream));
}
EXPORT hipError_t hipStreamWaitEvent(hipStream_t stream, hipEvent_t event, unsigned flags) {
    return to_hip(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, flags));
}

/* A HIP callback and its data, carried through CUDA's callback so that the status it receives
 * is HIP's number. */
typedef struct {
    hipStreamCallback_t callback;
    void *data;
} callback_call;

static void CUDART_CB callback_trampoline(cudaStream_t stream, cudaError_t status, void *raw) {
    callback_call call = *(callback_call *)raw;
    free(raw);
    call.callback((hipStream_t)stream, to_hip(status), call.data);
}

EXPORT hipError_t hipStreamAddCallback(hipStream_t stream, hipStreamCallback_t callback, void *data, unsigned flags) {
    callback_call *call = malloc(sizeof *call);
    if (call == NULL) {
        return 2;
    }
    call->callback = callback;
    call->data = data;
    cudaError_t e = cudaStreamAddCallback((cudaStream_t)stream, callback_trampoline, call, flags);
    if (e != cudaSuccess) {
        free(call); /* refused: CUDA never calls the trampoline */
    }
    return to_hip(e);
}

/* Events. hipEventBlockingSync 1, hipEventDisableTiming 2, hipEventInterprocess 4 are CUDA's. */

EXPORT hipError_t hipEventCreateWithFlags(hipEvent_t *event, unsigned flags) {
    return to_hip(cudaEventCreateWithFlags((cudaEvent_t *)event, flags));
}
EXPORT hipError_t hipEventDestroy(hipEvent_t event) { return to_hip(cudaEventDestroy((cudaEvent_t)event)); }
EXPORT hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream) {
    return to_hip(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream));
}
EXPORT hipError_t hipEventQuery(hipEvent_t event) { return to_hip(cudaEventQuery((cudaEvent_t)event)); }
EXPORT hipError_t hipEventSynchronize(hipEvent_t event) { return to_hip(cudaEventSynchronize((cudaEvent_t)event)); }
EXPORT hipError_t hipEventElapsedTime(float *ms, hipEvent_t start, hipEvent_t end) {
    return to_hip(cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end));
}

/* Virtual memory, on the driver API. HIP 5.2's types: hipMemAllocationProp in 5.2's layout (5.3
 * changed it to CUDA's), the handle as a pointer holding CUDA's handle value. Location type
 * Device is 1 and access ReadWrite is 3 in both; the handle type None and allocation type Pinned
 * are 0 and 1 in both. CUresult's numbers for these calls' failures are the runtime's. */

typedef struct {
    int type;
    int id;
} hipMemLocation;
typedef struct {
    unsigned char compressionType;
    hipMemLocation location;
    int requestedHandleType;
    int type;
    unsigned short usage;
    void *win32HandleMetaData;
} hipMemAllocationProp;
typedef struct {
    hipMemLocation location;
    int flags;
} hipMemAccessDesc;
typedef void *hipMemGenericAllocationHandle_t;

static hipError_t from_driver(CUresult r) { return to_hip((cudaError_t)r); }

/* CUDA's properties for HIP 5.2's: pinned device memory at the same location. */
static CUmemAllocationProp cuda_properties(const hipMemAllocationProp *p) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = (CUmemAllocationType)p->type;
    prop.requestedHandleTypes = (CUmemAllocationHandleType)p->requestedHandleType;
    prop.location.type = (CUmemLocationType)p->location.type;
    prop.location.id = p->location.id;
    prop.allocFlags.compressionType = p->compressionType;
    prop.allocFlags.usage = p->usage;
    return prop;
}

EXPORT hipError_t hipMemGetAllocationGranularity(size_t *granularity, const hipMemAllocationProp *prop, int option) {
    if (prop == NULL) {
        return 1;
    }
    CUmemAllocationProp cu = cuda_properties(prop);
    return from_driver(cuMemGetAllocationGranularity(granularity, &cu, (CUmemAllocationGranularity_flags)option));
}
EXPORT hipError_t hipMemAddressReserve(void **ptr, size_t size, size_t alignment, void *addr, unsigned long long flags) {
    CUdeviceptr out = 0;
    CUresult r = cuMemAddressReserve(&out, size, alignment, (CUdeviceptr)(uintptr_t)addr, flags);
    if (r == CUDA_SUCCESS) {
        *ptr = (void *)(uintptr_t)out;
    }
    return from_driver(r);
}
EXPORT hipError_t hipMemAddressFree(void *ptr, size_t size) {
    return from_driver(cuMemAddressFree((CUdeviceptr)(uintptr_t)ptr, size));
}
EXPORT hipError_t hipMemCreate(hipMemGenericAllocationHandle_t *handle, size_t size, const hipMemAllocationProp *prop,
                               unsigned long long flags) {
    if (prop == NULL) {
        return 1;
    }
    CUmemAllocationProp cu = cuda_properties(prop);
    CUmemGenericAllocationHandle out = 0;
    CUresult r = cuMemCreate(&out, size, &cu, flags);
    if (r == CUDA_SUCCESS) {
        *handle = (hipMemGenericAllocationHandle_t)(uintptr_t)out;
    }
    return from_driver(r);
}
EXPORT hipError_t hipMemRelease(hipMemGenericAllocationHandle_t handle) {
    return from_driver(cuMemRelease((CUmemGenericAllocationHandle)(uintptr_t)handle));
}
EXPORT hipError_t hipMemMap(void *ptr, size_t size, size_t offset, hipMemGenericAllocationHandle_t handle,
                            unsigned long long flags) {
    return from_driver(
        cuMemMap((CUdeviceptr)(uintptr_t)ptr, size, offset, (CUmemGenericAllocationHandle)(uintptr_t)handle, flags));
}
EXPORT hipError_t hipMemSetAccess(void *ptr, size_t size, const hipMemAccessDesc *desc, size_t count) {
    if (count > 64) {
        return 1;
    }
    CUmemAccessDesc cu[64];
    for (size_t i = 0; i < count; i++) {
        memset(&cu[i], 0, sizeof cu[i]);
        cu[i].location.type = (CUmemLocationType)desc[i].location.type;
        cu[i].location.id = desc[i].location.id;
        cu[i].flags = (CUmemAccess_flags)desc[i].flags;
    }
    return from_driver(cuMemSetAccess((CUdeviceptr)(uintptr_t)ptr, size, cu, count));
}
EXPORT hipError_t hipMemUnmap(void *ptr, size_t size) {
    return from_driver(cuMemUnmap((CUdeviceptr)(uintptr_t)ptr, size));
}
