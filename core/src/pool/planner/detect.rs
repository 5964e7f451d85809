//! Finding a loop's iterations when nobody marks them ([`Pool::plan_automatically`]): the
//! allocations of a loop repeat with a period, so the pool watches the sequence of allocations
//! (their sizes and arenas) until its last `2P` allocations are two equal halves, and then marks
//! an iteration boundary every `P` allocations, as `step()` would.
//!
//! A loop's body often repeats inside itself too: the layers of a network allocate the same
//! sizes one after the other. What tells the loop from its layers is that an iteration ends where
//! it began: the bytes the watched allocations hold are back where they were a period before
//! (a forward pass keeps each layer's activations, so a layer ends higher than it began). A loop
//! that keeps a little from each iteration (a loss kept for logging) still counts: the bytes may
//! differ by at most 1/64 of what the period allocated. What the detector proposes, the planner
//! still checks (two recorded iterations must be the same, frees included), and after a period
//! that fails the next must be at least twice as long (see `Auto` in the module above).
//!
//! Candidate periods come from the last few earlier allocations of the same size and arena (an
//! allocation whose size an iteration makes once or a few times gives the period itself), and
//! of the same size and arena made with the same bytes held (a network's layers make the same
//! sizes many times an iteration, but in a forward pass each at another level of bytes held, so
//! the one before with the same level is a period back), each checked in constant time with a
//! polynomial hash of the sequence, then compared exactly.
//!
//! [`Pool::plan_automatically`]: super::super::Pool::plan_automatically

use std::collections::HashMap;

use super::super::ArenaKey;

/// The most allocations watched at once; past it the watch starts again (so a loop whose
/// iteration makes more than half as many is not found, and memory stays bounded).
pub(crate) const MAX_WATCHED: usize = 1 << 18;

/// Earlier allocations of the same size and arena whose distance is tried as the period.
const CANDIDATES: usize = 4;

/// The hash's multiplier (odd; arithmetic is modulo 2^64).
const BASE: u64 = 0x9E37_79B9_7F4A_7C15;

/// What the detector knows of the allocations since it began.
#[derive(Debug)]
pub(crate) struct Detector {
    /// Each allocation's signature (its size and arena, mixed).
    sigs: Vec<u64>,
    /// `prefix[i]`: the hash of the first `i` signatures.
    prefix: Vec<u64>,
    /// `allocated[i]`: the bytes of the first `i` allocations.
    allocated: Vec<u64>,
    /// `held[i]`: the bytes the watched allocations held just before allocation `i`.
    held: Vec<u64>,
    /// The bytes the watched allocations hold now.
    now: u64,
    /// The last few positions of each signature, and of each signature with the bytes held
    /// before it.
    last: HashMap<u64, [u32; CANDIDATES]>,
    last_at_level: HashMap<u64, [u32; CANDIDATES]>,
    /// The shortest period proposed (at least twice every period that failed).
    min_period: usize,
}

impl Detector {
    pub(crate) fn new(min_period: usize) -> Self {
        Detector {
            sigs: Vec::new(),
            prefix: vec![0],
            allocated: vec![0],
            held: Vec::new(),
            now: 0,
            last: HashMap::new(),
            last_at_level: HashMap::new(),
            min_period: min_period.max(1),
        }
    }

    /// Notes an allocation of `size` (rounded) bytes in arena `key`; returns the loop's period in
    /// allocations when the sequence ending with this allocation is two equal iterations.
    pub(crate) fn on_alloc(&mut self, size: usize, key: ArenaKey) -> Option<usize> {
        if self.sigs.len() == MAX_WATCHED {
            *self = Detector::new(self.min_period);
        }
        let sig = signature(size, key);
        let n = self.sigs.len();
        self.held.push(self.now);
        self.sigs.push(sig);
        self.prefix.push(self.prefix[n].wrapping_mul(BASE).wrapping_add(sig));
        self.allocated.push(self.allocated[n].wrapping_add(size as u64));
        self.now = self.now.saturating_add(size as u64);
        let position = u32::try_from(n).unwrap_or(u32::MAX);
        let by_size = note(&mut self.last, sig, position);
        let by_level =
            note(&mut self.last_at_level, sig ^ signature(self.held[n] as usize, ArenaKey::NULL), position);
        by_level
            .iter()
            .chain(&by_size)
            .filter(|&&p| p != u32::MAX)
            .map(|&p| n - p as usize)
            .find(|&period| self.repeats(period))
    }

    /// Notes the free of a watched allocation of `size` bytes.
    pub(crate) fn on_free(&mut self, size: usize) {
        self.now = self.now.saturating_sub(size as u64);
    }

