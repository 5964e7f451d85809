//! Replaying a trace through gpumem's pool on a counting raw allocator.
//!
//! Everything that touches the pool's internals (its raw-allocator trait, its growth policies,
//! its streams) is in this file.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use gpumem::core::pool::counting::Counting;
use gpumem::core::pool::trace as pool_trace;
use gpumem::core::{SingleDeviceMemoryPool, Stream};
use gpumem::host::Host;
use gpumem::{BaseMemory, DeviceId, GrowthPolicy, RawAllocator, RawBlock, Runtime};
use serde::Serialize;

use crate::analysis::Timeline;
use crate::error::{Error, Result};

/// The policy named `name`: `hold_peak_in_use`, or another spelling of it (`hold-peak-in-use`,
/// `HoldPeakInUse`), in any case.
///
/// # Errors
///
/// [`Error::InvalidArgument`] listing the names for an unknown one.
pub fn parse_policy(name: &str) -> Result<GrowthPolicy> {
    name.parse::<GrowthPolicy>().map_err(|e| match e {
        gpumem::Error::InvalidArgument(message) => Error::InvalidArgument(message),
        other => Error::InvalidArgument(other.to_string()),
    })
}

/// One step of a replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Allocate `size` bytes on stream number `stream` (0 is the null stream), known as `id`
    /// until freed.
    Alloc {
        /// The allocation's number.
        id: usize,
        /// Bytes asked for.
        size: usize,
        /// The stream, numbered from 0 in order of first use.
        stream: usize,
    },
    /// Free allocation `id`.
    Free {
        /// The allocation's number.
        id: usize,
    },
}

/// The steps of a trace, in order: each allocation's requested size, its stream numbered in
/// order of first appearance (the stream the trace calls 0, or the first one seen, is the null
/// stream), and its free if the trace has one. Allocations of every device go to the one pool.
#[must_use]
pub fn steps(timeline: &Timeline) -> Vec<Step> {
    let mut numbers: HashMap<u64, usize> = HashMap::new();
    numbers.insert(0, 0);
    let mut by_step: Vec<Option<Step>> = vec![None; timeline.steps];
    for a in &timeline.allocations {
        let next = numbers.len();
        let stream = *numbers.entry(a.stream).or_insert(next);
        by_step[a.start] = Some(Step::Alloc { id: a.id, size: a.size as usize, stream });
        if let Some(end) = a.end {
            by_step[end] = Some(Step::Free { id: a.id });
        }
    }
    by_step.into_iter().flatten().collect()
}

/// Where the program's iterations begin among [`steps`]' steps: the trace's `step` lines
/// ([`Timeline::marks`]), each at the step of the operation after it. Every step of the timeline
/// is one replay step (an allocation's start or its end), so the indexes carry over.
#[must_use]
pub fn marks(timeline: &Timeline) -> Vec<usize> {
    let mut marks: Vec<usize> = timeline.marks.iter().copied().filter(|&m| m < timeline.steps).collect();
    marks.dedup();
    marks
}

/// Peak requested bytes in use over `steps`: what any allocator must hold at least (saturating
/// at `u64::MAX`, beyond any memory a replay can have held).
#[must_use]
pub fn peak_in_use(steps: &[Step]) -> u64 {
    let mut live = HashMap::new();
    let (mut used, mut peak) = (0u64, 0u64);
    for step in steps {
        match *step {
            Step::Alloc { id, size, .. } => {
                live.insert(id, size as u64);
                used = used.saturating_add(size as u64);
                peak = peak.max(used);
            }
            Step::Free { id } => used = used.saturating_sub(live.remove(&id).unwrap_or(0)),
        }
    }
    peak
}

/// What a replay measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplayResult {
    /// The policy's name.
    pub policy: &'static str,
    /// The most raw bytes the pool held at once.
    pub peak_held: u64,
    /// The most requested bytes in use at once.
    pub peak_in_use: u64,
    /// `peak_held / peak_in_use` (0 for an empty trace).
    pub ratio: f64,
    /// Raw allocations the pool made.
    pub raw_allocs: u64,
    /// Raw frees the pool made while the trace ran (not counting those of dropping the pool at
    /// the end).
    pub raw_frees: u64,
    /// The driver calls a device would have made, the pool's drop at the end not counted: one
    /// per raw allocation or free of a fixed block; with growing blocks, each page's creation,
    /// mapping, access and their undoing (the pool's `trace::DriverCalls`).
    pub driver_calls: u64,
    /// Allocations served by another stream's free chunk (with
    /// [`ReplayOptions::share_across_streams`]; 0 otherwise).
    pub lent_across_streams: u64,
    /// With [`ReplayOptions::plan`]: what the plan learned from the loop did.
    pub plan: Option<PlanResult>,
}

