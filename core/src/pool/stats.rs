//! The pool's statistics, snapshot and summary, as PyTorch's caching allocator reports them
//! (`torch.cuda.memory_stats`, `memory_snapshot`, `memory_summary`).
//!
//! # What is counted
//!
//! Each arena (the chunks of one stream) counts under its own lock, with plain integers, so the
//! cache-hit path adds a few additions and comparisons and touches nothing shared. Per arena and
//! for the whole pool, as PyTorch's `DeviceStats`:
//!
//! - **requested** bytes: what the callers asked for; **allocated** bytes: the chunks lent (the
//!   requests rounded to the allocation unit), until their owner frees them; **active** bytes:
//!   allocated, or freed behind a fence that has not completed (PyTorch's blocks waiting for
//!   their stream's events); **reserved** bytes: held from the raw allocator;
//! - **allocations** and **active allocations** (chunks), **segments** (raw blocks);
//! - each as a [`Stat`]: current, peak, and the totals allocated and freed (so raw allocations
//!   and raw frees are `segments.allocated` and `segments.freed`);
//! - cache hits and misses (lends served by a new or grown block), and for the pool the
//!   allocations that failed for want of memory and those that went down the retry ladder.
//!
//! A pool-wide current value is the sum of its arenas'. A pool-wide peak is exact while one
//! arena served every allocation since the peaks were last reset (one stream, the common case:
//! [`PoolStats::peaks_exact`]); with several, arenas share no counter (that is what keeps their
//! hot paths apart), and the pool's peak is the sum of their peaks, an upper bound. The reserved
//! peak is always exact: the pool counts reserved bytes in one place, off the hot path.

use std::fmt::{self, Write as _};

use crate::error::Error;
use crate::hal::types::{DeviceId, DevicePtr};

use super::arena::{ChunkView, Counters, State};
use super::ArenaKey;

/// One statistic, as PyTorch's `Stat`: its current value, its peak since the last reset, and
/// how much was added and taken away in all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Stat {
    /// Now.
    pub current: u64,
    /// The most at once since the pool was made or its peaks were reset.
    pub peak: u64,
    /// Added in all.
    pub allocated: u64,
    /// Taken away in all.
    pub freed: u64,
}

impl Stat {
    fn new(allocated: u64, freed: u64, peak: u64) -> Stat {
        let current = allocated - freed;
        Stat { current, peak: peak.max(current), allocated, freed }
    }
}

/// The statistics of an arena or of a whole pool. See the [module docs](self).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MemoryStats {
    /// Bytes the callers asked for, of the chunks allocated.
    pub requested_bytes: Stat,
    /// Bytes of the chunks lent and not yet freed (rounded sizes).
    pub allocated_bytes: Stat,
    /// Allocated bytes and those freed behind a fence that has not completed.
    pub active_bytes: Stat,
    /// Bytes held from the raw allocator.
    pub reserved_bytes: Stat,
    /// Chunks allocated.
    pub allocations: Stat,
    /// Chunks allocated or waiting for their fence.
    pub active_allocations: Stat,
    /// Raw blocks held: `allocated` counts the raw allocations, `freed` the raw frees.
    pub segments: Stat,
    /// Allocations served from the cache.
    pub cache_hits: u64,
    /// Allocations served by a new raw block or a grown one.
    pub cache_misses: u64,
    /// Allocations that failed for want of memory (the limit or the device); 0 per arena.
    pub oom_errors: u64,
    /// Allocations that released the cache and retried (the retry ladder's runs); 0 per arena.
    pub retries: u64,
    /// Allocations served by a free chunk of another stream's arena
    /// ([`Pool::set_share_across_streams`](super::Pool::set_share_across_streams)); 0 per arena.
    /// They count among their owner arena's allocations, not the borrower's.
    #[cfg_attr(feature = "serde", serde(default))]
    pub lent_across_streams: u64,
}

