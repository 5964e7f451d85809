//! `gpumem-trace recommend`: which pool set-up holds the least for a recorded trace, and at what
//! cost.
//!
//! A policy is chosen by what a user measures, not by what suits an average workload: CuPy's rule
//! is cheapest on a loop of fixed shapes and holds many times what is in use where sizes vary;
//! `HoldPeakInUse` holds the least and calls the driver on every miss. So the trace is replayed
//! through every growth policy, with fixed blocks and with expandable segments (and, for a trace
//! of several streams, with sharing across streams too), and each set-up's cost is reported: the
//! peak held over the peak in use, the raw calls (each a driver call on a device, tens to
//! hundreds of microseconds: ANCHORS.md), and the time the replay took on this machine. The
//! policies that grow blocks in place are also replayed with stitching (`GPUMEM_STITCH=1`): its
//! raw calls count each lift of pages as a raw free and each mapping of lifted pages again as a
//! raw allocation, and a loop that keeps moving pages pays them in every iteration (its cost on
//! a device, measured: BENCHMARKS.md).
//!
//! A trace whose program marked its iterations (`step` lines: `gpumem_step`) is replayed once
//! more per set-up with the plan learned from the loop (`Pool::step` at each mark), as a
//! `+ planned` row; a trace with no marks, with the loop's iterations found from the allocations
//! (`Pool::plan_automatically`), as a `+ planned automatically` row. Their figures are the whole
//! trace's, the watched and recorded iterations included: what planning costs on the way is part
//! of what it holds. `gpumem-trace replay --plan` (marked) or `--plan-automatically` gives the
//! figures once the plan is in force.
//!
//! The recommendation is the set-up that holds the least among those whose raw calls stay within
//! twice the fewest any set-up made (plus 16, so that a trace of a few calls does not rule out
//! everything but one): holding less is what a policy is for, and raw calls are what it must not
//! buy that with. The driver calls a device would make are printed beside them: a growing
//! block's growth is three calls per 2 MiB page (create, map, set access), and stitching's moves
//! an unmap and a map per page, so a set-up's driver calls can be many times its raw calls.
//! Stitching is named only where its driver calls stay within twice those of expandable segments
//! alone (plus 16): on a device its moves cost more time in the driver than PyTorch's allocator
//! takes for the whole trace (BENCHMARKS.md), which is not worth a fraction of a percent held.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::Result;
use crate::replay::{self, ReplayOptions, ReplayResult, Step};

/// One set-up replayed: its options and what it cost.
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    /// The growth policy's name (`hold_peak_in_use`), as the command line, the C ABI and Python spell it.
    pub policy: &'static str,
    /// Blocks grow in place (expandable segments).
    pub expandable: bool,
    /// Free memory is lent across the trace's streams.
    pub share_across_streams: bool,
    /// Growths first take the pages under free chunks (stitching, `GPUMEM_STITCH=1`).
    pub stitch: bool,
    /// The pool planned from the loop (`Pool::step` at the trace's `step` lines).
    pub planned: bool,
    /// The pool planned from the loop with the iterations found from the allocations
    /// (`Pool::plan_automatically`; a trace with no `step` lines).
    pub planned_automatically: bool,
    /// What the replay measured.
    pub result: ReplayResult,
    /// Raw allocations and frees together.
    pub raw_calls: u64,
    /// How long the replay took on this machine.
    #[serde(serialize_with = "seconds")]
    pub replay_time: Duration,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's signature
fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Candidate {
    /// How the set-up is asked for: the policy and the variables to set.
    #[must_use]
    pub fn setup(&self) -> String {
        let mut s = self.policy.to_owned();
        if self.expandable {
            s.push_str(" + expandable");
        }
        if self.stitch {
            s.push_str(" + stitching");
        }
        if self.share_across_streams {
            s.push_str(" + shared");
        }
        if self.planned {
            s.push_str(" + planned");
        }
        if self.planned_automatically {
            s.push_str(" + planned automatically");
        }
        s
    }
}

/// Every set-up replayed, and the one recommended.
#[derive(Clone, Debug, Serialize)]
pub struct Recommendation {
    /// Every set-up, in the order replayed.
    pub candidates: Vec<Candidate>,
    /// The index in `candidates` of the recommended one (`None` for an empty trace).
    pub best: Option<usize>,
}