/// What the plan learned from the loop did in a replay with [`ReplayOptions::plan`] (the pool's
/// `trace::PlanReplay`): the figures are taken from the end of the first iteration served from
/// the plan (*settled*) to the end of the trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlanResult {
    /// The iteration (its number among the trace's `step` lines) at whose start the plan came in
    /// force, or with [`ReplayOptions::plan_automatically`] the event (its index); `None` if it
    /// never did (no two iterations in a row repeated).
    pub in_force_at: Option<usize>,
    /// The most raw bytes held at once, once settled (0 if the plan never settled).
    pub peak_held: u64,
    /// The most requested bytes in use at once, once settled.
    pub peak_in_use: u64,
    /// `peak_held / peak_in_use` once settled (0 if the plan never settled).
    pub ratio: f64,
    /// Raw allocations and frees once settled.
    pub raw_calls: u64,
    /// Of them, raw allocations (the others give back blocks the loop no longer used).
    pub raw_allocs: u64,
    /// The raw bytes held at the end of the trace, once settled: the steady loop's, after the
    /// blocks a plan's first iterations still used were given back.
    pub held_at_end: u64,
    /// Allocations served from the plan over the whole trace.
    pub served: u64,
    /// Allocations that departed from a plan and went to the pool.
    pub departed: u64,
    /// Plans put in force (more than one: the loop changed and was planned again).
    pub plans: u64,
    /// With [`ReplayOptions::plan_automatically`]: the period found last, in allocations (0 if
    /// none).
    pub period: u64,
    /// Periods found (a period that failed is followed by a longer one).
    pub periods_found: u64,
}

/// What to replay with.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReplayOptions {
    /// Grow blocks in place, as expandable segments do, instead of allocating fixed blocks.
    pub expandable: bool,
    /// Lend free memory across the trace's streams, as `GPUMEM_SHARE_ACROSS_STREAMS=1` does
    /// (the replay runs no device work, so the streams need no ordering).
    pub share_across_streams: bool,
    /// Mark the program's iterations as it did (`Pool::step` at each of the marks given to
    /// [`replay_marked`]), so the pool plans from the loop.
    pub plan: bool,
    /// Plan with no marks: the pool finds the loop's iterations from the allocations
    /// (`Pool::plan_automatically`).
    pub plan_automatically: bool,
    /// Stitching, as `GPUMEM_STITCH=1` does: expandable segments whose growths first take the
    /// pages under free chunks (each page lifted counts in a raw free, each mapping of lifted
    /// pages again as a raw allocation).
    pub stitch: bool,
}

/// Replays `steps` through a host-backend pool with `policy`, on [`UntouchedHostMemory`] (so
/// a trace whose peak exceeds this machine's memory still replays); with `expandable` or
/// `share_across_streams`, through the pool's own rules on a counting allocator
/// ([`replay_expandable`] is one of those).
///
/// # Errors
///
/// [`Error::Pool`] if the pool fails (out of host memory, or `GPUMEM_GPU_MEMORY_LIMIT` below
/// the trace's needs).
pub fn replay(steps: &[Step], policy: GrowthPolicy, options: ReplayOptions) -> Result<ReplayResult> {
    replay_marked(steps, &[], policy, options)
}

/// As [`replay`], with the program's iterations beginning at steps `marks` ([`marks`]): with
/// [`ReplayOptions::plan`], the pool is told of each (`Pool::step`) and plans from the loop,
/// through its own rules on a counting allocator as with expandable segments.
///
/// # Errors
///
/// As [`replay`].
pub fn replay_marked(
    steps: &[Step],
    marks: &[usize],
    policy: GrowthPolicy,
    options: ReplayOptions,
) -> Result<ReplayResult> {
    if options.expandable
        || options.stitch
        || options.share_across_streams
        || options.plan
        || options.plan_automatically
    {
        return replay_counted(steps, marks, policy, options);
    }
    replay_on::<Host, _>(steps, policy, 0, UntouchedHostMemory, &mut |_| {})
}

