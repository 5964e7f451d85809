//! What a trace says happened: each allocation's lifetime, and the statistics over them.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::format::{Event, Hook, Trace};

/// One pool allocation, from its `malloc` line to its `free` line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Allocation {
    /// Its number, in order of allocation.
    pub id: usize,
    /// The device.
    pub device_id: i32,
    /// Its address.
    pub ptr: u64,
    /// The bytes asked for.
    pub size: u64,
    /// The bytes lent (rounded).
    pub mem_size: u64,
    /// Its stream (0 when the trace does not say).
    pub stream: u64,
    /// The thread that allocated it, if recorded.
    pub thread: Option<u64>,
    /// Where it was allocated, if recorded.
    pub site: Option<String>,
    /// The step of its `malloc` (see [`Timeline::steps`]).
    pub start: usize,
    /// The step of its `free`; `None` if still live at the end of the trace.
    pub end: Option<usize>,
    /// The `time_ns` of its `malloc`, if recorded.
    pub start_ns: Option<u64>,
    /// The `time_ns` of its `free`, if recorded.
    pub end_ns: Option<u64>,
}

/// A trace's pool allocations and raw calls laid on one time axis.
///
/// The axis counts *steps*: every post-operation `malloc` or `free` line that changes what is in
/// use is one step (as PyTorch's memory_viz counts them). Raw calls take the step of the next
/// pool operation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Timeline {
    /// The allocations, in order of allocation.
    pub allocations: Vec<Allocation>,
    /// How many steps the axis has.
    pub steps: usize,
    /// `time_ns` of each step, where recorded.
    pub step_ns: Vec<Option<u64>>,
    /// The raw bytes held after each raw call: `(step, bytes held)`.
    pub held: Vec<(usize, u64)>,
    /// Raw allocations (successful `alloc` lines).
    pub raw_allocs: u64,
    /// Raw frees (`raw_free` lines).
    pub raw_frees: u64,
    /// `malloc` lines that failed (address 0).
    pub failed_mallocs: u64,
    /// `free` lines that match no live allocation (made before the trace began).
    pub unmatched_frees: u64,
    /// `raw_free` lines that match no raw allocation of the trace.
    pub unmatched_raw_frees: u64,
    /// Lines written before their operation (skipped).
    pub pre_lines: u64,
    /// `malloc` lines that lend an address (and id) again that the trace never freed: the free
    /// line was lost. Each is taken as a free made just before, on its own step.
    pub lost_frees: u64,
    /// Set when the raw bytes held exceed 2^64 - 1 (then `held` saturates): [`Timeline::stats`]
    /// reports [`Error::Overflow`].
    pub held_overflow: bool,
    /// The iteration boundaries the program marked (`step` lines): for each, the step the
    /// iteration after it begins at.
    pub marks: Vec<usize>,
}

impl Timeline {
    /// Lays out `trace`. Frees are matched to allocations by device, address and `pmem_id`, so
    /// that a free written after another thread has already been lent the same address does not
    /// end the wrong allocation.
    #[must_use]
    pub fn new(trace: &Trace) -> Self {
        Self::from_events(&trace.events)
    }