impl MemoryStats {
    /// Statistics of `c`, whose arena has `used` bytes and `lent` chunks active.
    pub(crate) fn of(c: &Counters, used: u64, lent: u64) -> MemoryStats {
        MemoryStats {
            requested_bytes: Stat::new(c.requested_lent, c.requested_freed, c.peak_requested),
            allocated_bytes: Stat::new(c.bytes_lent, c.bytes_freed, c.peak_allocated),
            active_bytes: Stat::new(c.bytes_lent, c.bytes_lent - used, c.peak_active),
            reserved_bytes: Stat::new(c.reserved_in, c.reserved_out, c.peak_reserved),
            allocations: Stat::new(c.allocs, c.frees, c.peak_allocations),
            active_allocations: Stat::new(c.allocs, c.allocs - lent, c.peak_active_allocations),
            // Blocks moved between a stream's lanes count in `current` (and cancel out in
            // a pool's sum), not among the raw allocations and frees.
            segments: Stat {
                current: c.segments_held(),
                peak: c.peak_segments.max(c.segments_held()),
                allocated: c.raw_allocs,
                freed: c.raw_frees,
            },
            cache_hits: c.allocs - c.misses,
            cache_misses: c.misses,
            oom_errors: 0,
            retries: 0,
            lent_across_streams: 0,
        }
    }
}

/// One arena's statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ArenaStats {
    /// Which arena: a stream's, or another lane of a stream (whose [`ArenaKey::stream_key`] is
    /// that stream's).
    pub arena: ArenaKey,
    /// Its statistics since it was made (an arena left with no memory is dropped from the pool;
    /// its counts stay in the pool's).
    pub stats: MemoryStats,
}

/// A pool's statistics: the whole pool and each of its arenas.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PoolStats {
    /// The pool's device.
    pub device: DeviceId,
    /// The whole pool.
    pub all: MemoryStats,
    /// Whether the pool-wide peaks of requested, allocated and active bytes and of allocations
    /// are exact (one arena since the last reset) or the sum of the arenas' peaks, an upper
    /// bound. The reserved peak is always exact.
    pub peaks_exact: bool,
    /// Each arena in the pool, by key.
    pub arenas: Vec<ArenaStats>,
}

/// A chunk's state in a [`PoolSnapshot`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum BlockState {
    /// Cached, free to lend (PyTorch's `inactive`).
    Free,
    /// Lent out (PyTorch's `active_allocated`).
    Allocated,
    /// Freed behind a fence that has not completed (PyTorch's `active_pending_free`).
    PendingFree,
}

/// One chunk of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BlockSnapshot {
    /// Its first address.
    pub address: DevicePtr,
    /// Its size in bytes.
    pub size: usize,
    /// The bytes asked for, when lent (0 when free).
    pub requested_size: usize,
    /// Free, allocated or waiting for a fence.
    pub state: BlockState,
}

/// One raw block and the chunks it is cut into, in address order.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SegmentSnapshot {
    /// The stream whose arena the block belongs to ([`ArenaKey::stream_key`]: a block of any lane
    /// of a stream shows as that stream's).
    pub arena: ArenaKey,
    /// The block's first address.
    pub address: DevicePtr,
    /// Its size in bytes: what it holds (with stitching, less the ranges whose pages moved).
    pub total_size: usize,
    /// Its chunks, which cover it (with stitching, all but the ranges whose pages moved, which
    /// hold no memory).
    pub blocks: Vec<BlockSnapshot>,
}

/// Every segment of a pool, as PyTorch's `memory_snapshot()`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct PoolSnapshot {
    /// The pool's device.
    pub device: DeviceId,
    /// Its segments, by address.
    pub segments: Vec<SegmentSnapshot>,
}

impl PoolSnapshot {
    /// The segments of one arena, from its state.
    pub(crate) fn segments_of(
        arena: ArenaKey,
        raw: Vec<(DevicePtr, usize, Vec<ChunkView>)>,
    ) -> Vec<SegmentSnapshot> {
        raw.into_iter()
            .map(|(address, total_size, chunks)| SegmentSnapshot {
                arena,
                address,
                total_size,
                blocks: chunks
                    .into_iter()
                    .map(|c| BlockSnapshot {
                        address: c.ptr,
                        size: c.size,
                        requested_size: c.requested,
                        state: match c.state {
                            // Lifted chunks are left out of the views.
                            State::Free | State::Vacant | State::Lifted => BlockState::Free,
                            State::Lent => BlockState::Allocated,
                            State::Fenced => BlockState::PendingFree,
                        },
                    })
                    .collect(),
            })
            .collect()
    }
}

/// What an out-of-memory observer is: called with the error about to be returned and the
/// pool's snapshot at that moment (see [`Pool::add_oom_observer`](super::Pool::add_oom_observer)).
pub type OomObserver = dyn Fn(&Error, &PoolSnapshot) + Send + Sync;

