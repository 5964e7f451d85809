//! `GPUMEM_PLAN_AUTOMATICALLY` makes each new pool plan its loop with no `step()` calls. A test
//! binary of its own: the environment is process-wide, so nothing else may run beside it.

use gpumem::core::PlanState;
use gpumem::SingleDeviceMemoryPool;

fn state(pool: &SingleDeviceMemoryPool) -> PlanState {
    pool.pool().plan_stats().state
}

#[test]
#[cfg_attr(
    any(feature = "cuda", feature = "hip"),
    ignore = "needs a GPU: run with --include-ignored on a machine that has one"
)]
fn the_environment_variable_makes_each_new_pool_plan_with_no_step_calls() {
    assert_eq!(state(&SingleDeviceMemoryPool::new(0).unwrap()), PlanState::Off, "off by default");
    std::env::set_var("GPUMEM_PLAN_AUTOMATICALLY", "1");
    let pool = SingleDeviceMemoryPool::new(0).unwrap();
    assert_eq!(state(&pool), PlanState::Detecting);
    // A loop of three allocations, with no step call: found, recorded, planned.
    for _ in 0..8 {
        let a = pool.malloc_pooled(3 << 20).unwrap();
        let b = pool.malloc_pooled(1 << 20).unwrap();
        drop(a);
        let c = pool.malloc_pooled(2 << 20).unwrap();
        drop((b, c));
    }
    assert_eq!(state(&pool), PlanState::Planned, "{:?}", pool.pool().plan_stats());
    assert_eq!(pool.pool().plan_stats().period, 3);

    std::env::set_var("GPUMEM_PLAN_AUTOMATICALLY", "off");
    assert_eq!(state(&SingleDeviceMemoryPool::new(0).unwrap()), PlanState::Off);
    std::env::set_var("GPUMEM_PLAN_AUTOMATICALLY", "soon");
    let err = SingleDeviceMemoryPool::new(0).unwrap_err();
    assert!(matches!(err, gpumem::Error::InvalidEnvironment { .. }), "{err:?}");
    assert!(err.to_string().contains("GPUMEM_PLAN_AUTOMATICALLY=\"soon\""), "{err}");
    std::env::remove_var("GPUMEM_PLAN_AUTOMATICALLY");
}
