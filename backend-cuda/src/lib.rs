//! gpumem's CUDA backend: [`Cuda`] implements [`gpumem_core::Backend`] (each file implements one of its traits) on the CUDA driver API.
//!
//! It translates each backend operation into one driver call (or a few), following the contract
//! in [`gpumem_core::hal`]: it validates nothing the typed layer already checked, keeps no
//! pool of its own, and never panics, also when the driver is missing.
//!
//! # The driver and cudarc
//!
//! gpumem's own driver calls do not go through any binding crate: [`sys`] declares the entry
//! points this crate calls with the C signatures of `cuda.h` and integer results, and resolves
//! them from libcuda at run time (`libloading`), so this crate builds on machines without CUDA.
//! Every one of them is exported by every driver from CUDA 12.0 on, CUDA 13 drivers included.
//!
//! Before the first driver call this crate opens the library, once per process, resolves every
//! entry point and calls `cuInit(0)`. A missing library, the toolkit's stub library or a driver
//! older than CUDA 12.0 (an entry point missing) is
//! [`Error::DriverNotFound`](gpumem_core::Error::DriverNotFound); `CUDA_ERROR_NO_DEVICE` is
//! [`Error::NoDevice`](gpumem_core::Error::NoDevice).
//!
//! [cudarc](https://docs.rs/cudarc/0.19) is an optional dependency, for interop only (the `cudarc` feature: the `interop`
//! module, and cudarc itself re-exported as `gpumem_cuda::cudarc`). Any cudarc 0.19 release will
//! do, and gpumem picks none of cudarc's `cuda-XXXXX` version features, so an application's own
//! cudarc (with whichever version feature and loading mode it uses) and gpumem build together;
//! the `cudarc-cuda-12000` feature picks the 12.0 bindings for a build that has no cudarc of its
//! own. Both name the one libcuda loaded in the process, the same primary contexts, streams and
//! memory.
//!
//! # Errors
//!
//! Codes are integers from the FFI boundary on, so a code a newer driver adds is an ordinary
//! value. `CUDA_ERROR_OUT_OF_MEMORY` from an allocation is
//! [`Error::OutOfMemory`](gpumem_core::Error::OutOfMemory) with `total: None`;
//! `CUDA_ERROR_NO_DEVICE` is `NoDevice`; `malloc_async` on a device without memory pools is
//! [`Error::Unsupported`](gpumem_core::Error::Unsupported); every other failure is
//! [`Error::Backend`](gpumem_core::Error::Backend) with the entry point's name, the numeric code,
//! and the driver's name and text for it (`cuGetErrorName`, `cuGetErrorString`).
//!
//! # Contexts
//!
//! gpumem runs everything in each device's *primary context*, the one the CUDA runtime uses, so
//! pointers, streams and events pass freely between gpumem and runtime-API libraries. Each
//! device's primary context is retained once, on first use, and kept for the rest of the process.
//! Every operation takes the device it runs in and makes that device's primary context current
//! on the calling thread, calling `cuCtxSetCurrent` only when a thread-local cache says another
//! context is current. Code outside gpumem that changes the thread's current context behind its
//! back should make a device current again with `Device::use_device`, which always calls
//! `cuCtxSetCurrent`.
//!
//! # The associated types
//!
//! - `Stream` is [`CudaStream`], a `Copy` handle (`CUstream`). The raw values 0, 1 and 2 are the
//!   null stream, `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`, as in CUDA and CuPy.
//! - `Event` is [`CudaEvent`], an owned `CUevent`.
//! - `Graph` is [`CudaGraph`], the captured `CUgraph` with its instantiated `CUgraphExec`.
//!
//! # Operations worth knowing
//!
//! - Synchronous copies and memsets (`cuMemcpy`, `cuMemsetD8`) run on the legacy default stream,
//!   as CuPy's do, and then wait for it: CUDA returns from a device-to-device `cuMemcpy` and from
//!   `cuMemsetD8` before the work is done, and gpumem's synchronous forms promise it is done.
//! - The stream-ordered allocator uses each device's default memory pool, with its release
//!   threshold raised to the maximum on first use so freed memory stays cached in the driver.
//! - Host functions go to `cuLaunchHostFunc` as given (gpumem's `HostFn` is exactly the driver's
//!   function type) and are captured into graphs like any work. One-shot callbacks go through
//!   `cuStreamAddCallback` and a trampoline that never unwinds.
//! - Capture uses `cuStreamBeginCapture` with the mode asked for (relaxed by default, as CuPy),
//!   `cuStreamEndCapture` and `cuGraphInstantiateWithFlags(.., 0)`; capture status comes from
//!   `cuStreamIsCapturing`.

#![cfg_attr(docsrs, feature(doc_cfg))]

// CUDA runs on 64-bit hosts only, and this crate converts between gpumem's `usize` addresses and
// the driver's 64-bit `CUdeviceptr` with plain casts.
#[cfg(not(target_pointer_width = "64"))]
compile_error!("gpumem-cuda needs a 64-bit target");

mod device;
mod event;
mod graph;
#[cfg(feature = "cudarc")]
#[cfg_attr(docsrs, doc(cfg(feature = "cudarc")))]
pub mod interop;
mod legacy;
mod memory;
mod result;
mod stream;
pub mod sys;
mod vmm;

use gpumem_core::{Api, Caps};

/// The cudarc gpumem interoperates with (the `cudarc` feature), for applications without their
/// own dependency on it.
#[cfg(feature = "cudarc")]
#[cfg_attr(docsrs, doc(cfg(feature = "cudarc")))]
pub use cudarc;
pub use event::CudaEvent;
pub use graph::CudaGraph;
pub use stream::CudaStream;

/// Whether the NVIDIA driver library (libcuda) can be loaded on this machine, asked once per
/// process. When it cannot, every operation of [`Cuda`] returns
/// [`Error::DriverNotFound`](gpumem_core::Error::DriverNotFound).
#[must_use]
pub fn driver_library_present() -> bool {
    result::library_present()
}

/// The CUDA backend: a marker type whose associated functions are driver calls. See the
/// [crate docs](crate).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cuda;

impl Api for Cuda {
    const NAME: &'static str = "cuda";
    const CAPS: Caps = Caps {
        capture: true,
        stream_ordered_allocation: true,
        host_functions: true,
        virtual_memory: true,
        peer_access: true,
    };
    type Stream = CudaStream;
    type Event = CudaEvent;
    type Graph = CudaGraph;
}

gpumem_core::runtime_statics!(Cuda);
