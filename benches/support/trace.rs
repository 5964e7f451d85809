//! Allocation traces for the fragmentation replay: a seeded random trace, and traces recorded
//! elsewhere (PyTorch's memory history of real training steps) read from a text file.
//!
//! Text format, one step per line: `a <id> <size> <stream>` allocates `size` bytes on stream number
//! `stream` (0 is the null stream); `f <id>` frees allocation `id`.

use std::fmt::Write as _;

/// One step of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Allocate `size` bytes on stream `stream`, known as `id` until freed.
    Alloc { id: u64, size: usize, stream: usize },
    /// Free allocation `id`.
    Free { id: u64 },
}

/// A small, fast, seedable generator (SplitMix64), so the trace is the same on every machine.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        // Box-Muller.
        let (u1, u2) = (self.unit().max(f64::MIN_POSITIVE), self.unit());
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// The random trace: `steps` steps, `alloc_share` of them allocations (the rest free a random live
/// allocation), sizes log-normal around `median` bytes with shape `sigma`, at most `max` bytes,
/// spread over `streams` streams.
pub fn random(
    seed: u64,
    steps: usize,
    alloc_share: f64,
    median: f64,
    sigma: f64,
    max: usize,
    streams: usize,
) -> Vec<Step> {
    let mut rng = SplitMix(seed);
    let mut live: Vec<u64> = Vec::new();
    let mut out = Vec::with_capacity(steps);
    let mut next_id = 0;
    for _ in 0..steps {
        if live.is_empty() || rng.unit() < alloc_share {
            let size = (median * (sigma * rng.normal()).exp()).clamp(1.0, max as f64) as usize;
            let stream = (rng.next() % streams as u64) as usize;
            out.push(Step::Alloc { id: next_id, size, stream });
            live.push(next_id);
            next_id += 1;
        } else {
            let i = (rng.next() % live.len() as u64) as usize;
            out.push(Step::Free { id: live.swap_remove(i) });
        }
    }
    out
}

/// The standard random trace of the benchmarks: 20,000 steps, 52 % allocations, log-normal sizes
/// (median 256 KiB, sigma 2) up to 256 MiB, on 4 streams.
pub fn standard_random() -> Vec<Step> {
    random(20_261_130, 20_000, 0.52, 256.0 * 1024.0, 2.0, 256 << 20, 4)
}

/// Parses the text format.
pub fn parse(text: &str) -> Result<Vec<Step>, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let num = |i: usize| {
                f.get(i).and_then(|v| v.parse::<u64>().ok()).ok_or_else(|| format!("bad line: {line}"))
            };
            match f.first() {
                Some(&"a") => {
                    Ok(Step::Alloc { id: num(1)?, size: num(2)? as usize, stream: num(3)? as usize })
                }
                Some(&"f") => Ok(Step::Free { id: num(1)? }),
                _ => Err(format!("bad line: {line}")),
            }
        })
        .collect()
}

/// Writes the text format.
pub fn render(steps: &[Step]) -> String {
    let mut s = String::with_capacity(steps.len() * 16);
    for step in steps {
        match step {
            Step::Alloc { id, size, stream } => writeln!(s, "a {id} {size} {stream}"),
            Step::Free { id } => writeln!(s, "f {id}"),
        }
        .expect("writing to a String cannot fail");
    }
    s
}

/// Peak bytes in use over the trace (requested sizes): the allocator-independent denominator.
pub fn peak_in_use(steps: &[Step]) -> usize {
    let mut live = std::collections::HashMap::new();
    let (mut used, mut peak) = (0usize, 0usize);
    for step in steps {
        match *step {
            Step::Alloc { id, size, .. } => {
                live.insert(id, size);
                used += size;
                peak = peak.max(used);
            }
            Step::Free { id } => used -= live.remove(&id).unwrap_or(0),
        }
    }
    peak
}