    /// As [`Timeline::new`], from the events alone.
    #[must_use]
    pub fn from_events(events: &[Event]) -> Self {
        let mut t = Timeline::default();
        let mut live: HashMap<(i32, u64, u64), usize> = HashMap::new();
        let mut raw_live: HashMap<(i32, u64), u64> = HashMap::new();
        let mut held = 0u64;
        for e in events {
            if !e.is_post() {
                t.pre_lines += 1;
                continue;
            }
            match e.kind() {
                Hook::Malloc if e.mem_ptr == 0 => t.failed_mallocs += 1,
                Hook::Malloc => {
                    let id = t.allocations.len();
                    let key = (e.device_id, e.mem_ptr, e.pmem_id.unwrap_or(0));
                    if let Some(old) = live.insert(key, id) {
                        // The same address and id lent twice without a free between: the free
                        // line was lost. End the old one on a step of its own just before, rather
                        // than let it live forever (or share this step and be lost in a replay).
                        t.lost_frees += 1;
                        t.allocations[old].end = Some(t.steps);
                        t.allocations[old].end_ns = e.time_ns;
                        t.step_ns.push(e.time_ns);
                        t.steps += 1;
                    }
                    t.allocations.push(Allocation {
                        id,
                        device_id: e.device_id,
                        ptr: e.mem_ptr,
                        size: e.requested(),
                        mem_size: e.mem_size,
                        stream: e.stream.unwrap_or(0),
                        thread: e.thread,
                        site: e.site.clone(),
                        start: t.steps,
                        end: None,
                        start_ns: e.time_ns,
                        end_ns: None,
                    });
                    t.step_ns.push(e.time_ns);
                    t.steps += 1;
                }
                Hook::Free => match live.remove(&(e.device_id, e.mem_ptr, e.pmem_id.unwrap_or(0))) {
                    Some(id) => {
                        t.allocations[id].end = Some(t.steps);
                        t.allocations[id].end_ns = e.time_ns;
                        t.step_ns.push(e.time_ns);
                        t.steps += 1;
                    }
                    None => t.unmatched_frees += 1,
                },
                Hook::Alloc if e.mem_ptr == 0 => {}
                Hook::Alloc => {
                    t.raw_allocs += 1;
                    let block = raw_live.entry((e.device_id, e.mem_ptr)).or_insert(0);
                    *block = block.saturating_add(e.mem_size);
                    held = held.checked_add(e.mem_size).unwrap_or_else(|| {
                        t.held_overflow = true;
                        u64::MAX
                    });
                    t.held.push((t.steps, held));
                }
                Hook::Step => t.marks.push(t.steps),
                Hook::RawFree => {
                    t.raw_frees += 1;
                    match raw_live.remove(&(e.device_id, e.mem_ptr)) {
                        Some(bytes) => {
                            // Saturated sums free at most what is held.
                            held = held.saturating_sub(bytes);
                            t.held.push((t.steps, held));
                        }
                        None => t.unmatched_raw_frees += 1,
                    }
                }
            }
        }
        t
    }

    /// Each step's change in requested bytes in use, and rounded bytes: `(step, Δsize, Δmem_size)`
    /// in step order.
    fn deltas(&self) -> Vec<(usize, i128, i128)> {
        let mut d = Vec::with_capacity(self.allocations.len() * 2);
        for a in &self.allocations {
            d.push((a.start, i128::from(a.size), i128::from(a.mem_size)));
            if let Some(end) = a.end {
                d.push((end, -i128::from(a.size), -i128::from(a.mem_size)));
            }
        }
        d.sort_by_key(|x| x.0);
        d
    }

