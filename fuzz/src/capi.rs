//! The C ABI's entry points on the host backend, called as a C program might: any size, device,
//! stream handle (live, destroyed, arbitrary), address (lent, inside a chunk, freed, arbitrary),
//! limit, fraction and policy name, and null out-pointers.
//!
//! The model keeps what the ABI lent. After every call: a success leaves no error message and a
//! failure leaves one; a chunk is lent only once, aligned, and keeps the bytes written to it
//! until it is freed (so overlapping chunks show); a free succeeds exactly when it names a lent
//! chunk with its size, device and a usable stream; `n_live` and each device's `used_bytes`
//! equal the model's. Each input ends by freeing what it holds and restoring the limits and
//! policies, so inputs do not depend on each other.

use std::ffi::{c_void, CStr, CString};
use std::sync::{Mutex, OnceLock};

use arbitrary::{Arbitrary, Unstructured};
use gpumem_capi::*;

/// The most calls one input makes.
const MAX_OPS: usize = 200;
/// The host backend's simulated devices (its default).
const DEVICES: i32 = 2;

#[derive(Arbitrary, Clone, Copy, Debug)]
enum Size {
    Bytes(u16),
    /// Up to 4 MiB in KiB.
    KiB(u16),
    Negative(i32),
    /// Past any simulated device (32 GiB and up), or the largest value.
    Huge(u8),
}

