//! The planner on the counting allocator: counted raw calls, every lent range checked against
//! every live one, every byte back at the end.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use proptest::prelude::*;

use super::super::tests::Flag;
use super::super::trace::CountingAllocator;
use super::super::{ArenaCache, ArenaKey, GrowthPolicy, Pool, PooledMemory, UNIT};
use super::{PlanState, PlanStats};

type Chunk = PooledMemory<CountingAllocator>;

/// One event of a loop: allocate `size` bytes as `name` on stream `stream`, or free `name`.
#[derive(Clone, Copy, Debug)]
enum Op {
    Alloc { name: usize, size: usize, stream: usize },
    Free { name: usize },
}

fn alloc(name: usize, size: usize) -> Op {
    Op::Alloc { name, size, stream: 0 }
}

fn free(name: usize) -> Op {
    Op::Free { name }
}

/// A pool on a counting allocator, under `policy`.
fn counted(policy: GrowthPolicy) -> (Pool<CountingAllocator>, CountingAllocator, ArenaCache) {
    let allocator = CountingAllocator::default();
    let pool = Pool::new(0, allocator.clone());
    pool.set_growth_policy(policy);
    (pool, allocator, ArenaCache::new())
}

/// Runs one iteration of `ops`: names live across iterations stay in `live`. Every lent range is
/// checked against every live one.
fn run(pool: &Pool<CountingAllocator>, cache: &ArenaCache, ops: &[Op], live: &mut HashMap<usize, Chunk>) {
    for op in ops {
        match *op {
            Op::Alloc { name, size, stream } => {
                let p = pool.malloc(size, ArenaKey::stream(stream), cache).unwrap();
                assert_disjoint(&p, live);
                assert!(live.insert(name, p).is_none(), "{name} allocated twice");
            }
            Op::Free { name } => drop(live.remove(&name).expect("freed while live")),
        }
    }
}

fn assert_disjoint(p: &Chunk, live: &HashMap<usize, Chunk>) {
    let r = p.ptr()..p.ptr() + p.size();
    for (name, q) in live {
        let s = q.ptr()..q.ptr() + q.size();
        assert!(r.end <= s.start || s.end <= r.start, "{r:x?} overlaps {name}'s {s:x?}");
    }
}

fn raw_calls(allocator: &CountingAllocator) -> usize {
    let (allocs, frees, _, _) = allocator.counts().snapshot();
    allocs + frees
}

/// Runs iterations of `ops` with `step()` after each until the plan is in force and has served
/// one iteration; returns the stats then.
fn plan(
    pool: &Pool<CountingAllocator>,
    cache: &ArenaCache,
    ops: &[Op],
    live: &mut HashMap<usize, Chunk>,
) -> PlanStats {
    for _ in 0..4 {
        run(pool, cache, ops, live);
        pool.step().unwrap();
    }
    let stats = pool.plan_stats();
    assert_eq!(stats.state, PlanState::Planned, "{stats:?}");
    stats
}

/// A small loop: a forward pass that keeps activations, temporaries, a backward pass freeing
/// them in reverse, and a gradient that lives into the next iteration (freed at its start).
fn small_loop() -> Vec<Op> {
    vec![
        free(9),
        alloc(1, 4096),
        alloc(2, 3 * UNIT),
        alloc(3, 8192),
        free(2),
        alloc(4, 8192),
        alloc(5, 1000),
        free(5),
        free(4),
        free(3),
        alloc(9, 2 * UNIT),
        free(1),
    ]
}

/// `small_loop` with no allocation that outlives its iteration.
fn closed_loop() -> Vec<Op> {
    let mut ops = small_loop()[1..10].to_vec();
    ops.push(free(1));
    ops
}

/// `small_loop`'s first iteration: no gradient to free yet.
fn first_of_small_loop() -> Vec<Op> {
    small_loop()[1..].to_vec()
}

#[test]
fn planning_is_off_until_step_is_called() {
    let (pool, _, cache) = counted(GrowthPolicy::CacheUntilOutOfMemory);
    let mut live = HashMap::new();
    run(&pool, &cache, &first_of_small_loop(), &mut live);
    run(&pool, &cache, &small_loop(), &mut live);
    assert_eq!(pool.plan_stats(), PlanStats::default());
}

#[test]
fn a_planned_loop_makes_no_raw_call_over_ten_iterations() {
    for policy in [GrowthPolicy::CacheUntilOutOfMemory, GrowthPolicy::Segments, GrowthPolicy::HoldPeakInUse] {
        let (pool, allocator, cache) = counted(policy);
        let mut live = HashMap::new();
        pool.step().unwrap();
        run(&pool, &cache, &first_of_small_loop(), &mut live);
        pool.step().unwrap();
        let before = plan(&pool, &cache, &small_loop(), &mut live);
        let calls = raw_calls(&allocator);
        for i in 0..10 {
            run(&pool, &cache, &small_loop(), &mut live);
            pool.step().unwrap();
            assert_eq!(raw_calls(&allocator), calls, "{policy:?}: iteration {i} after planning");
        }
        let after = pool.plan_stats();
        assert_eq!(after.served - before.served, 10 * 6, "{policy:?}: every allocation planned");
        assert_eq!((after.departed, after.plans), (0, 1), "{policy:?}");
        // Held: the plan's block and nothing else, once the gradient of the last iteration is freed.
        assert_eq!(pool.total_bytes(), after.plan_bytes, "{policy:?}");
        assert_eq!(after.plan_bytes, after.planned_peak, "{policy:?}: the small loop places perfectly");
        drop(live);
        pool.free_all_blocks(None);
        assert_eq!(allocator.counts().held.load(Ordering::Relaxed), 0, "{policy:?}: every byte came back");
        assert_eq!(pool.total_bytes(), 0);
    }
}

