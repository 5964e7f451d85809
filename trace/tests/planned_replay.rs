//! A loop recorded by gpumem's process-wide [`Recorder`] with `step()` after each iteration reads
//! back with its `step` lines, and replays with the plan as the pool planned it. Its own test
//! binary: the recorder sees every thread of the process.

use gpumem::core::PlanState;
use gpumem::core::SingleDeviceMemoryPool;
use gpumem::host::Host;
use gpumem::{GrowthPolicy, Recorder};
use gpumem_trace::recommend;
use gpumem_trace::replay::{self, ReplayOptions};
use gpumem_trace::{Hook, Timeline, Trace};

#[test]
fn a_recorded_loop_replays_with_the_plan_the_pool_made() {
    let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();
    pool.set_growth_policy(GrowthPolicy::CacheUntilOutOfMemory);
    let recording = Recorder::new(Vec::new()).install();
    let mut grad = None;
    for _ in 0..8 {
        drop(grad.take());
        let a = pool.malloc_pooled(3 << 20).unwrap();
        let tmp = pool.malloc_pooled(5000).unwrap();
        drop(tmp);
        let b = pool.malloc_pooled(1 << 20).unwrap();
        grad = Some(pool.malloc_pooled(2 << 20).unwrap());
        drop((b, a));
        pool.pool().step().unwrap();
    }
    drop(grad);
    let bytes = recording.finish().unwrap();
    let recorded = pool.pool().plan_stats();
    assert_eq!(recorded.state, PlanState::Planned);

    let trace = Trace::parse(std::str::from_utf8(&bytes).unwrap()).unwrap();
    assert_eq!(trace.events.iter().filter(|e| e.kind() == Hook::Step).count(), 8);
    let timeline = Timeline::new(&trace);
    let (steps, marks) = (replay::steps(&timeline), replay::marks(&timeline));
    assert_eq!(marks.len(), 8);
    let options = ReplayOptions { plan: true, ..ReplayOptions::default() };
    let r = replay::replay_marked(&steps, &marks, GrowthPolicy::CacheUntilOutOfMemory, options).unwrap();
    let plan = r.plan.unwrap();
    assert_eq!((plan.served, plan.departed, plan.plans), (recorded.served, recorded.departed, 1));
    assert_eq!(plan.raw_calls, 0, "{plan:?}");
    // Held once settled: the plan's block, as large as the peak in use (6 MiB and the gradient of
    // the iteration before, freed at the start of the next).
    assert_eq!(plan.peak_held, plan.peak_in_use, "{plan:?}");
    assert_eq!((plan.held_at_end, plan.raw_allocs), (plan.peak_held, 0), "the steady loop holds the plan");

    // With no marks: the pool finds the loop's four allocations itself.
    let options = ReplayOptions { plan_automatically: true, ..ReplayOptions::default() };
    let r = replay::replay(&steps, GrowthPolicy::CacheUntilOutOfMemory, options).unwrap();
    let found = r.plan.unwrap();
    assert_eq!((found.period, found.plans), (4, 1), "{found:?}");
    assert!(found.in_force_at.is_some(), "{found:?}");
    assert_eq!(found.raw_calls, 0, "{found:?}");
    assert!(
        found.peak_in_use > 0 && found.peak_held == found.peak_in_use,
        "settled, holding the plan: {found:?}"
    );

    let r = recommend::recommend_marked(&steps, &marks).unwrap();
    assert_eq!(r.candidates.len(), 19, "every set-up, with the plan and without, and stitching unplanned");
    assert!(r.candidates.iter().any(|c| c.planned && c.setup().ends_with(" + planned")));
    let text = r.render();
    assert!(text.contains("cache_until_out_of_memory + planned"), "{text}");
}
