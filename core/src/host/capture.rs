//! Capture sequences, as CUDA has them: a capture begun on one stream (its origin) that other
//! streams join by waiting for an event recorded in it, and leave by being waited for.
//!
//! The rules follow what CUDA 13 does on an H200 (each was asked there, by
//! `scripts/cuda-capture-rules`; its answers are beside it):
//!
//! - A stream that is not capturing and waits for an event recorded in a capture joins that
//!   capture: its operations are captured into the same graph (a *fork*).
//! - The origin ends the capture. Ending it succeeds only when every operation a joined stream
//!   captured is ordered before the origin's end (the joined stream recorded an event after it
//!   and the origin, or a stream the origin waited for, waited for that event: a *join*);
//!   otherwise `end_capture` fails with `STREAM_CAPTURE_UNJOINED` and the capture is over. A
//!   stream that joined and captured nothing needs no join.
//! - `end_capture` on a joined stream fails with `STREAM_CAPTURE_UNMATCHED` and invalidates the
//!   capture; `begin_capture` on it fails with `ILLEGAL_STATE` and changes nothing.
//! - Waiting, inside a capture, for an event recorded outside any capture fails with
//!   `STREAM_CAPTURE_ISOLATION`; for an event of another capture, with `STREAM_CAPTURE_MERGE`.
//!   Both invalidate the captures involved.
//! - An event last recorded in a capture is not a point in time: querying it fails with
//!   `CAPTURED_EVENT` (and invalidates the capture), waiting for it once its capture has ended
//!   fails with `INVALID_VALUE`, until it is recorded again outside a capture.
//!
//! Ordering is tracked with vector clocks: for each stream of the capture, how many operations
//! it captured, and, for each other stream, how many of those it is ordered after. A recorded
//! event carries its stream's clock; a wait merges it. The graph replays the operations in the
//! order they were captured, which respects every such dependency.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::Result;
use crate::hal::CaptureMode;

use super::result::{err, Code};
use super::worker::Op;

/// A stream's identity within the host backend (its worker's address).
pub(crate) type StreamKey = usize;

/// For each stream of a capture, how many of its captured operations a point is ordered after.
pub(crate) type Clock = HashMap<StreamKey, u64>;

#[derive(Default)]
struct Member {
    /// Operations this stream captured.
    captured: u64,
    /// What this stream is ordered after.
    known: Clock,
}

struct State {
    #[allow(dead_code)] // the host backend treats every mode as relaxed; kept for debugging
    mode: CaptureMode,
    ops: Vec<Op>,
    /// The API name of each captured operation, for the graph's DOT text.
    names: Vec<&'static str>,
    invalidated: bool,
    ended: bool,
    members: HashMap<StreamKey, Member>,
}

/// One capture, shared by the streams taking part in it.
pub(crate) struct Sequence {
    id: u64,
    origin: StreamKey,
    state: Mutex<State>,
}

impl std::fmt::Debug for Sequence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sequence({})", self.id)
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How `end` went.
pub(crate) enum Ended {
    /// The operations, and the API name of each.
    Graph(Vec<Op>, Vec<&'static str>),
    Invalidated,
    Unjoined,
}

impl Sequence {
    /// A capture begun on `origin`.
    pub(crate) fn begin(origin: StreamKey, mode: CaptureMode) -> Arc<Sequence> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let mut members = HashMap::new();
        members.insert(origin, Member::default());
        Arc::new(Sequence {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            origin,
            state: Mutex::new(State {
                mode,
                ops: Vec::new(),
                names: Vec::new(),
                invalidated: false,
                ended: false,
                members,
            }),
        })
    }

    /// The capture's identity (what `cuStreamGetCaptureInfo` calls its id).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn is_origin(&self, stream: StreamKey) -> bool {
        self.origin == stream
    }

    pub(crate) fn is_ended(&self) -> bool {
        lock(&self.state).ended
    }

    pub(crate) fn is_invalidated(&self) -> bool {
        lock(&self.state).invalidated
    }

    pub(crate) fn invalidate(&self) {
        lock(&self.state).invalidated = true;
    }

    /// Captures `op` on `stream`, a member.
    pub(crate) fn record(&self, api: &'static str, stream: StreamKey, op: Op) -> Result<()> {
        let mut st = lock(&self.state);
        if st.invalidated {
            return Err(err(api, Code::StreamCaptureInvalidated, None));
        }
        st.ops.push(op);
        st.names.push(api);
        st.members.entry(stream).or_default().captured += 1;
        Ok(())
    }

    /// The point an event recorded now on `stream` stands for.
    pub(crate) fn clock_of(&self, api: &'static str, stream: StreamKey) -> Result<Clock> {
        let st = lock(&self.state);
        if st.invalidated {
            return Err(err(api, Code::StreamCaptureInvalidated, None));
        }
        let member = st.members.get(&stream);
        let mut clock = member.map(|m| m.known.clone()).unwrap_or_default();
        clock.insert(stream, member.map_or(0, |m| m.captured));
        Ok(clock)
    }

    /// `stream` waits for a point of this capture: it joins the capture if it was not in it, and
    /// is ordered after that point.
    pub(crate) fn wait(&self, api: &'static str, stream: StreamKey, point: &Clock) -> Result<()> {
        let mut st = lock(&self.state);
        if st.invalidated {
            return Err(err(api, Code::StreamCaptureInvalidated, None));
        }
        let member = st.members.entry(stream).or_default();
        for (&s, &n) in point {
            let known = member.known.entry(s).or_insert(0);
            *known = (*known).max(n);
        }
        Ok(())
    }

    /// Ends the capture (called on its origin): its graph, or why there is none. The capture is
    /// over either way.
    pub(crate) fn end(&self) -> Ended {
        let mut st = lock(&self.state);
        st.ended = true;
        if st.invalidated {
            return Ended::Invalidated;
        }
        let origin = st.members.get(&self.origin).map(|m| &m.known);
        let unjoined = st.members.iter().any(|(&s, m)| {
            s != self.origin && m.captured > origin.and_then(|k| k.get(&s)).copied().unwrap_or(0)
        });
        if unjoined {
            return Ended::Unjoined;
        }
        Ended::Graph(std::mem::take(&mut st.ops), std::mem::take(&mut st.names))
    }
}