#[test]
fn a_block_the_program_leaves_free_while_the_loop_follows_its_plan_is_given_back() {
    let (pool, allocator, cache) = counted(GrowthPolicy::CacheUntilOutOfMemory);
    let mut live = HashMap::new();
    // A tensor made before the loop, in an ordinary block of its own, freed once the plan has
    // served iterations with no departure.
    run(&pool, &cache, &[alloc(100, 1 << 20)], &mut live);
    pool.step().unwrap();
    run(&pool, &cache, &first_of_small_loop(), &mut live);
    pool.step().unwrap();
    plan(&pool, &cache, &small_loop(), &mut live);
    let held = pool.total_bytes();
    drop(live.remove(&100));
    let calls = raw_calls(&allocator);
    run(&pool, &cache, &small_loop(), &mut live);
    pool.step().unwrap();
    assert_eq!(pool.total_bytes(), held, "free at one iteration's end: the loop may lend it again");
    run(&pool, &cache, &small_loop(), &mut live);
    pool.step().unwrap();
    assert_eq!(pool.total_bytes(), held - (1 << 20), "left free a whole iteration, its block is given back");
    assert_eq!(raw_calls(&allocator), calls + 1, "with one raw free");
    for _ in 0..5 {
        run(&pool, &cache, &small_loop(), &mut live);
        pool.step().unwrap();
    }
    assert_eq!(raw_calls(&allocator), calls + 1, "and no raw call after it");
    assert_eq!(pool.plan_stats().departed, 0);
}

#[test]
fn statistics_count_planned_chunks_as_any_chunk() {
    let (pool, allocator, cache) = counted(GrowthPolicy::CacheUntilOutOfMemory);
    let mut live = HashMap::new();
    pool.step().unwrap();
    plan(&pool, &cache, &closed_loop(), &mut live);
    run(&pool, &cache, &closed_loop()[..2], &mut live);
    let s = pool.stats().all;
    assert_eq!(s.allocated_bytes.current as usize, pool.used_bytes());
    assert_eq!(s.allocated_bytes.current, 4096 + 3 * UNIT as u64);
    assert_eq!(s.reserved_bytes.current as usize, pool.total_bytes());
    assert_eq!(s.segments.allocated - s.segments.freed, s.segments.current);
    let (allocs, frees, held, _) = allocator.counts().snapshot();
    assert_eq!((s.segments.allocated, s.segments.freed), (allocs as u64, frees as u64));
    assert_eq!(s.reserved_bytes.current as usize, held);
    drop(live);
    pool.free_all_blocks(None);
    let s = pool.stats().all;
    assert_eq!((s.allocated_bytes.current, s.reserved_bytes.current, s.allocations.current), (0, 0, 0));
}

#[test]
fn departing_allocations_fall_back_to_the_pool_and_are_freed() {
    let (pool, allocator, cache) = counted(GrowthPolicy::CacheUntilOutOfMemory);
    let mut live = HashMap::new();
    pool.step().unwrap();
    run(&pool, &cache, &first_of_small_loop(), &mut live);
    pool.step().unwrap();
    let base = plan(&pool, &cache, &small_loop(), &mut live);
    // A new size (1 for 4096 bytes), an extra allocation (20), and a longer lifetime (3 is kept
    // past the point where 9's planned range needs its bytes).
    let mut departing = small_loop();
    departing[1] = alloc(1, 6 * UNIT);
    departing.insert(3, alloc(20, 2048));
    departing.retain(|op| !matches!(op, Op::Free { name: 3 }));
    departing.push(free(3));
    departing.push(free(20));
    run(&pool, &cache, &departing, &mut live);
    let stats = pool.plan_stats();
    assert!(stats.departed >= 3, "{stats:?}");
    assert_eq!(stats.state, PlanState::Planned, "one departing iteration keeps the plan");
    pool.step().unwrap();
    // Back to the loop: served from the plan again.
    run(&pool, &cache, &small_loop(), &mut live);
    pool.step().unwrap();
    let again = pool.plan_stats();
    assert_eq!(again.served - stats.served, 6);
    assert_eq!(again.plans, base.plans);
    drop(live);
    pool.free_all_blocks(None);
    assert_eq!(allocator.counts().held.load(Ordering::Relaxed), 0, "every byte came back");
}