    /// The statistics of the trace; `top` is how many of the largest allocations to list.
    ///
    /// # Errors
    ///
    /// [`Error::Overflow`] when a sum (bytes requested, in use, held or allocated raw) does not
    /// fit 64 bits.
    pub fn stats(&self, top: usize) -> Result<Stats> {
        if self.held_overflow {
            return Err(Error::Overflow("raw bytes held"));
        }
        let mut s = Stats {
            mallocs: self.allocations.len() as u64,
            frees: self.allocations.iter().filter(|a| a.end.is_some()).count() as u64,
            live_at_end: self.allocations.iter().filter(|a| a.end.is_none()).count() as u64,
            failed_mallocs: self.failed_mallocs,
            unmatched_frees: self.unmatched_frees,
            lost_frees: self.lost_frees,
            raw_allocs: self.raw_allocs,
            raw_frees: self.raw_frees,
            raw_bytes_allocated: 0,
            peak_held: self.held.iter().map(|h| h.1).max().unwrap_or(0),
            steps: self.steps as u64,
            ..Stats::default()
        };
        let (mut used, mut used_rounded) = (0i128, 0i128);
        for (step, d, dr) in self.deltas() {
            used += d;
            used_rounded += dr;
            if used > i128::from(s.peak_in_use) {
                s.peak_in_use = bytes(used, "bytes in use")?;
                s.peak_step = step as u64;
            }
            s.peak_in_use_rounded = s.peak_in_use_rounded.max(bytes(used_rounded, "rounded bytes in use")?);
        }
        s.bytes_requested = sum(self.allocations.iter().map(|a| a.size), "bytes requested")?;
        let mut raw_total = 0u64;
        let mut last = 0u64;
        for &(_, h) in &self.held {
            if h > last {
                raw_total = raw_total.checked_add(h - last).ok_or(Error::Overflow("raw bytes allocated"))?;
            }
            last = h;
        }
        s.raw_bytes_allocated = raw_total;

        let mut by_stream: BTreeMap<u64, Vec<&Allocation>> = BTreeMap::new();
        for a in &self.allocations {
            by_stream.entry(a.stream).or_default().push(a);
        }
        for (stream, allocs) in by_stream {
            let mut deltas: Vec<(usize, i128)> = Vec::new();
            for a in &allocs {
                deltas.push((a.start, i128::from(a.size)));
                if let Some(end) = a.end {
                    deltas.push((end, -i128::from(a.size)));
                }
            }
            deltas.sort_by_key(|x| x.0);
            let (mut used, mut peak) = (0i128, 0i128);
            for (_, d) in deltas {
                used += d;
                peak = peak.max(used);
            }
            s.streams.push(StreamStats {
                stream,
                mallocs: allocs.len() as u64,
                frees: allocs.iter().filter(|a| a.end.is_some()).count() as u64,
                bytes_requested: sum(allocs.iter().map(|a| a.size), "bytes requested")?,
                peak_in_use: bytes(peak, "bytes in use")?,
                largest: allocs.iter().map(|a| a.size).max().unwrap_or(0),
            });
        }

        s.sites = site_stats(&self.allocations, top)?;

        let mut largest: Vec<&Allocation> = self.allocations.iter().collect();
        // Largest first; among equals the earlier first, so the list is the same on every run.
        largest.sort_by(|a, b| b.size.cmp(&a.size).then(a.id.cmp(&b.id)));
        s.largest = largest.into_iter().take(top).cloned().collect();
        Ok(s)
    }
}

/// The sum of `values`, or [`Error::Overflow`] naming `what`.
fn sum(mut values: impl Iterator<Item = u64>, what: &'static str) -> Result<u64> {
    values.try_fold(0u64, u64::checked_add).ok_or(Error::Overflow(what))
}

/// A running total (never negative: every free follows its allocation) as bytes, or
/// [`Error::Overflow`] naming `what`.
fn bytes(total: i128, what: &'static str) -> Result<u64> {
    u64::try_from(total).map_err(|_| Error::Overflow(what))
}

/// Statistics of a trace, as `gpumem-trace stats` prints them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Steps on the time axis.
    pub steps: u64,
    /// Successful pool allocations.
    pub mallocs: u64,
    /// Their frees.
    pub frees: u64,
    /// Allocations never freed in the trace.
    pub live_at_end: u64,
    /// Pool allocations that failed.
    pub failed_mallocs: u64,
    /// Frees of allocations made before the trace began.
    pub unmatched_frees: u64,
    /// Frees the trace lost: an address lent again without a free line (see
    /// [`Timeline::lost_frees`]).
    pub lost_frees: u64,
    /// Raw allocations.
    pub raw_allocs: u64,
    /// Raw frees.
    pub raw_frees: u64,
    /// Bytes asked for over the whole trace.
    pub bytes_requested: u64,
    /// The most requested bytes in use at once.
    pub peak_in_use: u64,
    /// The step at which that peak was first reached.
    pub peak_step: u64,
    /// The most rounded (lent) bytes in use at once.
    pub peak_in_use_rounded: u64,
    /// Raw bytes allocated over the whole trace.
    pub raw_bytes_allocated: u64,
    /// The most raw bytes held at once (from the `alloc` and `raw_free` lines).
    pub peak_held: u64,
    /// Per stream, in stream order.
    pub streams: Vec<StreamStats>,
    /// The largest allocations, largest first.
    pub largest: Vec<Allocation>,
    /// The call sites that asked for the most bytes, most first (empty when the trace records
    /// no `site`).
    pub sites: Vec<SiteStats>,
}

