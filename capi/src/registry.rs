//! The address map: which chunk each address the ABI lent belongs to.
//!
//! C callers free by address, while the pool hands out [`PooledMemory`] values that go back when
//! dropped. The map keeps each lent chunk under its address until the caller frees it. It lives
//! here, outside the pool: the pool's own hot path stays free of it, and the map's cost is paid
//! only by callers that need it.
//!
//! The map is split into [`SHARDS`] shards, each a small mutex-guarded hash map, chosen by a
//! multiplicative hash of the address. Threads allocating at the same time almost always lock
//! different shards, so the map does not serialise them the way one lock would. The per-shard
//! counters are kept under the same lock, so counting costs no extra atomic operation.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::ThreadId;

use gpumem::{DeviceId, DevicePtr};

/// A chunk of the ABI's pool.
pub(crate) type PooledMemory = gpumem::core::PooledMemory<crate::pool::CountingAllocator>;
use parking_lot::Mutex;

use crate::ffi::{fail, Failure};

/// The number of shards (a power of two).
pub(crate) const SHARDS: usize = 64;

/// A stream as the ABI tells streams apart: its raw handle, and for the per-thread default
/// stream (raw value 2, a different stream on every thread) the thread it was used on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StreamId {
    pub(crate) ptr: usize,
    pub(crate) thread: Option<ThreadId>,
}

impl StreamId {
    /// The per-thread default stream's raw value (`cudaStreamPerThread`).
    pub(crate) const PER_THREAD: usize = 2;

    /// The stream with raw value `ptr`, as seen from the calling thread.
    pub(crate) fn on_this_thread(ptr: usize) -> StreamId {
        let thread = (ptr == Self::PER_THREAD).then(|| std::thread::current().id());
        StreamId { ptr, thread }
    }

    /// Whether the calling thread can name this stream by its raw value (not so for another
    /// thread's per-thread default stream).
    pub(crate) fn nameable_here(self) -> bool {
        self.thread.is_none_or(|t| t == std::thread::current().id())
    }
}

/// One lent chunk: the chunk itself (returned to the pool when dropped) and what the allocation
/// was asked with, to check the free against.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) mem: PooledMemory,
    pub(crate) stream: StreamId,
    pub(crate) device: DeviceId,
    /// The size the caller asked for (before rounding).
    pub(crate) size: usize,
    /// Other streams the chunk was used on (`gpumem_record_stream`), to wait for at its free.
    pub(crate) recorded: Vec<StreamId>,
}

/// A hash for 512-byte-aligned addresses: Fibonacci hashing of the address's unit number, so
/// consecutive chunks spread over buckets and shards.
#[derive(Default)]
pub(crate) struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `usize` keys are hashed; this keeps the hasher correct for anything else.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(FIBONACCI);
        }
    }
    fn write_usize(&mut self, addr: usize) {
        self.0 = address_hash(addr);
    }
}

const FIBONACCI: u64 = 0x9E37_79B9_7F4A_7C15;

fn address_hash(addr: usize) -> u64 {
    ((addr as u64) >> 9).wrapping_mul(FIBONACCI)
}

#[derive(Default)]
struct Shard {
    live: HashMap<DevicePtr, Entry, BuildHasherDefault<AddressHasher>>,
    mallocs: u64,
    frees: u64,
    cross_stream_frees: u64,
}

/// The address map. See the [module docs](self).
pub(crate) struct Registry {
    shards: Box<[Mutex<Shard>]>,
}

/// Counts kept by the map, summed over its shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) live: u64,
    pub(crate) mallocs: u64,
    pub(crate) frees: u64,
    pub(crate) cross_stream_frees: u64,
}

/// How a free is checked against its allocation.
pub(crate) struct FreeRequest {
    pub(crate) ptr: DevicePtr,
    pub(crate) device: DeviceId,
    /// The size the caller says it asked for; `None` when the caller does not pass one (CuPy).
    pub(crate) size: Option<usize>,
}

impl Registry {
    fn new() -> Self {
        Registry { shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect() }
    }

    fn shard(&self, addr: DevicePtr) -> &Mutex<Shard> {
        // The top bits of the hash are the best mixed.
        let index = (address_hash(addr) >> (64 - SHARDS.trailing_zeros())) as usize;
        &self.shards[index]
    }