/// PyTorch's size column: six digits and a binary unit, the unit chosen by `scale` (the row's
/// peak or total), so that a row reads in one unit.
fn bytes(n: u64, scale: u64) -> String {
    const UNITS: [&str; 5] = ["B  ", "KiB", "MiB", "GiB", "TiB"];
    let (mut n, mut scale, mut unit) = (n, scale, 0);
    while unit + 1 < UNITS.len() && scale >= 768 * 1024 {
        n /= 1024;
        scale /= 1024;
        unit += 1;
    }
    format!("{n:6} {}", UNITS[unit])
}

/// PyTorch's count column: seven digits and a decimal unit.
fn count(n: u64, scale: u64) -> String {
    const UNITS: [&str; 3] = [" ", "K", "M"];
    let (mut n, mut scale, mut unit) = (n, scale, 0);
    while unit + 1 < UNITS.len() && scale >= 750_000 {
        n /= 1000;
        scale /= 1000;
        unit += 1;
    }
    format!("{n:7} {} ", UNITS[unit])
}

/// How an arena is named in the summary.
fn arena_name(key: ArenaKey) -> String {
    match key.per_thread_number() {
        Some(thread) => format!("per-thread, thread {thread}"),
        None if key == ArenaKey::NULL => "null stream".to_string(),
        None => format!("stream 0x{:x}", key.raw()),
    }
}

const WIDTH: usize = 77;

impl fmt::Display for PoolStats {
    /// The summary table (PyTorch's `memory_summary()` layout: one section per statistic, the
    /// pool's row and one row per arena).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rule = |c: char| format!("|{}|\n", c.to_string().repeat(WIDTH));
        let mut out = String::new();
        out += &rule('=');
        out += &format!("|{:^WIDTH$}|\n", format!("gpumem memory summary, device {}", self.device));
        out += &rule('-');
        let note = if self.peaks_exact {
            "peaks exact (one arena since the last reset)"
        } else {
            "pool peaks <= sum of the arenas' peaks (several arenas)"
        };
        out += &format!("| {:<w$}|\n", note, w = WIDTH - 1);
        out += &rule('=');
        out += &format!(
            "| {:<24}| {:^10} | {:^10} | {:^10} | {:^10} |\n",
            "Metric", "Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed"
        );
        type Pick = fn(&MemoryStats) -> Stat;
        let sections: [(&str, Pick, bool); 7] = [
            ("Allocated memory", |s| s.allocated_bytes, true),
            ("Active memory", |s| s.active_bytes, true),
            ("Requested memory", |s| s.requested_bytes, true),
            ("Reserved memory", |s| s.reserved_bytes, true),
            ("Allocations", |s| s.allocations, false),
            ("Active allocs", |s| s.active_allocations, false),
            ("Reserved segments", |s| s.segments, false),
        ];
        for (title, pick, is_bytes) in sections {
            out += &rule('-');
            let rows = std::iter::once((title.to_string(), pick(&self.all)))
                .chain(self.arenas.iter().map(|a| (format!("  {}", arena_name(a.arena)), pick(&a.stats))));
            for (name, st) in rows {
                let cell = |n: u64, scale: u64| if is_bytes { bytes(n, scale) } else { count(n, scale) };
                let mut name = name;
                if name.len() > 24 {
                    name.truncate(24);
                }
                let _ = writeln!(
                    out,
                    "| {:<24}| {} | {} | {} | {} |",
                    name,
                    cell(st.current, st.peak),
                    cell(st.peak, st.peak),
                    cell(st.allocated, st.allocated),
                    cell(st.freed, st.freed),
                );
            }
        }
        out += &rule('-');
        let a = &self.all;
        let _ = writeln!(
            out,
            "| {:<w$}|",
            format!(
                "cache hits {}, misses {}, raw allocs {}, raw frees {}",
                a.cache_hits, a.cache_misses, a.segments.allocated, a.segments.freed
            ),
            w = WIDTH - 1
        );
        let _ = writeln!(
            out,
            "| {:<w$}|",
            format!("out-of-memory errors {}, retry-ladder runs {}", a.oom_errors, a.retries),
            w = WIDTH - 1
        );
        out += &rule('=');
        f.write_str(&out)
    }
}