/// Replays `steps` through the pool's own rules with expandable segments, on a raw allocator
/// that hands out address ranges without memory behind them and grows a block in place in 2
/// MiB granules (the pool's `trace::replay_expandable`): each growth counts as a raw
/// allocation and each shrink as a raw free, as PyTorch counts its expandable segments' maps
/// and unmaps. Each stream of the trace is an arena of its own, as in [`replay_on`].
///
/// # Errors
///
/// [`Error::Pool`] if the pool fails.
pub fn replay_expandable(steps: &[Step], policy: GrowthPolicy) -> Result<ReplayResult> {
    replay_counted(steps, &[], policy, ReplayOptions { expandable: true, ..ReplayOptions::default() })
}

/// Replays `steps` through the pool's own rules on a counting allocator that hands out address
/// ranges without memory behind them (`trace::replay_with`), set up as `options` say.
fn replay_counted(
    steps: &[Step],
    marks: &[usize],
    policy: GrowthPolicy,
    options: ReplayOptions,
) -> Result<ReplayResult> {
    let steps: Vec<pool_trace::Step> = steps
        .iter()
        .map(|s| match *s {
            Step::Alloc { id, size, stream } => pool_trace::Step::Alloc { id: id as u64, size, stream },
            Step::Free { id } => pool_trace::Step::Free { id: id as u64 },
        })
        .collect();
    let r = pool_trace::replay_with(
        &steps,
        policy,
        pool_trace::ReplayOptions {
            expandable: options.expandable,
            share_across_streams: options.share_across_streams,
            marks: if options.plan { marks.to_vec() } else { Vec::new() },
            plan: options.plan,
            plan_automatically: options.plan_automatically,
            stitch: options.stitch,
        },
    )?;
    let plan = r.plan.as_ref().map(|p| PlanResult {
        in_force_at: p.in_force_at,
        peak_held: p.peak_held as u64,
        peak_in_use: p.peak_in_use as u64,
        ratio: p.ratio(),
        raw_calls: p.raw_calls as u64,
        raw_allocs: p.raw_allocs as u64,
        held_at_end: p.held_at_end as u64,
        served: p.stats.served,
        departed: p.stats.departed,
        plans: p.stats.plans,
        period: p.stats.period as u64,
        periods_found: p.stats.periods_found,
    });
    Ok(ReplayResult {
        policy: policy.name(),
        peak_held: r.peak_held as u64,
        peak_in_use: r.peak_in_use as u64,
        // 0 for an empty trace, as `replay_on`'s.
        ratio: r.ratio(),
        raw_allocs: r.raw_allocs as u64,
        raw_frees: r.raw_frees as u64,
        driver_calls: r.driver_calls as u64,
        lent_across_streams: r.lent_across_streams as u64,
        plan,
    })
}