#[test]
fn a_changed_loop_is_planned_again() {
    let (pool, allocator, cache) = counted(GrowthPolicy::CacheUntilOutOfMemory);
    let mut live = HashMap::new();
    pool.step().unwrap();
    plan(&pool, &cache, &closed_loop(), &mut live);
    let other = [alloc(30, 16384), alloc(31, 512), free(30), alloc(32, 2048), free(32), free(31)];
    for _ in 0..6 {
        run(&pool, &cache, &other, &mut live);
        pool.step().unwrap();
    }
    let stats = pool.plan_stats();
    assert_eq!((stats.state, stats.plans), (PlanState::Planned, 2), "{stats:?}");
    assert_eq!(stats.plan_bytes, 16384 + 512);
    let calls = raw_calls(&allocator);
    let served = stats.served;
    for _ in 0..3 {
        run(&pool, &cache, &other, &mut live);
        pool.step().unwrap();
    }
    assert_eq!(raw_calls(&allocator), calls);
    assert_eq!(pool.plan_stats().served - served, 9);
    // The first plan's block became an ordinary block, released when it was all free.
    drop(live);
    pool.free_all_blocks(None);
    assert_eq!(allocator.counts().held.load(Ordering::Relaxed), 0);
}

#[test]
fn resetting_drops_the_plan_once_its_chunks_are_back() {
    let (pool, allocator, cache) = counted(GrowthPolicy::CacheUntilOutOfMemory);
    let mut live = HashMap::new();
    pool.step().unwrap();
    run(&pool, &cache, &first_of_small_loop(), &mut live);
    pool.step().unwrap();
    let stats = plan(&pool, &cache, &small_loop(), &mut live);
    // Mid-iteration: planned chunks are live.
    run(&pool, &cache, &small_loop()[..4], &mut live);
    pool.reset_planning();
    assert_eq!(pool.plan_stats().state, PlanState::Off);
    assert_eq!(pool.total_bytes(), stats.plan_bytes, "a block with live chunks stays");
    // The former plan block serves ordinary requests now.
    let calls = raw_calls(&allocator);
    run(&pool, &cache, &small_loop()[4..], &mut live);
    assert_eq!(raw_calls(&allocator), calls);
    drop(live);
    pool.free_all_blocks(None);
    assert_eq!(allocator.counts().held.load(Ordering::Relaxed), 0);
}

#[test]
fn a_released_plan_block_is_allocated_again_at_the_next_step() {
    let (pool, allocator, cache) = counted(GrowthPolicy::CacheUntilOutOfMemory);
    let mut live = HashMap::new();
    pool.step().unwrap();
    let ops = &closed_loop();
    let stats = plan(&pool, &cache, ops, &mut live);
    pool.free_all_blocks(None);
    assert_eq!(allocator.counts().held.load(Ordering::Relaxed), 0, "the plan block was all free");
    pool.step().unwrap();
    assert_eq!(pool.total_bytes(), stats.plan_bytes);
    run(&pool, &cache, ops, &mut live);
    pool.step().unwrap();
    let now = pool.plan_stats();
    assert_eq!((now.served - stats.served, now.departed), (5, 0));
}

#[test]
fn a_planned_range_behind_a_fence_is_lent_again_only_once_the_fence_completes() {
    let (pool, _, cache) = counted(GrowthPolicy::CacheUntilOutOfMemory);
    let ops = [alloc(1, 4096), free(1)];
    let mut live = HashMap::new();
    pool.step().unwrap();
    let stats = plan(&pool, &cache, &ops, &mut live);
    let done = Arc::new(AtomicBool::new(false));
    let a = pool.malloc(4096, ArenaKey::NULL, &cache).unwrap();
    let planned_at = a.ptr();
    a.free_after(Box::new(Flag(Arc::clone(&done)))).unwrap();
    pool.step().unwrap();
    let b = pool.malloc(4096, ArenaKey::NULL, &cache).unwrap();
    assert_ne!(b.ptr(), planned_at, "the range is still behind its fence");
    assert_eq!(pool.plan_stats().departed, stats.departed + 1);
    drop(b);
    pool.step().unwrap();
    done.store(true, Ordering::Release);
    let c = pool.malloc(4096, ArenaKey::NULL, &cache).unwrap();
    assert_eq!(c.ptr(), planned_at, "served from the plan once the fence completed");
}

#[test]
fn each_stream_gets_a_plan_block_of_its_own() {
    let (pool, allocator, cache) = counted(GrowthPolicy::CacheUntilOutOfMemory);
    let ops = [
        Op::Alloc { name: 1, size: 4096, stream: 0 },
        Op::Alloc { name: 2, size: 2048, stream: 7 },
        free(1),
        Op::Alloc { name: 3, size: 1024, stream: 0 },
        free(2),
        free(3),
    ];
    let mut live = HashMap::new();
    pool.step().unwrap();
    let stats = plan(&pool, &cache, &ops, &mut live);
    assert_eq!(stats.plan_bytes, 4096 + 2048);
    let calls = raw_calls(&allocator);
    for _ in 0..3 {
        run(&pool, &cache, &ops, &mut live);
        pool.step().unwrap();
    }
    assert_eq!(raw_calls(&allocator), calls);
    assert_eq!(pool.plan_stats().departed, 0);
}