/// Replays `steps` through every set-up and picks the one to recommend (see the module's docs).
///
/// # Errors
///
/// The first replay that fails (see [`replay::replay`]).
pub fn recommend(steps: &[Step]) -> Result<Recommendation> {
    recommend_marked(steps, &[])
}

/// As [`recommend`], for a trace whose program's iterations begin at steps `marks`
/// ([`replay::marks`]): with two marks or more, each set-up is also replayed with the plan;
/// with fewer, with the plan and the iterations found from the allocations.
///
/// # Errors
///
/// As [`recommend`].
pub fn recommend_marked(steps: &[Step], marks: &[usize]) -> Result<Recommendation> {
    let streams: HashSet<_> = steps
        .iter()
        .filter_map(|s| if let Step::Alloc { stream, .. } = s { Some(*stream) } else { None })
        .collect();
    let sharing: &[bool] = if streams.len() > 1 { &[false, true] } else { &[false] };
    // (planned at the marks, planned automatically)
    let planning: &[(bool, bool)] =
        if marks.len() > 1 { &[(false, false), (true, false)] } else { &[(false, false), (false, true)] };
    let mut candidates = Vec::new();
    for &(plan, plan_automatically) in planning {
        for policy in gpumem::GrowthPolicy::ALL {
            // (expandable, stitching): stitching only where blocks grow in place
            // (`HoldPeakInUse` never grows one) and with no plan (a plan's block is never lifted).
            let stitching = policy != gpumem::GrowthPolicy::HoldPeakInUse && !plan && !plan_automatically;
            let layouts: &[(bool, bool)] = if stitching {
                &[(false, false), (true, false), (true, true)]
            } else {
                &[(false, false), (true, false)]
            };
            for &(expandable, stitch) in layouts {
                for &share_across_streams in sharing {
                    let start = Instant::now();
                    let options =
                        ReplayOptions { expandable, share_across_streams, plan, plan_automatically, stitch };
                    let result = replay::replay_marked(steps, marks, policy, options)?;
                    candidates.push(Candidate {
                        policy: policy.name(),
                        expandable,
                        stitch,
                        share_across_streams,
                        planned: plan,
                        planned_automatically: plan_automatically,
                        raw_calls: result.raw_allocs.saturating_add(result.raw_frees),
                        replay_time: start.elapsed(),
                        result,
                    });
                }
            }
        }
    }
    let best = pick(&candidates);
    Ok(Recommendation { candidates, best })
}

/// The least held among the candidates whose raw calls stay within the bound, and, for
/// stitching, whose driver calls stay within twice those of the same set-up without it (plus
/// 16); ties go to fewer raw calls.
fn pick(candidates: &[Candidate]) -> Option<usize> {
    if candidates.iter().all(|c| c.result.peak_in_use == 0) {
        return None;
    }
    let within = |calls: u64, of: u64| calls <= of.saturating_mul(2).saturating_add(16);
    let fewest = candidates.iter().map(|c| c.raw_calls).min()?;
    // Stitching's page moves are driver calls its raw calls do not show: each lifted range is one
    // raw free and one raw allocation, and an unmap and a map per 2 MiB page of it.
    let moves_within = |c: &Candidate| {
        !c.stitch
            || candidates
                .iter()
                .find(|o| {
                    !o.stitch
                        && o.expandable
                        && o.policy == c.policy
                        && o.share_across_streams == c.share_across_streams
                        && o.planned == c.planned
                        && o.planned_automatically == c.planned_automatically
                })
                .is_some_and(|o| within(c.result.driver_calls, o.result.driver_calls))
    };
    (0..candidates.len())
        .filter(|&i| within(candidates[i].raw_calls, fewest) && moves_within(&candidates[i]))
        .min_by_key(|&i| (candidates[i].result.peak_held, candidates[i].raw_calls))
}