/// Replays `steps` through a pool of backend `B` on `device`, whose raw memory comes from
/// `inner` through a counting allocator; `progress` is called with the number of steps done
/// every 4096 steps.
///
/// Each stream number of the trace gets a stream of its own (number 0 the null stream), so each
/// goes to its own arena, as in the recorded program.
///
/// # Errors
///
/// [`Error::Pool`] if the pool or the backend fails.
pub fn replay_on<B: Runtime, A: RawAllocator + Clone>(
    steps: &[Step],
    policy: GrowthPolicy,
    device: DeviceId,
    inner: A,
    progress: &mut dyn FnMut(usize),
) -> Result<ReplayResult>
where
    A::Block: BaseMemory<B>,
{
    let counting = Counting::new(inner);
    let counter = Arc::clone(counting.counts());
    let pool = SingleDeviceMemoryPool::<B, _>::with_allocator(device, counting)?;
    pool.set_growth_policy(policy);
    let n_streams = steps
        .iter()
        .filter_map(|s| if let Step::Alloc { stream, .. } = s { Some(*stream) } else { None })
        .max();
    let streams = (0..n_streams.map_or(0, |n| n + 1))
        .map(|i| if i == 0 { Ok(Stream::<B>::null()) } else { Stream::<B>::non_blocking() })
        .collect::<gpumem::Result<Vec<_>>>()?;
    let mut live = HashMap::new();
    for (i, step) in steps.iter().enumerate() {
        match *step {
            Step::Alloc { id, size, stream } => {
                let _current = streams[stream].enter()?;
                live.insert(id, pool.malloc_pooled(size)?);
            }
            Step::Free { id } => drop(live.remove(&id)),
        }
        if i % 4096 == 4095 {
            progress(i + 1);
        }
    }
    progress(steps.len());
    let raw_frees = counter.frees.load(Ordering::Relaxed) as u64;
    drop(live);
    let lent_across_streams = pool.stats().all.lent_across_streams;
    drop(pool);
    let peak_in_use = peak_in_use(steps);
    let peak_held = counter.peak.load(Ordering::Relaxed) as u64;
    let raw_allocs = counter.allocs.load(Ordering::Relaxed) as u64;
    Ok(ReplayResult {
        policy: policy.name(),
        peak_held,
        peak_in_use,
        ratio: if peak_in_use == 0 { 0.0 } else { peak_held as f64 / peak_in_use as f64 },
        raw_allocs,
        raw_frees,
        // Fixed blocks: one driver call per raw allocation or free.
        driver_calls: raw_allocs + raw_frees,
        lent_across_streams,
        plan: None,
    })
}

/// A raw allocator for the host backend whose blocks are zeroed host memory whose pages the
/// system commits only when something touches them.
///
/// The host backend's own allocator counts each block against the simulated device's capacity
/// and zeroes it with a 512-byte alignment (which the system allocator serves by writing every
/// byte), so replaying a GPU's trace would need that much real memory. These blocks come zeroed
/// from the system's `calloc` instead, at its own alignment, and are aligned within a slightly
/// larger allocation: `calloc` maps large blocks from fresh zero pages without writing them, so a
/// trace of tens of gigabytes replays on a machine with less. The bytes are initialised (zero), so
/// reading them, as a `copy_to_host` of the pool's memory does, is sound. The blocks are real,
/// writable host memory, as the host backend's are, but they are not in its registry of
/// allocations (its copies would not know their device).
#[derive(Clone, Copy, Debug, Default)]
pub struct UntouchedHostMemory;

/// The host backend's alignment, the pool's unit.
const HOST_ALIGN: usize = 512;

/// The alignment asked of the system allocator: one it serves with `calloc` (at most its
/// minimum alignment), so that zeroing writes nothing.
const CALLOC_ALIGN: usize = 8;

/// A block of [`UntouchedHostMemory`].
#[derive(Debug)]
pub struct HostBlock {
    /// The allocation, `HOST_ALIGN - CALLOC_ALIGN` bytes longer than the block.
    base: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
    /// The block's start: `base` rounded up to `HOST_ALIGN`.
    ptr: usize,
    size: usize,
    device: DeviceId,
}

// SAFETY: the block is plain host memory owned by this value alone; nothing about it is tied
// to the thread that allocated it.
unsafe impl Send for HostBlock {}
// SAFETY: this value never reads or writes the block; sharing it shares only its address.
unsafe impl Sync for HostBlock {}

// SAFETY: `ptr..ptr + size` lies within the allocation `base` with `layout` made by
// `alloc_zeroed` (so every byte is initialised), is writable host memory (the host backend's
// device memory is host memory) for as long as this value lives, and the three values never
// change.
unsafe impl BaseMemory<Host> for HostBlock {
    fn ptr(&self) -> usize {
        self.ptr
    }
    fn size(&self) -> usize {
        self.size
    }
    fn device_id(&self) -> DeviceId {
        self.device
    }
    fn identity(&self) -> &'static str {
        "UntouchedHostMemory"
    }
}

impl Drop for HostBlock {
    fn drop(&mut self) {
        // SAFETY: `base` came from `alloc_zeroed(layout)` and is freed once, here.
        unsafe { std::alloc::dealloc(self.base.as_ptr(), self.layout) };
    }
}

impl RawBlock for HostBlock {
    fn address(&self) -> usize {
        self.ptr
    }
    fn size(&self) -> usize {
        self.size
    }
    fn device(&self) -> DeviceId {
        self.device
    }
}