impl Size {
    fn value(self) -> isize {
        match self {
            Size::Bytes(n) => isize::from(n as i16).unsigned_abs() as isize,
            Size::KiB(n) => (usize::from(n % 4096) << 10) as isize,
            Size::Negative(n) => -(n.unsigned_abs() as isize).max(1),
            Size::Huge(n) if n == u8::MAX => isize::MAX,
            Size::Huge(n) => (32isize << 30) << (n % 24),
        }
    }
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum Device {
    Zero,
    One,
    Any(i32),
}

impl Device {
    fn id(self) -> i32 {
        match self {
            Device::Zero => 0,
            Device::One => 1,
            Device::Any(d) => d,
        }
    }
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum Stream {
    Null,
    Legacy,
    PerThread,
    /// A host stream that stays live.
    Live,
    /// A host stream's handle after the stream was destroyed.
    Destroyed,
    Raw(u64),
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum Address {
    /// A chunk the model holds (index modulo their number), or a free address if none.
    Lent(u8),
    /// Inside a chunk the model holds.
    Inside(u8, u16),
    /// An address freed before.
    Freed(u8),
    Raw(u64),
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum FreeSize {
    /// The allocation's size.
    Same,
    /// A negative size (skips the check).
    Negative,
    Other(Size),
}

#[derive(Arbitrary, Debug)]
enum Op {
    TorchMalloc { size: Size, device: Device, stream: Stream },
    TorchFree { address: Address, size: FreeSize, device: Device, stream: Stream },
    CupyMalloc { size: Size, device: Device },
    CupyFree { address: Address, device: Device },
    SetLimit { device: Device, bytes: u64 },
    SetLimitFraction { device: Device, fraction: f64 },
    GetLimit { device: Device, null: bool },
    SetPolicy { device: Device, name: Option<Vec<u8>> },
    GetPolicy { device: Device },
    GetStats { device: Device, null: bool },
    FreeAllBlocks { device: Device },
}

/// A chunk the ABI lent, as the model knows it.
#[derive(Clone, Copy, Debug)]
struct Chunk {
    ptr: usize,
    size: usize,
    device: i32,
    /// The stream's raw value (torch), or `None` (CuPy's entry points).
    stream: Option<usize>,
    /// The byte written over the chunk.
    pattern: u8,
}

/// Two host streams: one live for good, and the handle of one destroyed.
fn streams() -> &'static (gpumem::Stream, usize) {
    static STREAMS: OnceLock<(gpumem::Stream, usize)> = OnceLock::new();
    STREAMS.get_or_init(|| {
        let live = gpumem::Stream::non_blocking().expect("a host stream");
        let destroyed = gpumem::Stream::non_blocking().expect("a host stream").ptr();
        (live, destroyed)
    })
}

fn raw_stream(s: Stream) -> usize {
    match s {
        Stream::Null => 0,
        Stream::Legacy => 1,
        Stream::PerThread => 2,
        Stream::Live => streams().0.ptr(),
        Stream::Destroyed => streams().1,
        Stream::Raw(v) => usize::try_from(v).unwrap_or(usize::MAX),
    }
}

fn last_error() -> Option<String> {
    let p = gpumem_last_error();
    // SAFETY: a non-null result is a NUL-terminated string valid until this thread's next call.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn stats(device: i32) -> GpumemStats {
    let mut s = GpumemStats::default();
    // SAFETY: `s` is a valid out-pointer.
    assert_eq!(unsafe { gpumem_get_stats(device, &mut s) }, 0, "{:?}", last_error());
    s
}

/// The model: the chunks lent and addresses freed.
#[derive(Default)]
struct Model {
    lent: Vec<Chunk>,
    freed: Vec<usize>,
    next_pattern: u8,
}

impl Model {
    fn address(&self, a: Address) -> usize {
        let pick = |i: u8, v: &[usize]| (!v.is_empty()).then(|| v[usize::from(i) % v.len()]);
        let lent: Vec<usize> = self.lent.iter().map(|c| c.ptr).collect();
        match a {
            Address::Lent(i) => pick(i, &lent).unwrap_or(0x1000),
            Address::Inside(i, off) => {
                let c = (!self.lent.is_empty()).then(|| self.lent[usize::from(i) % self.lent.len()]);
                c.map_or(0x2000, |c| c.ptr + 1 + usize::from(off) % c.size.max(1))
            }
            Address::Freed(i) => pick(i, &self.freed).unwrap_or(0x3000),
            Address::Raw(v) => usize::try_from(v).unwrap_or(usize::MAX),
        }
    }

    fn lend(&mut self, ptr: usize, size: usize, device: i32, stream: Option<usize>) {
        assert_eq!(ptr % 512, 0, "0x{ptr:x} is not 512-byte aligned");
        for c in &self.lent {
            assert!(
                ptr + size <= c.ptr || c.ptr + c.size <= ptr,
                "0x{ptr:x}+{size} overlaps the lent chunk {c:x?}"
            );
        }
        self.next_pattern = self.next_pattern.wrapping_add(1).max(1);
        let pattern = self.next_pattern;
        // SAFETY: on the host backend a chunk is host memory; the ABI lent `size` bytes at `ptr`
        // and nothing else uses them.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, pattern, size) };
        self.lent.push(Chunk { ptr, size, device, stream, pattern });
    }

    /// Checks each chunk still holds its pattern: every 64th byte and the last (an overlapping
    /// chunk, at least 512 bytes, overwrites some of those).
    fn check_contents(&self) {
        for c in &self.lent {
            // SAFETY: as in `lend`: the chunk is still lent.
            let bytes = unsafe { std::slice::from_raw_parts(c.ptr as *const u8, c.size) };
            let last = c.size.saturating_sub(1);
            for i in (0..c.size).step_by(64).chain(std::iter::once(last).filter(|_| c.size > 0)) {
                assert_eq!(bytes[i], c.pattern, "chunk {c:x?}: byte {i} changed while lent");
            }
        }
    }

    fn take(&mut self, ptr: usize) -> Option<Chunk> {
        let i = self.lent.iter().position(|c| c.ptr == ptr)?;
        self.freed.push(ptr);
        if self.freed.len() > 64 {
            self.freed.remove(0);
        }
        Some(self.lent.swap_remove(i))
    }
}

/// Whether a stream handle is one the ABI must accept on the host backend.
fn usable(stream: usize) -> bool {
    gpumem::core::host::is_live_stream(stream)
}

/// Checks what one allocation call returned, and records a chunk.
fn after_malloc(model: &mut Model, p: *mut c_void, size: isize, device: i32, stream: Option<usize>) {
    let error = last_error();
    if p.is_null() {
        let expected_quiet = size == 0;
        assert_eq!(error.is_none(), expected_quiet, "a null allocation of {size}: error {error:?}");
        return;
    }
    assert_eq!(error, None, "an allocation succeeded with an error message");
    assert!(
        size > 0 && (0..DEVICES).contains(&device),
        "size {size} on device {device} lent 0x{:x}",
        p as usize
    );
    if let Some(s) = stream {
        assert!(usable(s), "stream 0x{s:x}, not live, lent memory");
    }
    model.lend(p as usize, size as usize, device, stream);
}

/// Checks what one free call did: it freed the chunk at `ptr` exactly when `expect_ok`, or
/// when a chunk there was lent and the call left no error.
fn after_free(model: &mut Model, ptr: usize, n_live_before: u64, expect_ok: bool) {
    let error = last_error();
    let n_live = stats(0).n_live;
    if ptr == 0 {
        assert_eq!((error, n_live), (None, n_live_before), "a free of address 0");
        return;
    }
    if error.is_none() {
        assert!(model.take(ptr).is_some(), "a free of 0x{ptr:x}, not lent, succeeded");
        assert_eq!(n_live + 1, n_live_before, "a successful free of 0x{ptr:x} freed no chunk");
    } else {
        assert!(!expect_ok, "a free of a lent chunk with its own arguments failed: {error:?}");
        assert_eq!(n_live, n_live_before, "a failed free of 0x{ptr:x} changed what is lent: {error:?}");
    }
}

/// Runs one input; panics on a finding.
pub fn run(data: &[u8]) {
    // The ABI's pool and counters are the process's: one input at a time.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let _ = streams();
    let n_live_at_start = stats(0).n_live;
    assert_eq!(n_live_at_start, 0, "an earlier input left chunks lent");

    let mut u = Unstructured::new(data);
    let mut model = Model::default();
    for _ in 0..MAX_OPS {
        let Ok(op) = u.arbitrary::<Op>() else { break };
        if crate::print_ops() {
            eprintln!("{op:?}");
        }
        apply(&mut model, op);
        model.check_contents();
        assert_eq!(stats(0).n_live, model.lent.len() as u64, "n_live against the chunks lent");
        for device in 0..DEVICES {
            let used: usize =
                model.lent.iter().filter(|c| c.device == device).map(|c| c.size.next_multiple_of(512)).sum();
            assert_eq!(
                stats(device).used_bytes,
                used,
                "device {device}'s used_bytes against the chunks lent"
            );
        }
    }
    end(&mut model);
}

fn apply(model: &mut Model, op: Op) {
    match op {
        Op::TorchMalloc { size, device, stream } => {
            let (size, device, stream) = (size.value(), device.id(), raw_stream(stream));
            // SAFETY: the ABI refuses handles that are not live host streams (the contract checked).
            let p = unsafe { gpumem_torch_malloc(size, device, stream as CudaStream) };
            after_malloc(model, p, size, device, Some(stream));
        }
        Op::CupyMalloc { size, device } => {
            let (size, device) = (size.value(), device.id());
            let Ok(bytes) = usize::try_from(size) else { return };
            // SAFETY: CuPy's entry point takes no stream; `param` is ignored.
            let p = unsafe { gpumem_cupy_malloc(std::ptr::null_mut(), bytes, device) };
            after_malloc(model, p, size, device, None);
        }
        Op::TorchFree { address, size, device, stream } => {
            let ptr = model.address(address);
            let chunk = model.lent.iter().copied().find(|c| c.ptr == ptr);
            let size = match (size, chunk) {
                (FreeSize::Same, Some(c)) => c.size as isize,
                (FreeSize::Same, None) => 512,
                (FreeSize::Negative, _) => -1,
                (FreeSize::Other(s), _) => s.value(),
            };
            let (device, stream) = (device.id(), raw_stream(stream));
            let expect_ok = chunk.is_some_and(|c| {
                c.stream.is_some()
                    && (size < 0 || size as usize == c.size)
                    && device == c.device
                    && usable(stream)
            });
            let before = stats(0).n_live;
            // SAFETY: the ABI refuses handles that are not live host streams; the model's
            // chunks are not used after a successful free.
            unsafe { gpumem_torch_free(ptr as *mut c_void, size, device, stream as CudaStream) };
            after_free(model, ptr, before, expect_ok);
        }
        Op::CupyFree { address, device } => {
            let ptr = model.address(address);
            let device = device.id();
            let expect_ok =
                model.lent.iter().any(|c| c.ptr == ptr && c.stream.is_none() && c.device == device);
            let before = stats(0).n_live;
            // SAFETY: the model's chunks are not used after a successful free.
            unsafe { gpumem_cupy_free(std::ptr::null_mut(), ptr as *mut c_void, device) };
            after_free(model, ptr, before, expect_ok);
        }
        Op::SetLimit { device, bytes } => {
            let ok = gpumem_set_limit(device.id(), usize::try_from(bytes).unwrap_or(usize::MAX)) == 0;
            assert_eq!(ok, last_error().is_none());
        }
        Op::SetLimitFraction { device, fraction } => {
            let ok = gpumem_set_limit_fraction(device.id(), fraction) == 0;
            assert_eq!(ok, last_error().is_none());
            assert!(ok || !(0.0..=1.0).contains(&fraction) || !(0..DEVICES).contains(&device.id()));
        }
        Op::GetLimit { device, null } => {
            let mut bytes = 0usize;
            let out = if null { std::ptr::null_mut() } else { &raw mut bytes };
            // SAFETY: `out` is null or a valid out-pointer.
            let ok = unsafe { gpumem_get_limit(device.id(), out) } == 0;
            assert_eq!(ok, last_error().is_none());
            assert!(!ok || !null, "a null out-pointer was accepted");
        }
        Op::SetPolicy { device, name } => {
            let name = name.map(|bytes| {
                let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
                CString::new(&bytes[..end]).expect("no NUL")
            });
            let p = name.as_ref().map_or(std::ptr::null(), |n| n.as_ptr());
            // SAFETY: `p` is null or a NUL-terminated string.
            let ok = unsafe { gpumem_set_growth_policy(device.id(), p) } == 0;
            assert_eq!(ok, last_error().is_none());
        }
        Op::GetPolicy { device } => {
            let p = gpumem_get_growth_policy(device.id());
            assert_eq!(p.is_null(), last_error().is_some());
        }
        Op::GetStats { device, null } => {
            let mut s = GpumemStats::default();
            let out = if null { std::ptr::null_mut() } else { &raw mut s };
            // SAFETY: `out` is null or a valid out-pointer.
            let ok = unsafe { gpumem_get_stats(device.id(), out) } == 0;
            assert_eq!(ok, last_error().is_none());
            assert!(!ok || !null, "a null out-pointer was accepted");
        }
        Op::FreeAllBlocks { device } => {
            let ok = gpumem_free_all_blocks(device.id()) == 0;
            assert_eq!(ok, last_error().is_none());
        }
    }
}

/// Frees what the input holds and restores every device's limit and policy.
fn end(model: &mut Model) {
    for c in std::mem::take(&mut model.lent) {
        // SAFETY: the chunk's own stream (checked live when it was lent; the live stream never
        // goes) or CuPy's entry point.
        unsafe {
            match c.stream {
                Some(s) => {
                    gpumem_torch_free(c.ptr as *mut c_void, c.size as isize, c.device, s as CudaStream)
                }
                None => gpumem_cupy_free(std::ptr::null_mut(), c.ptr as *mut c_void, c.device),
            }
        }
        assert_eq!(last_error(), None, "freeing {c:x?} at the end");
    }
    for device in 0..DEVICES {
        assert_eq!(gpumem_set_limit(device, 0), 0);
        let policy = c"cache_until_out_of_memory";
        // SAFETY: a NUL-terminated string.
        assert_eq!(unsafe { gpumem_set_growth_policy(device, policy.as_ptr()) }, 0);
        assert_eq!(gpumem_free_all_blocks(device), 0);
        let s = stats(device);
        assert_eq!((s.used_bytes, s.n_live), (0, 0), "device {device} after everything was freed");
    }
}
