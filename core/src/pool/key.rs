//! [`ArenaKey`]: which arena an allocation goes to.
//!
//! One arena per stream (CuPy's rule), with two refinements: the per-thread default stream, whose
//! raw handle is the same on every thread but which is a different stream on each, gets an arena
//! per thread; and a stream that threads allocate on at the same time (the null stream, every
//! thread's default, above all) has up to [`ArenaKey::LANES`] *lanes*, arenas that serve the same
//! stream, to which threads that keep waiting for its lock move (module `lanes`). A key's
//! [`stream_key`](ArenaKey::stream_key) names the stream an arena serves, and is what reports
//! (hook observations, snapshots) show.

/// Which arena a stream's allocations go to: the stream's raw handle, or a per-thread number for
/// the per-thread default stream (whose raw value, 2, is the same on every thread), and the lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct ArenaKey(u64);

impl ArenaKey {
    /// The null stream's arena (its lane 0).
    pub const NULL: ArenaKey = ArenaKey(0);
    /// Not yet known (a thread's state before its first allocation); never an arena.
    pub const UNSET: ArenaKey = ArenaKey(u64::MAX);
    /// How many arenas one stream can have. Threads that share one arena contend for its lock
    /// and pass its cache lines between them on every allocation: eight threads on the null
    /// stream's one arena ran at a tenth of one thread's rate (BENCHMARKS.md). A thread that
    /// keeps waiting for a stream's lock moves to another of its lanes (module `lanes`), so up
    /// to this many threads allocating on one stream at once each have an arena of their own.
    pub const LANES: u64 = 16;
    const PER_THREAD: u64 = 1 << 63;
    /// The lane is kept in bits 56 to 59, above any stream handle (a pointer or a small number).
    const LANE_SHIFT: u32 = 56;
    const HANDLE: u64 = (1 << Self::LANE_SHIFT) - 1;

    /// The arena of the stream whose raw handle is `raw` (its lane 0). The top eight bits of a
    /// handle are not part of its key (no stream handle, a pointer or a small number, has them
    /// set).
    #[must_use]
    pub fn stream(raw: usize) -> ArenaKey {
        ArenaKey(raw as u64 & Self::HANDLE)
    }

    /// The arena of host thread number `thread`'s per-thread default stream (whose raw value is
    /// the same on every thread). It has no other lanes: only its thread allocates on it.
    #[must_use]
    pub fn per_thread(thread: u64) -> ArenaKey {
        ArenaKey(Self::PER_THREAD | thread)
    }

    /// Lane `lane` (taken modulo [`LANES`](Self::LANES)) of this arena's stream; lane 0 is the
    /// stream's own key. A per-thread default stream's arena (and [`ArenaKey::UNSET`]) has one
    /// lane: the key itself.
    #[must_use]
    pub fn lane(self, lane: u64) -> ArenaKey {
        if self.0 & Self::PER_THREAD != 0 {
            return self;
        }
        ArenaKey((self.0 & Self::HANDLE) | (lane % Self::LANES) << Self::LANE_SHIFT)
    }

    /// Which lane of its stream this arena is (0 for the stream's own key).
    #[must_use]
    pub fn lane_number(self) -> u64 {
        if self.0 & Self::PER_THREAD != 0 {
            0
        } else {
            self.0 >> Self::LANE_SHIFT
        }
    }

    /// The key of the stream this arena serves: its lane 0.
    #[must_use]
    pub fn stream_key(self) -> ArenaKey {
        self.lane(0)
    }

    /// The key as a number: a stream's raw handle and the lane (bits 56 to 59), or the
    /// per-thread flag (the top bit) and a thread's number.
    #[must_use]
    pub fn raw(self) -> u64 {
        self.0
    }

    /// The key whose [`raw`](Self::raw) value is `raw`.
    pub(super) fn from_raw(raw: u64) -> ArenaKey {
        ArenaKey(raw)
    }

    /// The thread's number, for the arena of a per-thread default stream.
    #[must_use]
    pub fn per_thread_number(self) -> Option<u64> {
        (self != Self::UNSET && self.0 & Self::PER_THREAD != 0).then_some(self.0 & !Self::PER_THREAD)
    }
}

#[cfg(test)]
mod tests {
    use super::ArenaKey;

    #[test]
    fn the_lanes_of_a_stream_serve_that_stream() {
        for stream in [ArenaKey::NULL, ArenaKey::stream(1), ArenaKey::stream(0x7f00_dead_b000)] {
            assert_eq!(stream.lane(0), stream);
            assert_eq!(stream.lane(ArenaKey::LANES), stream);
            let lanes: Vec<ArenaKey> = (0..ArenaKey::LANES).map(|l| stream.lane(l)).collect();
            for (i, k) in lanes.iter().enumerate() {
                assert_eq!(k.lane_number(), i as u64);
                assert_eq!(k.stream_key(), stream);
                assert_eq!(k.per_thread_number(), None);
                assert!(lanes[..i].iter().all(|o| o != k), "lane {i} repeats");
            }
        }
        assert_ne!(ArenaKey::NULL.lane(1), ArenaKey::stream(1).lane(1));
    }

    #[test]
    fn a_per_thread_stream_has_one_lane_and_handles_keep_their_low_bits() {
        let k = ArenaKey::per_thread(3);
        assert_eq!((k.lane(5), k.lane_number(), k.stream_key()), (k, 0, k));
        assert_eq!(ArenaKey::UNSET.stream_key(), ArenaKey::UNSET);
        assert_eq!(ArenaKey::UNSET.per_thread_number(), None);
        // A handle with high bits set is not taken for a lane.
        assert_eq!(ArenaKey::stream((1usize << 57) | 5), ArenaKey::stream(5));
    }
}