impl Recommendation {
    /// The table and the recommendation, as the command prints them.
    #[must_use]
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<2}{:<64} {:>16} {:>8} {:>10} {:>13} {:>12}",
            "", "set-up", "peak held", "ratio", "raw calls", "driver calls", "replay time"
        );
        for (i, c) in self.candidates.iter().enumerate() {
            let mark = if Some(i) == self.best { "*" } else { "" };
            let _ = writeln!(
                s,
                "{:<2}{:<64} {:>16} {:>8.3} {:>10} {:>13} {:>10.3} s",
                mark,
                c.setup(),
                c.result.peak_held,
                c.result.ratio,
                c.raw_calls,
                c.result.driver_calls,
                c.replay_time.as_secs_f64()
            );
        }
        match self.best.map(|i| &self.candidates[i]) {
            Some(c) => {
                let _ = writeln!(
                    s,
                    "\nrecommended: {} ({:.3} held over in use: {} bytes held for {} in use; {} raw calls, {} driver calls)",
                    c.setup(),
                    c.result.ratio,
                    c.result.peak_held,
                    c.result.peak_in_use,
                    c.raw_calls,
                    c.result.driver_calls
                );
                let _ = writeln!(s, "set it with: {}", how_to_set(c));
            }
            None => s.push_str("\nnothing to recommend: the trace allocates nothing\n"),
        }
        s
    }
}