/// A training-like loop: parameters made before it, optimizer state made in its first
/// iteration and kept, activations kept through the forward pass and freed in the backward one,
/// gradients made in the backward pass and freed at the next iteration's start.
fn training_iteration(layers: usize, first: bool) -> Vec<Op> {
    let width = [24 * UNIT, 40 * UNIT, 8 * UNIT, 64 * UNIT];
    let mut ops = Vec::new();
    if !first {
        ops.extend((0..layers).map(|l| free(300 + l)));
    }
    for l in 0..layers {
        ops.push(alloc(100 + l, width[l % 4] * 2));
        ops.push(alloc(200, 3 * UNIT + 100));
        ops.push(free(200));
    }
    for l in (0..layers).rev() {
        ops.push(alloc(300 + l, width[l % 4]));
        ops.push(alloc(201, width[(l + 1) % 4] + 17));
        ops.push(free(100 + l));
        ops.push(free(201));
    }
    if first {
        ops.extend((0..layers).map(|l| alloc(400 + l, width[l % 4])));
    }
    for l in 0..layers {
        ops.push(alloc(202, width[l % 4]));
        ops.push(free(202));
    }
    ops
}

#[test]
fn a_loop_with_gradients_across_iterations_holds_the_plan_and_its_long_lived_tensors() {
    let layers = 6;
    let (pool, allocator, cache) = counted(GrowthPolicy::CacheUntilOutOfMemory);
    let mut live = HashMap::new();
    for l in 0..layers {
        live.insert(500 + l, pool.malloc(16 * UNIT, ArenaKey::NULL, &cache).unwrap());
    }
    pool.step().unwrap();
    run(&pool, &cache, &training_iteration(layers, true), &mut live);
    pool.step().unwrap();
    let stats = plan(&pool, &cache, &training_iteration(layers, false), &mut live);
    let calls = raw_calls(&allocator);
    // The parameters and the optimizer's state, made while recording: blocks of their own.
    let long_lived = layers * 16 * UNIT + [24, 40, 8, 64, 24, 40].iter().sum::<usize>() * UNIT;
    let (mut held, mut in_use) = (0, 0);
    for _ in 0..3 {
        for op in training_iteration(layers, false) {
            run(&pool, &cache, &[op], &mut live);
            held = held.max(pool.total_bytes());
            in_use = in_use.max(pool.used_bytes());
        }
        pool.step().unwrap();
    }
    assert_eq!(raw_calls(&allocator), calls);
    assert_eq!(held, stats.plan_bytes + long_lived, "the recorded iterations' blocks were all released");
    assert_eq!(in_use, stats.planned_peak + long_lived);
    // The greedy placement is 3.3 % over the most live at once on this loop (464 units where 449
    // are live at once): its gradients, made in the backward pass and freed in the next
    // iteration, are what it places worst. (On `trace::training`'s loop it places exactly.)
    assert!(stats.plan_bytes as f64 <= stats.planned_peak as f64 * 1.034, "{stats:?}");
}

/// A random loop: `n` allocations of random sizes, each freed after a random number of events
/// (some in the next iteration).
fn random_loop(sizes: &[usize], lives: &[usize]) -> (Vec<Op>, Vec<Op>) {
    let n = sizes.len();
    let mut events: Vec<(usize, Op)> = Vec::new();
    let mut carried = Vec::new();
    for i in 0..n {
        events.push((2 * i, alloc(i, sizes[i])));
        let end = 2 * i + 1 + lives[i] % (2 * n);
        if end < 2 * n {
            events.push((end, free(i)));
        } else {
            carried.push(i);
        }
    }
    events.sort_by_key(|e| e.0);
    let body: Vec<Op> = events.into_iter().map(|e| e.1).collect();
    let first = body.clone();
    let mut steady: Vec<Op> = carried.iter().map(|&i| free(i)).collect();
    steady.extend(body);
    (first, steady)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: if cfg!(miri) { 4 } else { 64 }, ..ProptestConfig::default() })]

    #[test]
    fn random_loops_are_served_from_disjoint_ranges_and_give_every_byte_back(
        sizes in proptest::collection::vec(1usize..20_000, 1..12),
        lives in proptest::collection::vec(0usize..64, 12),
    ) {
        let (first, steady) = random_loop(&sizes, &lives);
        let (pool, allocator, cache) = counted(GrowthPolicy::CacheUntilOutOfMemory);
        let mut live = HashMap::new();
        pool.step().unwrap();
        run(&pool, &cache, &first, &mut live);
        pool.step().unwrap();
        let stats = plan(&pool, &cache, &steady, &mut live);
        let calls = raw_calls(&allocator);
        for _ in 0..3 {
            run(&pool, &cache, &steady, &mut live);
            pool.step().unwrap();
        }
        prop_assert_eq!(raw_calls(&allocator), calls);
        let now = pool.plan_stats();
        prop_assert_eq!(now.departed, stats.departed);
        prop_assert_eq!(now.served - stats.served, 3 * sizes.len() as u64);
        drop(live);
        pool.free_all_blocks(None);
        prop_assert_eq!(allocator.counts().held.load(Ordering::Relaxed), 0);
    }
}

