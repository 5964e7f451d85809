//! gpumem's HIP backend: [`Hip`] implements [`gpumem_core::Backend`] on the HIP runtime
//! (`libamdhip64`), for AMD GPUs.
//!
//! It translates each backend operation into one runtime call (or a few), following the contract
//! in [`gpumem_core::hal`]: it validates nothing the typed layer already checked, keeps no
//! pool of its own, and never panics. Its files mirror the CUDA backend's, item for item, so the
//! two read side by side; every place where HIP makes this backend differ says so where it
//! happens.
//!
//! # The runtime and hip-sys
//!
//! The runtime is loaded at run time, as the CUDA backend loads libcuda: the first operation
//! opens `libamdhip64` with `dlopen` (through libloading) and resolves every entry point this
//! crate calls before calling any (`result.rs`, whose unit test keeps the list in step with the
//! calls). [hip-sys] (its raw bindings, `hip_sys::hiprt`, generated from HIP 5.4's headers)
//! supplies only the types: handles, argument enums and constants. hip-sys types every status
//! code as a Rust enum, and receiving a value it does not list would be undefined behaviour, so
//! this crate declares the entry points itself, with the code as a plain integer.
//!
//! The library is looked for as `libamdhip64.so`, `libamdhip64.so.6` and `libamdhip64.so.5`,
//! first under `$HIP_PATH/lib` when `HIP_PATH` is set, then on the dynamic loader's search path
//! (`LD_LIBRARY_PATH`, the system's folders). [`runtime_library`] says which was loaded.
//!
//! Building still needs HIP's headers: hip-sys's build script looks for
//! `include/hip/hip_runtime_api.h` under `hipconfig -p`, `$HIP_PATH`, `$ROCM_PATH`, `/opt/rocm`
//! and `/opt/rocm/hip`, fails the build when none has it, and asks the linker for `amdhip64`
//! from `$HIP_PATH/lib`. No symbol of the library is referenced, so the linker (`--as-needed`,
//! rustc's default on Linux) records no dependency on it: `readelf -d` on a program of this crate
//! lists no `libamdhip64`, and CI checks that. On Debian 12, `libamdhip64-dev` (HIP 5.2.3)
//! installs headers and library under `/usr`:
//!
//! ```text
//! apt-get install -y libamdhip64-dev
//! HIP_PATH=/usr cargo build -p gpumem-hip
//! ```
//!
//! # A missing runtime library
//!
//! A program built with this backend starts on any machine. Where no `libamdhip64` loads, or
//! the one found lacks an entry point (a runtime older than HIP 5.2), every operation of this
//! backend returns [`Error::DriverNotFound`](gpumem_core::Error::DriverNotFound), saying what was
//! tried and what to install (the capture operations, which never call the runtime, stay
//! `Unsupported`). On a machine with the library but no AMD GPU (no `/dev/kfd`),
//! `hipGetDeviceCount` answers `hipErrorNoDevice`, and every operation that would call the
//! runtime then returns [`Error::NoDevice`](gpumem_core::Error::NoDevice).
//!
//! # Errors
//!
//! Codes are handled as integers. `hipErrorOutOfMemory` from an allocation (`hipMalloc`,
//! `hipHostMalloc`, `hipMallocAsync`) is [`Error::OutOfMemory`](gpumem_core::Error::OutOfMemory)
//! with `total: None`; `hipErrorNoDevice`, or a device count of 0, is `NoDevice`; `malloc_async`
//! on a device without memory pools and every capture operation are
//! [`Error::Unsupported`](gpumem_core::Error::Unsupported); every other failure is
//! [`Error::Backend`](gpumem_core::Error::Backend) with the function's name, the numeric code,
//! and the runtime's name and text for it (`hipGetErrorName`, `hipGetErrorString`).
//!
//! # Devices
//!
//! HIP has one implicit context per device, selected per thread with `hipSetDevice`. Every
//! operation takes the device it runs on and makes it current on the calling thread, calling
//! `hipSetDevice` only when a thread-local cache says another device is current. Code outside
//! gpumem that calls `hipSetDevice` behind its back should make a device current again with
//! `Device::use_device`, which always calls `hipSetDevice`.
//!
//! # The associated types
//!
//! - `Stream` is [`HipStream`], a `Copy` handle (`hipStream_t`). The raw value 0 is the null
//!   stream, which is also the legacy stream (HIP 5.2 has no `hipStreamLegacy`; see
//!   [`HipStream::LEGACY`]), and 2 is `hipStreamPerThread`. A raw value of 1 is read as the
//!   legacy stream.
//! - `Event` is [`HipEvent`], an owned `hipEvent_t`.
//! - `Graph` is [`HipGraph`], a type without values: this backend offers no capture.
//!
//! # What HIP 5.2 lacks, and what this backend does instead
//!
//! - **Stream capture and graphs**: not offered. `begin_capture`, `end_capture`,
//!   `capture_status`, `graph_launch`, `graph_upload` and `graph_destroy` return
//!   `Error::Unsupported { operation, backend: "hip" }` without calling the runtime. HIP 5.2's
//!   graph API is beta, and its library exports neither `hipGraphUpload` nor
//!   `hipLaunchHostFunc` (which capturing a host function needs); CuPy skips its graph tests on
//!   HIP. The typed layer reads `capture_status`'s answer as "not capturing" before transfers,
//!   as CuPy skips its capture checks on HIP.
//! - **`hipLaunchHostFunc`**: declared in 5.2's headers but not exported by its library. Host
//!   functions go through `hipStreamAddCallback`, which runs them once the work before them is
//!   done and holds later work until they return.
//! - **Legacy stream handle**: none; the null stream is the legacy stream.
//! - **Per-thread default stream**: `hipStreamPerThread` (2) exists in 5.2 and is used as is.
//! - **Stream-ordered allocator**: `hipMallocAsync` exists (beta in 5.2). Where the device
//!   reports no memory pools (or the runtime does not know the attribute), `malloc_async` is
//!   `Unsupported`; otherwise the default pool's release threshold is raised on first use, as on
//!   CUDA.
//! - **Virtual memory** (expandable segments and stitching): `hipMemAddressReserve`,
//!   `hipMemCreate`, `hipMemMap`, `hipMemSetAccess`, `hipMemUnmap`, `hipMemRelease`,
//!   `hipMemAddressFree` and `hipMemGetAllocationGranularity`, exported from HIP 5.1 on. The
//!   allocation properties' layout changed in HIP 5.3 and the runtime's version picks it; a
//!   runtime that answers `hipErrorNotSupported` gets `Unsupported` (see `vmm.rs`).
//! - **Priorities**: `hipStreamCreateWithPriority` and `hipDeviceGetStreamPriorityRange` exist;
//!   HIP 5.2 (hipamd) has three levels and reports the range as (1, -1).
//! - **Flags of the null stream**: HIP refuses the question (`hipErrorInvalidValue`); the default
//!   flags are answered without asking, as CUDA would answer.
//! - **Pointer attributes**: HIP 5 answers `hipErrorInvalidValue` for plain host memory, read as
//!   "no device"; the memory type is read as an integer with the numbering of the runtime's
//!   major version (ROCm 6 renumbered it).
//! - **Device properties**: read attribute by attribute, as on CUDA; attributes a runtime does
//!   not know get a documented default.
//!
//! # Operations worth knowing
//!
//! - Synchronous copies and memsets (`hipMemcpy` with `hipMemcpyDefault`, `hipMemset`) run on
//!   the null stream, as CuPy's do, and then wait for it, as the CUDA backend does.
//! - Peer access: `hipErrorPeerAccessAlreadyEnabled` is success, and the thread's last error it
//!   leaves behind is cleared.
//! - One-shot callbacks go through `hipStreamAddCallback` and a trampoline that never unwinds.
//!
//! # Tests
//!
//! `tests/hip.rs` runs wherever the library is installed. Without an AMD GPU it checks the
//! no-device answers and the unsupported capture operations; the tests that need a GPU are
//! ignored with the reason, and fail, rather than skip, when run with `--include-ignored` where
//! no device is found. None of them has run on AMD hardware yet.
//!
//! # Testing on NVIDIA GPUs, and what that cannot tell
//!
//! `scripts/hip-on-cuda/` holds a small `libamdhip64.so` written on the CUDA runtime (for
//! testing only): it exports every entry point this crate calls with HIP 5.2's ABI and
//! translates status codes both ways (the virtual-memory calls go to the driver's `cuMem*`, with
//! HIP 5.2's allocation properties, so the 5.3 layout is checked only by a layout test). `scripts/gpu-hip-tests.sh` builds it with nvcc on an
//! NVIDIA machine and runs this crate's tests and its conformance suite through it
//! (`GPUMEM_REQUIRE_DEVICE=1`, `--include-ignored`), then under compute-sanitizer's memcheck. That
//! checks this crate's own logic (argument passing, the entry-point table, code mapping, the
//! device cache, callbacks and host functions, the stream-ordered allocator's setup) on a real
//! GPU. It cannot tell what only AMD's runtime does:
//!
//! - hipamd's own semantics where they differ from CUDA's: whether `hipMemcpy`/`hipMemset`
//!   block, how the null stream synchronises, the order and thread callbacks run on, the
//!   priority range ((1, -1) on HIP 5.2, CUDA's (0, -5) through the shim);
//! - AMD devices' attributes (gfx architecture as "compute capability", memory-pool support and
//!   its release threshold on ROCm, unified addressing on every ROCm process);
//! - whether an AMD device and runtime offer virtual memory at all, and its granule there;
//! - the codes AMD's runtime actually returns (the shim returns CUDA's translated, and answers
//!   `hipErrorInvalidValue` for unregistered host pointers and the null stream's flags as HIP 5
//!   does by design, not by observation), and `hipGetErrorString`'s texts (CUDA's, through the
//!   shim);
//! - ROCm 6's changes (the renumbered `hipMemoryType`, the `.so.6` library name): the shim
//!   reports version 5.2;
//! - multi-GPU peer access over AMD's fabric, `/dev/kfd` detection, and anything about HIP's
//!   kernel-side behaviour (gpumem launches no kernels).
//!
//! [hip-sys]: https://crates.io/crates/hip-sys