/// The allocations made from one call site.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SiteStats {
    /// The call site, as the trace writes it (`file:line:function`).
    pub site: String,
    /// Successful pool allocations made there.
    pub mallocs: u64,
    /// Bytes asked for there over the whole trace.
    pub bytes_requested: u64,
    /// The most bytes allocated there in use at once.
    pub peak_in_use: u64,
    /// Its allocations still live at the end of the trace.
    pub live_at_end: u64,
    /// The bytes of those.
    pub live_bytes_at_end: u64,
    /// Its largest allocation.
    pub largest: u64,
}

/// The `top` call sites by bytes requested (ties: the site first seen first).
fn site_stats(allocations: &[Allocation], top: usize) -> Result<Vec<SiteStats>> {
    // Site -> (order first seen, its allocations).
    let mut by_site: HashMap<&str, (usize, Vec<&Allocation>)> = HashMap::new();
    for a in allocations {
        if let Some(site) = a.site.as_deref() {
            let n = by_site.len();
            by_site.entry(site).or_insert_with(|| (n, Vec::new())).1.push(a);
        }
    }
    let mut sites: Vec<(usize, SiteStats)> = by_site
        .into_iter()
        .map(|(site, (first, allocs))| -> Result<(usize, SiteStats)> {
            let mut deltas: Vec<(usize, i128)> = Vec::with_capacity(allocs.len() * 2);
            for a in &allocs {
                deltas.push((a.start, i128::from(a.size)));
                if let Some(end) = a.end {
                    deltas.push((end, -i128::from(a.size)));
                }
            }
            // At one step a free comes before an allocation: steps are distinct, but keep the
            // order defined.
            deltas.sort_unstable();
            let (mut used, mut peak) = (0i128, 0i128);
            for (_, d) in deltas {
                used += d;
                peak = peak.max(used);
            }
            let live: Vec<&&Allocation> = allocs.iter().filter(|a| a.end.is_none()).collect();
            let stats = SiteStats {
                site: site.to_owned(),
                mallocs: allocs.len() as u64,
                bytes_requested: sum(allocs.iter().map(|a| a.size), "bytes requested")?,
                peak_in_use: bytes(peak, "bytes in use")?,
                live_at_end: live.len() as u64,
                live_bytes_at_end: sum(live.iter().map(|a| a.size), "bytes live at the end")?,
                largest: allocs.iter().map(|a| a.size).max().unwrap_or(0),
            };
            Ok((first, stats))
        })
        .collect::<Result<_>>()?;
    sites.sort_by(|(fa, a), (fb, b)| b.bytes_requested.cmp(&a.bytes_requested).then(fa.cmp(fb)));
    Ok(sites.into_iter().take(top).map(|(_, s)| s).collect())
}

/// Statistics of one stream's allocations.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StreamStats {
    /// The stream.
    pub stream: u64,
    /// Successful pool allocations on it.
    pub mallocs: u64,
    /// Their frees.
    pub frees: u64,
    /// Bytes asked for.
    pub bytes_requested: u64,
    /// The most requested bytes in use at once on this stream.
    pub peak_in_use: u64,
    /// Its largest allocation.
    pub largest: u64,
}

/// Nanoseconds for people: `850 ns`, `12.3 µs`, `7.09 ms`, `1.80 s` (three significant digits).
#[must_use]
pub fn human_time(ns: u64) -> String {
    const UNITS: [(f64, &str); 3] = [(1e9, "s"), (1e6, "ms"), (1e3, "µs")];
    let v = ns as f64;
    for (scale, unit) in UNITS {
        if v >= scale {
            let x = v / scale;
            let digits = if x >= 100.0 {
                0
            } else if x >= 10.0 {
                1
            } else {
                2
            };
            return format!("{x:.digits$} {unit}");
        }
    }
    format!("{ns} ns")
}

/// `bytes` for people: `1.5 MiB`.
#[must_use]
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