/// Each step of `trace::training`, as the trace's steps.
fn training_steps(
    layers: usize,
    hidden: usize,
    tokens: usize,
    steps: usize,
) -> Vec<Vec<super::super::trace::Step>> {
    use super::super::trace;
    let all = trace::training(layers, hidden, tokens, steps);
    let params = trace::training(layers, hidden, tokens, 0).len();
    let mut bounds = vec![0, params];
    bounds.extend((1..=steps).map(|k| trace::training(layers, hidden, tokens, k).len()));
    bounds.windows(2).map(|w| all[w[0]..w[1]].to_vec()).collect()
}

#[test]
#[cfg_attr(miri, ignore = "replays a thousand trace steps: too slow under Miri")]
fn the_synthetic_training_trace_holds_within_two_percent_once_planned() {
    use super::super::trace::Step;
    let steps = training_steps(2, 64, 64, 10);
    let (pool, allocator, cache) = counted(GrowthPolicy::CacheUntilOutOfMemory);
    let mut live: HashMap<u64, Chunk> = HashMap::new();
    let (mut held, mut in_use, mut calls) = (0, 0, 0);
    for (k, step) in steps.iter().enumerate() {
        if k == 6 {
            calls = raw_calls(&allocator);
            assert_eq!(pool.plan_stats().state, PlanState::Planned);
        }
        for s in step {
            match *s {
                Step::Alloc { id, size, .. } => {
                    live.insert(id, pool.malloc(size, ArenaKey::NULL, &cache).unwrap());
                    if k >= 6 {
                        held = held.max(pool.total_bytes());
                        in_use = in_use.max(pool.used_bytes());
                    }
                }
                Step::Free { id } => drop(live.remove(&id)),
            }
        }
        pool.step().unwrap();
    }
    assert_eq!(raw_calls(&allocator), calls);
    let ratio = held as f64 / in_use as f64;
    assert!(ratio <= 1.02, "held {held} over in use {in_use}: {ratio}; {:?}", pool.plan_stats());
}

/// Counts the malloc and free hook calls of the thread it is installed on.
#[derive(Default)]
struct Counter(std::cell::Cell<(usize, usize)>);

impl crate::hooks::MemoryHook for Counter {
    fn name(&self) -> &str {
        "counter"
    }
    fn malloc_postprocess(&self, _: &crate::hooks::MallocEvent) -> crate::hooks::HookResult {
        let (m, f) = self.0.get();
        self.0.set((m + 1, f));
        Ok(())
    }
    fn free_postprocess(&self, _: &crate::hooks::FreeEvent) -> crate::hooks::HookResult {
        let (m, f) = self.0.get();
        self.0.set((m, f + 1));
        Ok(())
    }
}

#[test]
fn with_a_hook_installed_planned_allocations_are_served_between_the_hooks() {
    let (pool, allocator, cache) = counted(GrowthPolicy::CacheUntilOutOfMemory);
    let hook = crate::hooks::install(Counter::default()).unwrap();
    let mut live = HashMap::new();
    pool.step().unwrap();
    let stats = plan(&pool, &cache, &closed_loop(), &mut live);
    let calls = raw_calls(&allocator);
    let before = hook.0.get();
    run(&pool, &cache, &closed_loop(), &mut live);
    pool.step().unwrap();
    assert_eq!(hook.0.get(), (before.0 + 5, before.1 + 5), "every allocation and free seen");
    assert_eq!(pool.plan_stats().served - stats.served, 5);
    assert_eq!(raw_calls(&allocator), calls);
}

#[test]
fn a_plan_without_room_under_the_limit_waits_and_the_loop_runs_on() {
    let (pool, allocator, cache) = counted(GrowthPolicy::CacheUntilOutOfMemory);
    // The loop's peak in use is 21504 bytes; with the gradient of the iteration before still
    // live in the pool's own block at the step that would put the plan in force, the plan's
    // block does not fit beside it.
    pool.set_limit(22_000);
    let mut live = HashMap::new();
    pool.step().unwrap();
    run(&pool, &cache, &first_of_small_loop(), &mut live);
    pool.step().unwrap();
    for _ in 0..6 {
        run(&pool, &cache, &small_loop(), &mut live);
        pool.step().unwrap();
        assert!(pool.total_bytes() <= 22_000);
    }
    let stats = pool.plan_stats();
    assert_eq!((stats.state, stats.plans, stats.served), (PlanState::Recording, 0, 0), "{stats:?}");
    drop(live);
    pool.free_all_blocks(None);
    assert_eq!(allocator.counts().held.load(Ordering::Relaxed), 0);
}

/// Runs iterations of `ops` with no `step()` until the plan the pool found is in force (at most
/// `at_most` of them); returns how many ran.
fn run_until_planned(
    pool: &Pool<CountingAllocator>,
    cache: &ArenaCache,
    ops: &[Op],
    live: &mut HashMap<usize, Chunk>,
    at_most: usize,
) -> usize {
    for n in 1..=at_most {
        run(pool, cache, ops, live);
        if pool.plan_stats().state == PlanState::Planned {
            return n;
        }
    }
    panic!("no plan after {at_most} iterations: {:?}", pool.plan_stats());
}

fn allocations(ops: &[Op]) -> usize {
    ops.iter().filter(|op| matches!(op, Op::Alloc { .. })).count()
}