/// The settings that give `c`: the C ABI's and Python's call, and the environment.
fn how_to_set(c: &Candidate) -> String {
    let mut s = format!("gpumem_set_growth_policy(device, \"{}\")", c.policy);
    s.push_str(if c.expandable {
        ", GPUMEM_EXPANDABLE_SEGMENTS=1 (the C ABI's default)"
    } else {
        ", GPUMEM_EXPANDABLE_SEGMENTS=0"
    });
    if c.stitch {
        s.push_str(", GPUMEM_STITCH=1");
    }
    if c.share_across_streams {
        s.push_str(", GPUMEM_SHARE_ACROSS_STREAMS=1");
    }
    if c.planned {
        s.push_str(", gpumem_step(device) after each iteration (Python: gpumem_runtime.step())");
    }
    if c.planned_automatically {
        s.push_str(", GPUMEM_PLAN_AUTOMATICALLY=1 (or gpumem_plan_automatically(device); Python: gpumem_runtime.plan_automatically())");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recommendation_holds_no_more_than_any_candidate_within_the_raw_call_bound() {
        // Sizes that vary from one iteration to the next: CuPy's rule keeps a block for each.
        let mut steps = Vec::new();
        for i in 0..20usize {
            let ids = i * 5..i * 5 + 5;
            steps.extend(ids.clone().map(|id| Step::Alloc {
                id,
                size: (id % 5 * 3 + 3 + i) << 20,
                stream: 0,
            }));
            steps.extend(ids.map(|id| Step::Free { id }));
        }
        let r = recommend(&steps).unwrap();
        assert_eq!(
            r.candidates.len(),
            19,
            "4 policies, fixed and expandable, one stream, planned automatically or not, and the three \
             policies that grow blocks with stitching, unplanned"
        );
        assert_eq!(r.candidates.iter().filter(|c| c.stitch).count(), 3);
        assert!(r.candidates.iter().filter(|c| c.stitch).all(|c| c.expandable && !c.planned_automatically));
        assert_eq!(r.candidates.iter().filter(|c| c.planned_automatically).count(), 8);
        let best = &r.candidates[r.best.unwrap()];
        let fewest = r.candidates.iter().map(|c| c.raw_calls).min().unwrap();
        for c in &r.candidates {
            if c.raw_calls <= fewest * 2 + 16 {
                assert!(best.result.peak_held <= c.result.peak_held, "{} beats {}", c.setup(), best.setup());
            }
        }
        let cupy = &r.candidates[0];
        assert!(best.result.peak_held < cupy.result.peak_held, "CuPy's rule holds more on varying sizes");
        let text = r.render();
        assert!(text.contains(&format!("recommended: {}", best.setup())), "{text}");
    }

    /// The pool's recorded training traces (three steps each) and its random trace.
    fn recorded() -> Vec<(&'static str, Vec<Step>)> {
        use gpumem::core::pool::trace as pool_trace;
        let convert = |steps: Vec<pool_trace::Step>| -> Vec<Step> {
            steps
                .into_iter()
                .map(|s| match s {
                    pool_trace::Step::Alloc { id, size, stream } => {
                        Step::Alloc { id: id as usize, size, stream }
                    }
                    pool_trace::Step::Free { id } => Step::Free { id: id as usize },
                })
                .collect()
        };
        let parse = |text: &str| convert(pool_trace::parse(text).unwrap());
        vec![
            ("GPT-2 training", parse(include_str!("../../core/tests/fixtures/gpt2-training.trace"))),
            ("BERT fine-tuning", parse(include_str!("../../core/tests/fixtures/bert-finetuning.trace"))),
            ("ViT-B/16 training", parse(include_str!("../../core/tests/fixtures/vit-training.trace"))),
            ("random, 4 streams", convert(pool_trace::standard_random())),
        ]
    }

    #[test]
    #[cfg_attr(miri, ignore = "replays thousands of trace steps: too slow under Miri")]
    fn on_the_recorded_traces_the_recommendation_holds_less_than_cupys_rule() {
        for (name, steps) in recorded() {
            let r = recommend(&steps).unwrap();
            let best = &r.candidates[r.best.unwrap()];
            let cupy = r.candidates.iter().find(|c| c.setup() == "cache_until_out_of_memory").unwrap();
            println!("{name}:\n{}", r.render());
            assert!(best.result.peak_held <= cupy.result.peak_held, "{name}");
            let held =
                |setup: &str| r.candidates.iter().find(|c| c.setup() == setup).unwrap().result.peak_held;
            assert!(
                held("segments + expandable + stitching") <= held("segments + expandable"),
                "{name}: stitching holds no more than the blocks it lifts pages from"
            );
            // Stitching holds less on every trace, and is passed over for the driver calls its
            // page moves make (GPT-2: 8,564 against expandable segments' 514).
            let alone = r.candidates.iter().find(|c| c.setup() == "segments + expandable").unwrap();
            let stitched =
                r.candidates.iter().find(|c| c.setup() == "segments + expandable + stitching").unwrap();
            assert!(stitched.result.driver_calls > 2 * alone.result.driver_calls + 16, "{name}");
            assert!(!best.stitch, "{name}: {} recommended", best.setup());
            for c in &r.candidates {
                let (calls, driver) = (c.raw_calls, c.result.driver_calls);
                match (c.expandable, c.stitch) {
                    (false, _) => {
                        assert_eq!(driver, calls, "{name}: {}: a fixed block is one call", c.setup())
                    }
                    (true, false) => assert!(driver >= calls, "{name}: {}: {driver} < {calls}", c.setup()),
                    (true, true) => {
                        assert!(driver > 2 * calls, "{name}: {}: pages moved one by one", c.setup())
                    }
                }
            }
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "replays thousands of trace steps: too slow under Miri")]
    fn a_marked_training_trace_adds_planned_rows_that_hold_within_two_percent() {
        use gpumem::core::pool::trace as pool_trace;
        let text = include_str!("../../core/tests/fixtures/gpt2-training.trace");
        // The recorded steps, the last one repeated to ten (synthetic: three were recorded).
        let (steps, marks) = pool_trace::repeat_last_iteration(
            &pool_trace::parse(text).unwrap(),
            &pool_trace::step_marks(text),
            7,
        );
        let steps: Vec<Step> = steps
            .into_iter()
            .map(|s| match s {
                pool_trace::Step::Alloc { id, size, stream } => Step::Alloc { id: id as usize, size, stream },
                pool_trace::Step::Free { id } => Step::Free { id: id as usize },
            })
            .collect();
        let r = recommend_marked(&steps, &marks).unwrap();
        println!("GPT-2 training, last step repeated to ten:\n{}", r.render());
        assert_eq!(r.candidates.len(), 19);
        let planned =
            r.candidates.iter().find(|c| c.setup() == "cache_until_out_of_memory + planned").unwrap();
        assert!(planned.result.ratio <= 1.02, "{}", planned.result.ratio);
        assert_eq!(planned.result.plan.as_ref().unwrap().raw_calls, 0);
    }

    #[test]
    fn several_streams_add_the_shared_set_ups_and_an_empty_trace_recommends_nothing() {
        let steps = vec![
            Step::Alloc { id: 0, size: 4096, stream: 0 },
            Step::Alloc { id: 1, size: 4096, stream: 1 },
            Step::Free { id: 0 },
            Step::Free { id: 1 },
        ];
        assert_eq!(recommend(&steps).unwrap().candidates.len(), 38);
        let empty = recommend(&[]).unwrap();
        assert_eq!(empty.best, None);
        assert!(empty.render().contains("nothing to recommend"));
    }
}