// ROCm runs on 64-bit hosts only, and this crate converts between gpumem's `usize` addresses and
// HIP's pointers with plain casts.
#[cfg(not(target_pointer_width = "64"))]
compile_error!("gpumem-hip needs a 64-bit target");

mod device;
mod event;
mod graph;
mod memory;
mod result;
mod stream;
mod vmm;

use std::path::Path;

use gpumem_core::{Api, Caps};

pub use event::HipEvent;
pub use graph::HipGraph;
pub use stream::HipStream;

/// Loads the HIP runtime library, if no operation has yet, and says where it was found: the path
/// under `$HIP_PATH/lib`, or the bare name the dynamic loader resolved (`libamdhip64.so`, `.so.6`
/// or `.so.5`). Loading happens once per process; every operation of [`Hip`] starts from it.
///
/// # Errors
///
/// `Error::DriverNotFound` when no libamdhip64 loads or the one found lacks an entry point this
/// crate calls; the message says what was tried and what to install.
pub fn runtime_library() -> gpumem_core::Result<&'static Path> {
    result::library()
}

/// The HIP backend: a marker type whose associated functions are HIP runtime calls. See the
/// [crate docs](crate).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Hip;

impl Api for Hip {
    const NAME: &'static str = "hip";
    const CAPS: Caps = Caps {
        capture: false,
        stream_ordered_allocation: true,
        host_functions: true,
        virtual_memory: true,
        peer_access: true,
    };
    type Stream = HipStream;
    type Event = HipEvent;
    /// A type without values: this backend offers no capture.
    type Graph = HipGraph;
}

gpumem_core::runtime_statics!(Hip);