    /// Keeps `entry` under its chunk's address.
    ///
    /// # Errors
    ///
    /// An internal error if the address is already lent (the pool never lends one address twice;
    /// the new chunk then goes back to the pool).
    pub(crate) fn insert(&self, entry: Entry) -> Result<DevicePtr, Failure> {
        let addr = entry.mem.ptr();
        let mut shard = self.shard(addr).lock();
        if shard.live.contains_key(&addr) {
            drop(shard);
            return fail!("internal error: address 0x{addr:x} lent twice");
        }
        shard.live.insert(addr, entry);
        shard.mallocs += 1;
        Ok(addr)
    }

    /// Takes the entry of `request.ptr` out of the map, after checking the free against it.
    ///
    /// # Errors
    ///
    /// When the address is not one the ABI lent (never allocated here, already freed, or inside a
    /// chunk rather than at its start), or the device or size differs from the allocation's.
    /// Nothing is freed then.
    pub(crate) fn take(
        &self,
        request: &FreeRequest,
        cross_stream: impl Fn(&Entry) -> bool,
    ) -> Result<Entry, Failure> {
        let addr = request.ptr;
        let mut shard = self.shard(addr).lock();
        let Some(entry) = shard.live.get(&addr) else {
            drop(shard);
            return fail!(
                "0x{addr:x} is not an address gpumem lent: it was never allocated here, was already freed, \
                 or points inside an allocation"
            );
        };
        if entry.device != request.device {
            return fail!(
                "0x{addr:x} was allocated on device {}, not on device {}; nothing freed",
                entry.device,
                request.device
            );
        }
        if let Some(size) = request.size {
            if size != entry.size {
                return fail!(
                    "0x{addr:x} was allocated with size {}, freed with size {size}; nothing freed",
                    entry.size
                );
            }
        }
        let cross = cross_stream(entry);
        let entry = shard.live.remove(&addr).expect("the entry was found under this lock");
        shard.frees += 1;
        shard.cross_stream_frees += u64::from(cross);
        Ok(entry)
    }

    /// Runs `f` on the entry of `ptr` under its shard's lock.
    ///
    /// # Errors
    ///
    /// When the address is not one the ABI lent (or already took back).
    pub(crate) fn with_entry<R>(
        &self,
        ptr: DevicePtr,
        f: impl FnOnce(&mut Entry) -> R,
    ) -> Result<R, Failure> {
        match self.shard(ptr).lock().live.get_mut(&ptr) {
            Some(entry) => Ok(f(entry)),
            None => fail!("0x{ptr:x} is not an address gpumem lent, or it was already freed"),
        }
    }

    /// The map's counts, summed over its shards (each shard is read under its lock; the sum is
    /// not one snapshot while other threads allocate).
    pub(crate) fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for shard in &*self.shards {
            let s = shard.lock();
            c.live += s.live.len() as u64;
            c.mallocs += s.mallocs;
            c.frees += s.frees;
            c.cross_stream_frees += s.cross_stream_frees;
        }
        c
    }
}

/// The process-wide map.
pub(crate) fn registry() -> &'static Registry {
    static REGISTRY: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
    REGISTRY.get_or_init(Registry::new)
}

/// Failed calls, by kind of entry point. Failures are the cold path: plain atomics suffice.
pub(crate) struct FailureCounts {
    mallocs: AtomicU64,
    frees: AtomicU64,
    other: AtomicU64,
}

/// The process-wide failure counts.
pub(crate) static FAILED: FailureCounts =
    FailureCounts { mallocs: AtomicU64::new(0), frees: AtomicU64::new(0), other: AtomicU64::new(0) };

impl FailureCounts {
    /// Counts one failure of the entry point `name`.
    pub(crate) fn count(&self, name: &str) {
        let counter = match name {
            "gpumem_torch_malloc" | "gpumem_cupy_malloc" => &self.mallocs,
            "gpumem_torch_free" | "gpumem_cupy_free" => &self.frees,
            _ => &self.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// `(failed mallocs, failed frees, other failed calls)`.
    pub(crate) fn get(&self) -> (u64, u64, u64) {
        (
            self.mallocs.load(Ordering::Relaxed),
            self.frees.load(Ordering::Relaxed),
            self.other.load(Ordering::Relaxed),
        )
    }
}