#[test]
fn a_loop_nobody_marks_is_found_planned_and_served_with_no_raw_call() {
    let layers = 6;
    let (pool, allocator, cache) = counted(GrowthPolicy::CacheUntilOutOfMemory);
    pool.plan_automatically();
    assert_eq!(pool.plan_stats().state, PlanState::Detecting);
    let mut live = HashMap::new();
    for l in 0..layers {
        live.insert(500 + l, pool.malloc(16 * UNIT, ArenaKey::NULL, &cache).unwrap());
    }
    run(&pool, &cache, &training_iteration(layers, true), &mut live);
    let steady = training_iteration(layers, false);
    // Found after two steady iterations, recorded over two more, planned at the end of those.
    assert!(run_until_planned(&pool, &cache, &steady, &mut live, 6) <= 5);
    let stats = pool.plan_stats();
    assert_eq!(stats.period, allocations(&steady), "{stats:?}");
    assert_eq!(stats.periods_found, 1);
    run(&pool, &cache, &steady, &mut live);
    let (calls, served) = (raw_calls(&allocator), pool.plan_stats().served);
    for _ in 0..10 {
        run(&pool, &cache, &steady, &mut live);
    }
    assert_eq!(raw_calls(&allocator), calls, "no raw call once planned");
    let now = pool.plan_stats();
    assert_eq!(now.served - served, 10 * stats.period as u64, "{now:?}");
    assert_eq!(now.departed, stats.departed);
    drop(live);
    pool.free_all_blocks(None);
    pool.reset_planning();
    pool.free_all_blocks(None);
    assert_eq!(allocator.counts().held.load(Ordering::Relaxed), 0, "every byte back");
}

#[test]
fn a_run_of_one_size_inside_the_loop_is_given_up_for_the_loop() {
    // Sixteen temporaries of one size made and freed in turn: periods 1 to 8 hold over the run,
    // and fail once the loop goes on.
    let mut ops = small_loop();
    for _ in 0..16 {
        ops.push(alloc(20, 5 * UNIT));
        ops.push(free(20));
    }
    let (pool, allocator, cache) = counted(GrowthPolicy::CacheUntilOutOfMemory);
    pool.plan_automatically();
    let mut live = HashMap::new();
    run(&pool, &cache, &first_of_small_loop(), &mut live);
    run_until_planned(&pool, &cache, &ops, &mut live, 40);
    // Not planned on a short period: the plan departs, and the loop's period is found.
    let mut n = 0;
    while pool.plan_stats().period % allocations(&ops) != 0 {
        run_until_planned(&pool, &cache, &ops, &mut live, 40);
        n += 1;
        assert!(n < 10, "{:?}", pool.plan_stats());
    }
    let stats = pool.plan_stats();
    assert!(stats.periods_found > 1, "{stats:?}");
    run(&pool, &cache, &ops, &mut live);
    let calls = raw_calls(&allocator);
    for _ in 0..10 {
        run(&pool, &cache, &ops, &mut live);
    }
    assert_eq!(raw_calls(&allocator), calls);
    assert_eq!(pool.plan_stats().state, PlanState::Planned);
}

#[test]
fn a_loop_that_changes_is_found_again() {
    let (pool, allocator, cache) = counted(GrowthPolicy::CacheUntilOutOfMemory);
    pool.plan_automatically();
    let mut live = HashMap::new();
    run_until_planned(&pool, &cache, &closed_loop(), &mut live, 8);
    for _ in 0..PROVEN {
        run(&pool, &cache, &closed_loop(), &mut live);
    }
    // Another loop: its allocations depart, the plan goes, and the new period is found.
    let other: Vec<Op> =
        vec![alloc(30, 7 * UNIT), alloc(31, 2 * UNIT), free(30), alloc(32, 9 * UNIT), free(32), free(31)];
    let mut n = 0;
    while !(pool.plan_stats().state == PlanState::Planned && pool.plan_stats().period == 3) {
        run(&pool, &cache, &other, &mut live);
        n += 1;
        assert!(n <= 12, "{:?}", pool.plan_stats());
    }
    run(&pool, &cache, &other, &mut live);
    let calls = raw_calls(&allocator);
    for _ in 0..5 {
        run(&pool, &cache, &other, &mut live);
    }
    assert_eq!(raw_calls(&allocator), calls);
}

/// Iterations a plan serves before a departure counts as a changed loop (`state::PROVEN_AFTER`).
const PROVEN: u32 = super::state::PROVEN_AFTER;

#[test]
fn step_replaces_the_boundaries_found_and_reset_ends_both() {
    let (pool, _, cache) = counted(GrowthPolicy::CacheUntilOutOfMemory);
    pool.plan_automatically();
    let mut live = HashMap::new();
    run_until_planned(&pool, &cache, &closed_loop(), &mut live, 8);
    pool.step().unwrap();
    assert_eq!(pool.plan_stats().period, 0, "the caller's steps now");
    plan(&pool, &cache, &closed_loop(), &mut live);
    pool.plan_automatically();
    assert_eq!(pool.plan_stats().state, PlanState::Detecting);
    pool.reset_planning();
    assert_eq!(pool.plan_stats().state, PlanState::Off);
    run(&pool, &cache, &closed_loop(), &mut live);
    assert_eq!(pool.plan_stats().state, PlanState::Off);
}

