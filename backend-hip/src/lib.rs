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
//! The runtime is reached through [hip-sys]'s raw bindings (`hip_sys::hiprt`, generated from HIP
//! 5.4's headers) with this crate's own thin checked-call layer (`result.rs`). hip-sys types
//! every status code as a Rust enum, and receiving a value it does not list would be undefined
//! behaviour, so `result.rs` declares the functions this crate calls again with the code as a
//! plain integer; hip-sys supplies the handle types, the argument enums and constants, and the
//! link to the library.
//!
//! hip-sys's build script links `amdhip64` at link time. It looks for
//! `include/hip/hip_runtime_api.h` under `hipconfig -p`, `$HIP_PATH`, `$ROCM_PATH`, `/opt/rocm`
//! and `/opt/rocm/hip`, fails the build when none has it, and adds `$HIP_PATH/lib` to the
//! library path. On Debian 12, `libamdhip64-dev` (HIP 5.2.3) installs both under `/usr`:
//!
//! ```text
//! apt-get install -y libamdhip64-dev
//! HIP_PATH=/usr cargo build -p gpumem-hip
//! ```
//!
//! # A missing runtime library
//!
//! Differs from the CUDA backend, which loads libcuda at run time: because `libamdhip64` is
//! linked, a program built with this backend needs `libamdhip64.so.5` to start at all. Without it
//! the dynamic loader stops the program before `main` ("error while loading shared libraries"),
//! so this backend never returns [`Error::DriverNotFound`](gpumem_core::Error::DriverNotFound).
//! (Loading the library at run time would mean resolving every function through `dlopen`, with
//! hip-sys kept for its types while its build script still requires the headers; gpumem does not
//! do that.) What the library itself reports is mapped in full: on a machine with the library
//! but no AMD GPU (no `/dev/kfd`), `hipGetDeviceCount` answers `hipErrorNoDevice`, and every
//! operation of this backend that would call the runtime then returns
//! [`Error::NoDevice`](gpumem_core::Error::NoDevice) (the capture operations, which never call
//! it, stay `Unsupported`).
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

/// Virtual memory is not implemented on HIP: every operation answers `Unsupported` and
/// `CAPS.virtual_memory` is false. (HIP 5.2's runtime, `libamdhip64.so.5.2`, does export
/// `hipMemAddressReserve`, `hipMemAddressFree`, `hipMemCreate`, `hipMemRelease`, `hipMemMap`,
/// `hipMemSetAccess`, `hipMemUnmap` and `hipMemGetAllocationGranularity`; the binding crate does
/// not declare them, and they have never run on AMD hardware here.)
impl gpumem_core::VirtualMemoryOps for Hip {}

use gpumem_core::{Api, Caps, Runtime};

pub use event::HipEvent;
pub use graph::HipGraph;
pub use stream::HipStream;

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
        virtual_memory: false,
        peer_access: true,
    };
    type Stream = HipStream;
    type Event = HipEvent;
    /// A type without values: this backend offers no capture.
    type Graph = HipGraph;
}

impl Runtime for Hip {
    gpumem_core::runtime_statics!(Hip);
}
