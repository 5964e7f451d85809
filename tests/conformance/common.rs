//! What every conformance test shares.

/// Declares conformance tests: each is a `#[test]`, ignored with a reason on GPU builds (see the
/// crate docs), and starts by making sure a device is there, failing when it is not.
#[macro_export]
macro_rules! conformance {
    ($($(#[$meta:meta])* fn $name:ident() $body:block)*) => {$(
        #[test]
        #[cfg_attr(
            any(feature = "cuda", feature = "hip"),
            ignore = "needs a GPU: run with --include-ignored on a machine that has one"
        )]
        $(#[$meta])*
        fn $name() {
            $crate::common::require_device();
            $body
        }
    )*};
}

/// Fails the test when the backend has no device.
pub fn require_device() {
    if let Err(e) = gpumem::Device::count() {
        panic!("the {} backend has no device: {e}", <gpumem::DefaultBackend as gpumem::Backend>::NAME);
    }
}

/// Whether the backend supports stream capture (every backend but HIP).
pub fn supports_capture() -> bool {
    <gpumem::DefaultBackend as gpumem::Backend>::NAME != "hip"
}

/// Reads `n` bytes back from device memory.
pub fn read(p: &gpumem::MemoryPointer, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    p.copy_to_host(&mut out, n).expect("copy_to_host");
    out
}

/// Serialises the tests that capture with the tests that synchronise a whole device: CUDA refuses
/// a device-wide synchronisation while any stream of the device captures, and the tests of this
/// binary run in parallel.
pub fn capture_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