#[test]
#[cfg_attr(miri, ignore = "replays a thousand trace steps: too slow under Miri")]
fn the_synthetic_training_trace_with_no_steps_holds_within_two_percent_once_planned() {
    use super::super::trace::Step;
    let steps = training_steps(2, 64, 64, 12);
    let (pool, allocator, cache) = counted(GrowthPolicy::CacheUntilOutOfMemory);
    pool.plan_automatically();
    let mut live: HashMap<u64, Chunk> = HashMap::new();
    let (mut held, mut in_use, mut calls, mut planned) = (0, 0, None, 0);
    for step in &steps {
        // Measured from the second trace step after the plan is in force: the first ends with
        // the release of the recorded iterations' blocks.
        if pool.plan_stats().state == PlanState::Planned {
            planned += 1;
        }
        if planned == 2 && calls.is_none() {
            calls = Some(raw_calls(&allocator));
        }
        for s in step {
            match *s {
                Step::Alloc { id, size, .. } => {
                    live.insert(id, pool.malloc(size, ArenaKey::NULL, &cache).unwrap());
                    if calls.is_some() {
                        held = held.max(pool.total_bytes());
                        in_use = in_use.max(pool.used_bytes());
                    }
                }
                Step::Free { id } => drop(live.remove(&id)),
            }
        }
    }
    let stats = pool.plan_stats();
    assert_eq!(Some(raw_calls(&allocator)), calls, "{stats:?}");
    let per_step = steps.last().map_or(0, |s| s.iter().filter(|s| matches!(s, Step::Alloc { .. })).count());
    assert_eq!(stats.period % per_step, 0, "{stats:?}");
    let ratio = held as f64 / in_use as f64;
    assert!(ratio <= 1.02, "held {held} over in use {in_use}: {ratio}; {stats:?}");
}

/// A network of `layers` identical layers: the forward pass keeps each layer's activation; the
/// backward pass makes each layer's gradient and a large temporary and frees its activation, so
/// that each backward layer ends where it began (a period of the body, not of the loop); the
/// gradients are freed at the end.
fn layered_iteration(layers: usize) -> Vec<Op> {
    let mut ops = Vec::new();
    for l in 0..layers {
        ops.push(alloc(100 + l, 4 * UNIT));
        ops.push(alloc(200, 2 * UNIT));
        ops.push(free(200));
    }
    ops.push(alloc(300, 3 * UNIT + 7));
    for l in (0..layers).rev() {
        ops.push(alloc(400 + l, 4 * UNIT));
        ops.push(alloc(201, 64 * UNIT));
        ops.push(free(201));
        ops.push(free(100 + l));
    }
    ops.push(free(300));
    ops.extend((0..layers).map(|l| free(400 + l)));
    ops
}

#[test]
fn a_period_of_the_layers_is_given_up_for_the_loop_and_not_found_again() {
    let layers = 12;
    let ops = layered_iteration(layers);
    let (pool, allocator, cache) = counted(GrowthPolicy::CacheUntilOutOfMemory);
    pool.plan_automatically();
    let mut live = HashMap::new();
    let mut n = 0;
    while !(pool.plan_stats().state == PlanState::Planned && pool.plan_stats().period == allocations(&ops)) {
        run(&pool, &cache, &ops, &mut live);
        n += 1;
        assert!(n <= 12, "{:?}", pool.plan_stats());
    }
    let found = pool.plan_stats().periods_found;
    assert!(found > 1, "the backward layers' period came first: {:?}", pool.plan_stats());
    run(&pool, &cache, &ops, &mut live);
    let calls = raw_calls(&allocator);
    for _ in 0..20 {
        run(&pool, &cache, &ops, &mut live);
    }
    let stats = pool.plan_stats();
    assert_eq!(raw_calls(&allocator), calls, "{stats:?}");
    assert_eq!(stats.periods_found, found, "the layers' period is not proposed again: {stats:?}");
}

#[test]
fn what_departs_from_a_plan_of_the_layers_gets_a_block_of_its_own() {
    // The optimizer's state is made at the end of the first iteration, while the plan of the
    // backward layers' period is in force: it departs from that plan and outlives the loop. Served
    // by the pool's size classes it would share blocks with the loop's temporaries; as a recorded
    // allocation it gets blocks of its own, and once the loop's plan settles the pool holds the
    // plan's block and the long-lived tensors only.
    let layers = 12;
    let steady = layered_iteration(layers);
    let mut first = steady.clone();
    first.extend((0..layers).map(|l| alloc(600 + l, (3 + l % 3) * UNIT)));
    let long_lived: usize = (0..layers).map(|l| (3 + l % 3) * UNIT).sum();
    let (pool, _, cache) = counted(GrowthPolicy::Segments);
    pool.plan_automatically();
    let mut live = HashMap::new();
    run(&pool, &cache, &first, &mut live);
    let mut n = 0;
    while !(pool.plan_stats().state == PlanState::Planned && pool.plan_stats().period == allocations(&steady))
    {
        run(&pool, &cache, &steady, &mut live);
        n += 1;
        assert!(n <= 12, "{:?}", pool.plan_stats());
    }
    // One iteration to settle (the recorded iterations' blocks go), then the steady loop.
    run(&pool, &cache, &steady, &mut live);
    let mut held = 0;
    for op in steady.iter().chain(&steady) {
        run(&pool, &cache, std::slice::from_ref(op), &mut live);
        held = held.max(pool.total_bytes());
    }
    let stats = pool.plan_stats();
    assert_eq!(held, stats.plan_bytes + long_lived, "{stats:?}");
}