    /// Whether the last `2 * period` allocations are two equal halves, each ending where it began.
    fn repeats(&self, period: usize) -> bool {
        let len = self.sigs.len();
        if period < self.min_period || period.saturating_mul(2) > len {
            return false;
        }
        let (a, b) = (len - 2 * period, len - period);
        if self.hash(a, b) != self.hash(b, len) {
            return false;
        }
        // An iteration ends where it began: the bytes held before each half are the same,
        // within 1/64 of what a half allocates.
        let allocated = self.allocated[b].wrapping_sub(self.allocated[a]);
        let ends_where_it_began = self.held[a].abs_diff(self.held[b]) <= allocated / 64;
        ends_where_it_began && self.sigs[a..b] == self.sigs[b..len]
    }

    /// The hash of signatures `from..to`.
    fn hash(&self, from: usize, to: usize) -> u64 {
        self.prefix[to].wrapping_sub(self.prefix[from].wrapping_mul(power(BASE, to - from)))
    }
}

/// Notes that `key` occurs at `position`; returns its positions before (`u32::MAX`: none).
fn note(map: &mut HashMap<u64, [u32; CANDIDATES]>, key: u64, position: u32) -> [u32; CANDIDATES] {
    let earlier = map.entry(key).or_insert([u32::MAX; CANDIDATES]);
    let before = *earlier;
    earlier.rotate_right(1);
    earlier[0] = position;
    before
}

/// `base` to the `exp`, modulo 2^64.
fn power(mut base: u64, mut exp: usize) -> u64 {
    let mut out = 1u64;
    while exp > 0 {
        if exp & 1 == 1 {
            out = out.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        exp >>= 1;
    }
    out
}

/// An allocation's size and arena as one well-mixed word (splitmix64's finaliser).
fn signature(size: usize, key: ArenaKey) -> u64 {
    let mut z = (size as u64) ^ key.raw().rotate_left(29) ^ 0x5851_F42D_4C95_7F2D;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: ArenaKey = ArenaKey::NULL;

    /// Feeds allocations of `sizes`, each freed at once when `freed`; returns the period found
    /// and the allocation it was found at.
    fn feed(detector: &mut Detector, sizes: &[usize], freed: bool) -> Option<(usize, usize)> {
        for (i, &size) in sizes.iter().enumerate() {
            if let Some(period) = detector.on_alloc(size, K) {
                return Some((period, i));
            }
            if freed {
                detector.on_free(size);
            }
        }
        None
    }

    #[test]
    fn a_loop_is_found_once_it_has_run_twice() {
        let body = [4096, 512, 8192, 1024];
        let mut sizes = vec![65536, 2048];
        for _ in 0..3 {
            sizes.extend(body);
        }
        let mut detector = Detector::new(1);
        // Found at the last allocation of the second iteration: 2 + 2 * 4 allocations in.
        assert_eq!(feed(&mut detector, &sizes, true), Some((4, 9)));
    }

    #[test]
    fn layers_that_keep_what_they_allocate_are_not_the_loop() {
        // Eight identical layers, each keeping its activation: the sizes repeat every two
        // allocations, but the bytes held grow.
        let mut detector = Detector::new(1);
        for _ in 0..8 {
            assert_eq!(detector.on_alloc(4096, K), None);
            assert_eq!(detector.on_alloc(512, K), None);
            detector.on_free(512);
        }
    }

    #[test]
    fn a_loop_that_keeps_a_little_of_each_iteration_is_still_found() {
        // Each iteration keeps a 512-byte value (a loss kept for logging) and frees the rest.
        let mut detector = Detector::new(1);
        let mut found = None;
        for i in 0..4 {
            for (j, size) in [1 << 20, 1 << 18, 512].into_iter().enumerate() {
                if let Some(period) = detector.on_alloc(size, K) {
                    found = found.or(Some((period, i * 3 + j)));
                }
            }
            detector.on_free(1 << 20);
            detector.on_free(1 << 18);
        }
        assert_eq!(found, Some((3, 5)));
    }

    #[test]
    fn periods_shorter_than_the_least_are_not_proposed() {
        let mut detector = Detector::new(3);
        // A run of one size: periods 1 and 2 would hold, 3 is the first proposed.
        assert_eq!(feed(&mut detector, &[512; 8], true), Some((3, 5)));
    }

    #[test]
    fn arenas_are_part_of_an_allocation() {
        let mut detector = Detector::new(1);
        for i in 0..6 {
            let key = ArenaKey::stream(i % 2);
            assert_eq!(detector.on_alloc(512, key).filter(|&p| p == 1), None, "{i}");
            detector.on_free(512);
        }
    }

    #[test]
    fn the_hash_of_equal_runs_is_equal() {
        let mut detector = Detector::new(1);
        for size in [1, 2, 3, 1, 2, 3, 9] {
            detector.on_alloc(size * 512, K);
        }
        assert_eq!(detector.hash(0, 3), detector.hash(3, 6));
        assert_ne!(detector.hash(0, 3), detector.hash(4, 7));
        assert_eq!(power(BASE, 0), 1);
        assert_eq!(power(BASE, 3), BASE.wrapping_mul(BASE).wrapping_mul(BASE));
    }
}