impl Stats {
    /// The statistics as a readable report.
    #[must_use]
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let b = |v: u64| format!("{v} ({})", human_bytes(v));
        let _ = writeln!(s, "events                {}", self.steps);
        let _ = writeln!(
            s,
            "pool allocations      {} ({} freed, {} live at end, {} failed)",
            self.mallocs, self.frees, self.live_at_end, self.failed_mallocs
        );
        if self.unmatched_frees > 0 {
            let _ = writeln!(s, "frees of earlier allocations  {}", self.unmatched_frees);
        }
        if self.lost_frees > 0 {
            let _ = writeln!(
                s,
                "lost frees            {} (an address lent again without a free line)",
                self.lost_frees
            );
        }
        let _ = writeln!(s, "bytes requested       {}", b(self.bytes_requested));
        let _ = writeln!(s, "peak in use           {} at event {}", b(self.peak_in_use), self.peak_step);
        let _ = writeln!(s, "peak in use, rounded  {}", b(self.peak_in_use_rounded));
        let _ = writeln!(s, "raw allocations       {} ({})", self.raw_allocs, b(self.raw_bytes_allocated));
        let _ = writeln!(s, "raw frees             {}", self.raw_frees);
        let _ = writeln!(s, "peak held             {}", b(self.peak_held));
        let _ = writeln!(s, "\nper stream");
        let _ = writeln!(
            s,
            "{:>20} {:>10} {:>10} {:>14} {:>14} {:>14}",
            "stream", "mallocs", "frees", "requested", "peak in use", "largest"
        );
        for st in &self.streams {
            let _ = writeln!(
                s,
                "{:>20} {:>10} {:>10} {:>14} {:>14} {:>14}",
                st.stream,
                st.mallocs,
                st.frees,
                human_bytes(st.bytes_requested),
                human_bytes(st.peak_in_use),
                human_bytes(st.largest)
            );
        }
        if !self.largest.is_empty() {
            let _ = writeln!(s, "\nlargest allocations");
            let _ = writeln!(
                s,
                "{:>14} {:>12} {:>20} {:>9} {:>9}  site",
                "size", "bytes", "stream", "from", "to"
            );
            for a in &self.largest {
                let _ = writeln!(
                    s,
                    "{:>14} {:>12} {:>20} {:>9} {:>9}  {}",
                    human_bytes(a.size),
                    a.size,
                    a.stream,
                    a.start,
                    a.end.map_or_else(|| "live".to_owned(), |e| e.to_string()),
                    a.site.as_deref().unwrap_or("-")
                );
            }
        }
        if !self.sites.is_empty() {
            let _ = writeln!(s, "\ntop call sites");
            let _ = writeln!(
                s,
                "{:>14} {:>8} {:>14} {:>14} {:>8}  site",
                "requested", "mallocs", "peak in use", "largest", "live"
            );
            for site in &self.sites {
                let _ = writeln!(
                    s,
                    "{:>14} {:>8} {:>14} {:>14} {:>8}  {}",
                    human_bytes(site.bytes_requested),
                    site.mallocs,
                    human_bytes(site.peak_in_use),
                    human_bytes(site.largest),
                    site.live_at_end,
                    site.site
                );
            }
            if self.sites.iter().any(|site| site.site.starts_with("??:0:")) {
                let _ = writeln!(
                    s,
                    "note: sites `??:0:...` have no file or line: the recorded program was built without line \
                     tables; build it with `[profile.release] debug = \"line-tables-only\"` to see them"
                );
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Event;

    fn malloc(ptr: u64, size: u64, stream: u64) -> Event {
        Event {
            hook: Hook::Malloc,
            size: Some(size),
            mem_size: size.div_ceil(512) * 512,
            mem_ptr: ptr,
            pmem_id: Some(ptr),
            stream: Some(stream),
            ..Default::default()
        }
    }
    fn free(ptr: u64) -> Event {
        Event { hook: Hook::Free, mem_size: 0, mem_ptr: ptr, pmem_id: Some(ptr), ..Default::default() }
    }

    #[test]
    fn peaks_counts_and_streams() {
        let events = vec![
            malloc(1, 100, 0),
            malloc(2, 1000, 5),
            free(1),
            malloc(3, 50, 0),
            free(7), // made before the trace
            free(2),
            Event { hook: Hook::Malloc, mem_ptr: 0, ..malloc(0, 9, 0) },
        ];
        let t = Timeline::from_events(&events);
        let s = t.stats(2).unwrap();
        assert_eq!((s.mallocs, s.frees, s.live_at_end, s.failed_mallocs, s.unmatched_frees), (3, 2, 1, 1, 1));
        assert_eq!(s.peak_in_use, 1100);
        assert_eq!(s.peak_step, 1);
        assert_eq!(s.peak_in_use_rounded, 512 + 1024);
        assert_eq!(s.streams.len(), 2);
        assert_eq!(s.streams[0].peak_in_use, 100);
        assert_eq!(s.streams[1].peak_in_use, 1000);
        assert_eq!(s.largest.iter().map(|a| a.size).collect::<Vec<_>>(), [1000, 100]);
        assert_eq!(t.steps, 5);
    }

    #[test]
    fn call_sites_rank_by_bytes_requested() {
        let at = |e: Event, site: &str| Event { site: Some(site.into()), ..e };
        let events = vec![
            at(malloc(1, 100, 0), "a.rs:1:f"),
            at(malloc(2, 300, 0), "b.rs:2:g"),
            at(malloc(3, 150, 0), "a.rs:1:f"),
            free(1),
            at(malloc(4, 150, 0), "a.rs:1:f"),
            malloc(5, 10_000, 0), // no site
            at(malloc(6, 1, 0), "c.rs:3:h"),
            free(2),
        ];
        let s = Timeline::from_events(&events).stats(2).unwrap();
        let got: Vec<(&str, u64, u64, u64, u64, u64)> = s
            .sites
            .iter()
            .map(|x| (x.site.as_str(), x.mallocs, x.bytes_requested, x.peak_in_use, x.live_at_end, x.largest))
            .collect();
        // a.rs: 100 + 150 + 150 asked, at most 100 + 150 then 150 + 150 live at once.
        assert_eq!(got, [("a.rs:1:f", 3, 400, 300, 2, 150), ("b.rs:2:g", 1, 300, 300, 0, 300)]);
        assert_eq!(s.sites[0].live_bytes_at_end, 300);
        let report = s.render();
        let section = report.split("top call sites").nth(1).unwrap_or_else(|| panic!("{report}"));
        assert!(section.find("a.rs:1:f").unwrap() < section.find("b.rs:2:g").unwrap(), "{report}");
        assert!(!section.contains("c.rs:3:h"), "only the top 2: {report}");
        // A trace without sites prints no such section.
        assert!(!Timeline::from_events(&[malloc(1, 5, 0)])
            .stats(5)
            .unwrap()
            .render()
            .contains("top call sites"));
    }

    #[test]
    fn raw_calls_make_the_held_curve() {
        let raw = |hook, ptr, size| Event { hook, mem_size: size, mem_ptr: ptr, ..Default::default() };
        let t = Timeline::from_events(&[
            raw(Hook::Alloc, 10, 1000),
            raw(Hook::Alloc, 20, 500),
            raw(Hook::RawFree, 10, 0),
            raw(Hook::Alloc, 30, 700),
            raw(Hook::RawFree, 99, 0),
        ]);
        let s = t.stats(0).unwrap();
        assert_eq!((s.raw_allocs, s.raw_frees, s.peak_held, s.raw_bytes_allocated), (3, 2, 1500, 2200));
        assert_eq!(t.unmatched_raw_frees, 1);
    }
    #[test]
    fn times_read_in_their_unit() {
        assert_eq!(human_time(850), "850 ns");
        assert_eq!(human_time(12_345), "12.3 µs");
        assert_eq!(human_time(7_093_467), "7.09 ms");
        assert_eq!(human_time(179_510_155), "180 ms");
        assert_eq!(human_time(1_800_000_000), "1.80 s");
    }
}