/// A loop of small tensors (512 KiB, served from the pool's shared blocks while recording): 32
/// made and freed each iteration, and in the first iteration one kept of every eight (state made
/// once and kept, as an optimizer's).
fn small_tensor_iteration(first: bool) -> Vec<Op> {
    let mut ops = Vec::new();
    for i in 0..32 {
        ops.push(alloc(i, 1024 * UNIT));
        if first && i % 8 == 0 {
            ops.push(alloc(100 + i, 1024 * UNIT));
        }
    }
    ops.extend((0..32).map(free));
    ops
}

/// [`small_tensor_iteration`]'s loop under `Segments` with growing blocks of 2 MiB pages,
/// stitching or not: the most held over three planned iterations, and the raw calls in them.
fn planned_small_tensor_loop_held(allocator: CountingAllocator) -> (usize, usize) {
    let pool = Pool::new(0, allocator.clone());
    pool.set_growth_policy(GrowthPolicy::Segments);
    pool.set_expandable_segments(true).unwrap();
    let cache = ArenaCache::new();
    let mut live = HashMap::new();
    pool.step().unwrap();
    run(&pool, &cache, &small_tensor_iteration(true), &mut live);
    pool.step().unwrap();
    plan(&pool, &cache, &small_tensor_iteration(false), &mut live);
    let calls = raw_calls(&allocator);
    let mut held = 0;
    for _ in 0..3 {
        for op in small_tensor_iteration(false) {
            run(&pool, &cache, &[op], &mut live);
            held = held.max(pool.total_bytes());
        }
        pool.step().unwrap();
    }
    let planned_calls = raw_calls(&allocator) - calls;
    drop(live);
    pool.free_all_blocks(None);
    assert_eq!(pool.total_bytes(), 0, "every byte back");
    (held, planned_calls)
}

#[test]
fn with_stitching_a_plan_in_force_gives_back_the_pages_under_the_recorded_iterations_holes() {
    const GRANULE: usize = 2 << 20;
    let (growing, growing_calls) = planned_small_tensor_loop_held(CountingAllocator::expandable(GRANULE));
    let (stitched, stitched_calls) = planned_small_tensor_loop_held(CountingAllocator::stitching(GRANULE));
    assert_eq!((growing_calls, stitched_calls), (0, 0), "no raw call once planned");
    // The kept tensors, made while recording, share a growing block with the recorded
    // iterations' temporaries; a growing block gives back only its free tail, stitching the whole
    // pages under every free chunk too: the kept tensors lie 4.5 MiB apart, so each gap after
    // one holds at least one whole page.
    assert!(growing - stitched >= 3 * GRANULE, "stitching {stitched} against growing blocks alone {growing}");
}

/// One iteration of a loop whose result outlives it, as a training loop's loss does: the next
/// iteration makes its own before the last one's is freed. `parity` names the two results.
fn iteration_with_a_result(parity: usize, first: bool) -> Vec<Op> {
    let mut ops = vec![alloc(0, 64 * UNIT), alloc(1, 8 * UNIT), alloc(10 + parity, 1)];
    if !first {
        ops.push(free(11 - parity));
    }
    ops.extend([free(1), alloc(2, 32 * UNIT), free(2), free(0)]);
    ops
}

#[test]
fn a_result_that_outlives_its_iteration_reuses_its_block_once_the_loop_is_planned() {
    let (pool, allocator, cache) = counted(GrowthPolicy::Segments);
    pool.plan_automatically();
    let mut live = HashMap::new();
    run(&pool, &cache, &iteration_with_a_result(0, true), &mut live);
    let mut parity = 1;
    let mut iteration = |live: &mut HashMap<usize, Chunk>| {
        run(&pool, &cache, &iteration_with_a_result(parity, false), live);
        parity = 1 - parity;
    };
    let mut n = 0;
    while pool.plan_stats().state != PlanState::Planned {
        iteration(&mut live);
        n += 1;
        assert!(n < 64, "no plan: {:?}", pool.plan_stats());
    }
    for _ in 0..4 {
        iteration(&mut live);
    }
    let calls = raw_calls(&allocator);
    for _ in 0..10 {
        iteration(&mut live);
    }
    assert_eq!(pool.plan_stats().state, PlanState::Planned);
    // The result is not planned (its next one is made while it lives): the pool serves it, and
    // the block the last one left free at the boundary is lent again, not given back and asked
    // for anew each iteration.
    assert_eq!(raw_calls(&allocator), calls, "no raw call over ten planned iterations");
    drop(live);
    pool.free_all_blocks(None);
    assert_eq!(pool.total_bytes(), 0);
}