impl RawAllocator for UntouchedHostMemory {
    type Block = HostBlock;

    fn allocate(&self, device: DeviceId, size: usize) -> gpumem::Result<HostBlock> {
        let oom = || gpumem::Error::OutOfMemory { size, total: None };
        let block = size.max(1);
        let padded = block.checked_add(HOST_ALIGN - CALLOC_ALIGN).ok_or_else(oom)?;
        let layout = std::alloc::Layout::from_size_align(padded, CALLOC_ALIGN).map_err(|_| oom())?;
        // SAFETY: `layout` has a non-zero size and a power-of-two alignment.
        let base = std::ptr::NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).ok_or_else(oom)?;
        // At most `HOST_ALIGN - CALLOC_ALIGN` bytes in, since `base` is `CALLOC_ALIGN`-aligned: the
        // block's `block` bytes end within the allocation.
        // (`as usize` exposes the allocation's provenance, for the pool's pointers made from it.)
        let ptr = (base.as_ptr() as usize).next_multiple_of(HOST_ALIGN);
        Ok(HostBlock { base, layout, ptr, size: block, device })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_parse_back() {
        for p in GrowthPolicy::ALL {
            assert_eq!(parse_policy(p.name()).unwrap(), p);
            assert_eq!(parse_policy(&format!("{p:?}")).unwrap(), p);
            assert_eq!(parse_policy(&p.name().replace('_', "-")).unwrap(), p);
        }
        assert!(
            matches!(parse_policy("lru"), Err(Error::InvalidArgument(m)) if m.contains("hold_peak_in_use"))
        );
    }

    #[test]
    fn an_empty_trace_replays_with_expandable_segments_too() {
        let r = replay(
            &[],
            GrowthPolicy::HoldPeakInUse,
            ReplayOptions { expandable: true, ..ReplayOptions::default() },
        )
        .unwrap();
        assert_eq!((r.peak_held, r.peak_in_use, r.ratio, r.raw_allocs), (0, 0, 0.0, 0));
    }

    #[test]
    #[cfg_attr(miri, ignore = "replays thousands of trace steps: too slow under Miri")]
    fn stitching_holds_less_than_expandable_segments_on_the_random_trace_for_more_raw_calls() {
        use gpumem::core::pool::trace as pool_trace;
        let steps: Vec<Step> = pool_trace::on_one_stream(&pool_trace::random_seeded(1))
            .into_iter()
            .map(|s| match s {
                pool_trace::Step::Alloc { id, size, stream } => Step::Alloc { id: id as usize, size, stream },
                pool_trace::Step::Free { id } => Step::Free { id: id as usize },
            })
            .collect();
        let run = |options| replay(&steps, GrowthPolicy::Segments, options).unwrap();
        let expandable = run(ReplayOptions { expandable: true, ..ReplayOptions::default() });
        let stitched = run(ReplayOptions { stitch: true, ..ReplayOptions::default() });
        assert_eq!(stitched.peak_in_use, expandable.peak_in_use);
        assert!(stitched.ratio < expandable.ratio - 0.1, "{} against {}", stitched.ratio, expandable.ratio);
        assert!(stitched.raw_allocs + stitched.raw_frees > expandable.raw_allocs + expandable.raw_frees);
    }

    /// The pool's memory on `UntouchedHostMemory` reads back as zeros through a safe copy (Miri
    /// reported reading it as undefined behaviour when the blocks were uninitialised).
    #[test]
    fn untouched_host_memory_reads_as_zeros_and_is_aligned() {
        let pool =
            gpumem::core::SingleDeviceMemoryPool::<Host, _>::with_allocator(0, UntouchedHostMemory).unwrap();
        let p = pool.malloc(64).unwrap();
        assert_eq!(p.ptr() % HOST_ALIGN, 0);
        let mut back = [0xffu8; 64];
        p.copy_to_host(&mut back, 64).unwrap();
        assert_eq!(back, [0u8; 64]);
        for size in [1, 511, 512, 4097] {
            let block = UntouchedHostMemory.allocate(0, size).unwrap();
            assert_eq!((RawBlock::address(&block) % HOST_ALIGN, RawBlock::size(&block)), (0, size));
        }
    }
}
