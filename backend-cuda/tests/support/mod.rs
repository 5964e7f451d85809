//! What the CUDA backend's test binaries share.

#![allow(dead_code)] // each binary uses what it needs

use gpumem_core::{Device, MemoryPointer};
use gpumem_cuda::Cuda;

/// Whether `GPUMEM_REQUIRE_DEVICE=1` is set (the GPU machine's runner sets it).
pub fn device_required() -> bool {
    std::env::var("GPUMEM_REQUIRE_DEVICE").is_ok_and(|v| v.trim() == "1")
}

/// The number of devices; fails the test when there is no usable GPU.
pub fn require_gpu() -> usize {
    match Device::<Cuda>::count() {
        Ok(n) => n,
        Err(e) => panic!("this test needs an NVIDIA GPU with its driver, and found none: {e}"),
    }
}

/// The first `n` bytes at `p`, copied to the host.
pub fn read_back(p: &MemoryPointer<Cuda>, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    p.copy_to_host(&mut out, n).expect("copy_to_host");
    out
}
