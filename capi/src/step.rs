//! The plan learned from the loop, behind the C ABI: a training or serving loop marks each
//! iteration's end with [`gpumem_step`], and once two iterations in a row made the same
//! allocations in the same order, the device's pool serves the next ones from one planned block,
//! with no driver call (`gpumem::core::pool::Pool::step`).

use std::ffi::c_int;

use gpumem::core::pool::PlanState;

use crate::ffi::call;
use crate::pool;

/// Marks the end of an iteration of the loop that allocates on `device` (a training step, a
/// served batch). The first call turns planning on for that device's pool; a program that never
/// calls it sees no change. Allocations that depart from the plan (a new size, another order, a
/// tensor that lives longer) are served by the pool as without a plan, with no error.
///
/// Returns 0, or -1 with the last error set (unknown device, or the device failed while the
/// plan's block was allocated; running out of memory for it is not a failure: the plan waits).
/// Thread-safe; call it from the thread that runs the loop, between iterations.
#[no_mangle]
pub extern "C" fn gpumem_step(device: c_int) -> c_int {
    call("gpumem_step", -1, || {
        pool::device_pool(device)?.pool().step()?;
        Ok(0)
    })
}

/// Plans the loop on `device` with no [`gpumem_step`] calls: the pool watches its allocations for
/// the loop's period and marks the iterations itself (`Pool::plan_automatically`), then plans as
/// `gpumem_step` would. For programs that cannot mark their iterations; a later `gpumem_step`
/// turns the watching off (the caller's marks replace it). Drops a plan in force first.
/// `GPUMEM_PLAN_AUTOMATICALLY=1` does the same for every device's pool when it is made.
///
/// Returns 0, or -1 with the last error set (unknown device). Thread-safe.
#[no_mangle]
pub extern "C" fn gpumem_plan_automatically(device: c_int) -> c_int {
    call("gpumem_plan_automatically", -1, || {
        pool::device_pool(device)?.pool().plan_automatically();
        Ok(0)
    })
}

/// Stops planning on `device` and drops its plan; its block becomes ordinary cached memory of the
/// pool. [`gpumem_step`] starts planning again.
///
/// Returns 0, or -1 with the last error set (unknown device). Thread-safe.
#[no_mangle]
pub extern "C" fn gpumem_reset_planning(device: c_int) -> c_int {
    call("gpumem_reset_planning", -1, || {
        pool::device_pool(device)?.pool().reset_planning();
        Ok(0)
    })
}

/// Where `device`'s planner stands: 0 off (no [`gpumem_step`] yet), 1 recording the loop, 2 a
/// plan in force, 3 watching for the loop's period ([`gpumem_plan_automatically`]); -1 with the
/// last error set (unknown device). Thread-safe.
#[no_mangle]
pub extern "C" fn gpumem_plan_state(device: c_int) -> c_int {
    call("gpumem_plan_state", -1, || {
        Ok(match pool::device_pool(device)?.pool().plan_stats().state {
            PlanState::Off => 0,
            PlanState::Recording => 1,
            PlanState::Planned => 2,
            PlanState::Detecting => 3,
        })
    })
}
