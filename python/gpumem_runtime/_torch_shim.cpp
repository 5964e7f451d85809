// gpumem as PyTorch's CUDA allocator, with what PyTorch's Python API cannot give a pluggable
// allocator: an out-of-memory thrown as c10::OutOfMemoryError (torch.OutOfMemoryError in Python)
// at the allocating call, and Tensor.record_stream forwarded to gpumem_record_stream.
//
// gpumem_runtime.torch compiles this file against the installed PyTorch the first time enable()
// runs (and caches the library); it is handed the C ABI's entry points as addresses, so it links
// to nothing of gpumem's.
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <string>
#include <sys/types.h>

namespace {
using MallocFn = void* (*)(ssize_t, int, cudaStream_t);
using FreeFn = void (*)(void*, ssize_t, int, cudaStream_t);
using RecordStreamFn = int (*)(void*, cudaStream_t);
using LastErrorFn = const char* (*)();

// gpumem's message for the failure this thread just had.
std::string message(LastErrorFn last_error, const char* fallback) {
  const char* e = last_error();
  return e != nullptr ? std::string(e) : std::string(fallback);
}
} // namespace

// Makes gpumem PyTorch's current CUDA allocator. Returns 0, or -1 with PyTorch's message in `error`
// (for one, an allocator already in use).
extern "C" int gpumem_torch_shim_install(
    void* malloc_fn,
    void* free_fn,
    void* record_stream_fn,
    void* last_error_fn,
    char* error,
    size_t error_len) {
  try {
    auto gpumem_malloc = reinterpret_cast<MallocFn>(malloc_fn);
    auto gpumem_free = reinterpret_cast<FreeFn>(free_fn);
    auto gpumem_record_stream = reinterpret_cast<RecordStreamFn>(record_stream_fn);
    auto last_error = reinterpret_cast<LastErrorFn>(last_error_fn);
    auto allocator = torch::cuda::CUDAPluggableAllocator::createCustomAllocator(
        [=](size_t size, int device, cudaStream_t stream) -> void* {
          void* ptr = gpumem_malloc(static_cast<ssize_t>(size), device, stream);
          if (ptr == nullptr && size != 0) {
            std::string what = message(last_error, "gpumem: the allocation failed");
            // gpumem's out-of-memory messages are CuPy's: "Out of memory allocating ...".
            bool out_of_memory = what.find("Out of memory") != std::string::npos;
            TORCH_CHECK_WITH(OutOfMemoryError, !out_of_memory, what);
            TORCH_CHECK(false, what);
          }
          return ptr;
        },
        [=](void* ptr, size_t size, int device, cudaStream_t stream) {
          gpumem_free(ptr, static_cast<ssize_t>(size), device, stream);
        });
    auto pluggable =
        std::dynamic_pointer_cast<torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator>(allocator);
    TORCH_CHECK(pluggable != nullptr, "PyTorch's custom allocator is not a CUDAPluggableAllocator");
    pluggable->set_record_stream_fn([=](void* ptr, cudaStream_t stream) {
      if (gpumem_record_stream(ptr, stream) != 0) {
        TORCH_CHECK(false, message(last_error, "gpumem_record_stream failed"));
      }
    });
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(error, error_len, "%s", e.what());
    return -1;
  }
}
