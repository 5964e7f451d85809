//! [`Recorder`]: every allocation, free and raw call of every thread, as JSON lines.

use std::cell::Cell;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gpumem_core::hooks::{self, Observation, Observed, ProcessObserver, ProcessObserverGuard};

/// Records the operations of every thread's pools, process-wide, to a writer: one JSON line per
/// raw allocation (`alloc`), pool allocation (`malloc`), free (`free`), raw block given back
/// (`raw_free`) and iteration boundary of the loop (`step`, from `Pool::step`), each written
/// after its operation.
///
/// Each line starts with the keys of CuPy's DebugPrintHook in CuPy's order, then adds the
/// arena's stream (its raw handle, or the per-thread flag, 2⁶³, and the thread's number for a
/// per-thread default stream), the thread (a number per thread, from 1 in order of its first
/// recorded operation) and the time in nanoseconds since the recorder was made:
///
/// ```text
/// {"hook":"malloc","device_id":0,"size":1000,"mem_size":1024,"mem_ptr":140086,"pmem_id":"0x100000001","stream":0,"thread":1,"time_ns":5120}
/// ```
///
/// so a recorded file is a trace that `gpumem-trace` reads (its format version 1), and a
/// DebugPrintHook file is a trace with fewer keys.
///
/// With [`with_call_sites`](Self::with_call_sites) (the `line-profile` feature) each line ends
/// with the call site too, the innermost frame of the calling thread that is not gpumem's, the
/// standard library's or the test harness's, as `"site":"file:line:function"`:
///
/// ```text
/// {"hook":"free","device_id":0,"mem_size":1024,"mem_ptr":140086,"pmem_id":"0x100000001","stream":0,"thread":1,"time_ns":9216,"site":"/app/src/model.rs:41:app::model::Model::step"}
/// ```
///
/// For a `malloc` or `alloc` line it is where the allocation was asked for; for a `free` line,
/// where the last handle was dropped; for a `raw_free` line, where the pool gave the block back
/// (the free or the `free_all_blocks` that did). A line with no such frame (a thread of a
/// library, a binary without symbols) has no `site` key.
///
/// Unlike a per-thread hook it sees every
/// thread, and it needs no installation on each: [`Recorder::install`] once.
///
/// Writing is serialised by one lock (the lines of two threads never interleave); a write error
/// is kept and returned by [`RecorderGuard::finish`], and the lines after it are dropped.
///
/// A writer that allocates through gpumem (a writer built on a gpumem pool, or one whose
/// `write` calls into code that does) would be called again, on the same thread, for its own
/// allocation while it holds the lock. Those operations are not recorded: while any recorder
/// writes on a thread, every recorder skips that thread's operations, and counts them
/// ([`RecorderGuard::skipped`]). The line being written is not affected.
pub struct Recorder<W: Write + Send + 'static> {
    state: Mutex<State<W>>,
    /// Operations not recorded because they were made by a recorder's writer.
    skipped: AtomicU64,
    start: Instant,
    /// Set by [`Recorder::with_call_sites`].
    #[cfg(feature = "line-profile")]
    sites: Option<crate::site::SiteFinder>,
}

struct State<W> {
    /// `None` once finished.
    out: Option<W>,
    error: Option<io::Error>,
    lines: u64,
}

impl<W: Write + Send + 'static> Recorder<W> {
    /// A recorder writing to `out` (wrap a file in a `BufWriter`).
    pub fn new(out: W) -> Self {
        Recorder {
            state: Mutex::new(State { out: Some(out), error: None, lines: 0 }),
            skipped: AtomicU64::new(0),
            start: Instant::now(),
            #[cfg(feature = "line-profile")]
            sites: None,
        }
    }

    /// Also writes each operation's call site (a `site` key after the others; see the type's
    /// docs).
    ///
    /// Each line then walks the calling thread's stack up to its first frame that is the user's:
    /// a few microseconds per line, against a few hundred nanoseconds without (benchmarked in
    /// `benches/recorder.rs`). Each instruction pointer is symbolised once, on the first line
    /// that walks through it; the first of all loads the program's debug info (tens to hundreds
    /// of milliseconds).
    ///
    /// The frames are told apart as [`LineProfileHook`](crate::LineProfileHook) tells them, and
    /// a site needs the same debug info in the profile that builds the program: with
    /// `debug = "full"` or `"limited"` it is `file:line:path` (`src/model.rs:41:app::model::Model::step`);
    /// with `"line-tables-only"` it has the same file and line, and most functions are named
    /// without their module path (`src/model.rs:41:step`); with `"none"` it is `??:0:path`, the
    /// path from the symbol table; a stripped binary gives no sites.
    #[cfg(feature = "line-profile")]
    #[must_use]
    pub fn with_call_sites(mut self) -> Self {
        self.sites.get_or_insert_with(crate::site::SiteFinder::default);
        self
    }

    /// With [`with_call_sites`](Self::with_call_sites): also skips the frames of crate `name`
    /// (its name as in paths: `my_arrays`), for a library of your own that allocates on its
    /// users' behalf, so that its callers are the call sites. Turns call sites on.
    ///
    /// The crate's frames are found as [`LineProfileHook::skip_crate`](crate::LineProfileHook::skip_crate)
    /// finds them: built with `debug = "line-tables-only"`, those of a crate that is not from a
    /// registry are named without their path and cannot be told, and can still be sites.
    #[cfg(feature = "line-profile")]
    #[must_use]
    pub fn skip_crate(mut self, name: impl Into<String>) -> Self {
        self.sites.get_or_insert_with(crate::site::SiteFinder::default).skip_crate(name.into());
        self
    }

    /// Whether lines carry their call site.
    #[cfg(feature = "line-profile")]
    #[must_use]
    pub fn records_call_sites(&self) -> bool {
        self.sites.is_some()
    }

    /// Whether lines carry their call site: never without the `line-profile` feature.
    #[cfg(not(feature = "line-profile"))]
    #[must_use]
    pub fn records_call_sites(&self) -> bool {
        false
    }

    /// Starts recording every thread's operations until the guard is dropped or finished.
    #[must_use = "recording stops as soon as the guard is dropped"]
    pub fn install(self) -> RecorderGuard<W> {
        let recorder = Arc::new(self);
        let guard = hooks::install_process_observer(Arc::clone(&recorder) as Arc<dyn ProcessObserver>);
        RecorderGuard { recorder, guard: Some(guard) }
    }

    fn line(&self, o: &Observation) -> String {
        let mut s = String::with_capacity(192);
        // `write!` to a String cannot fail.
        match o.event {
            Observed::Alloc(e) => {
                let _ = write!(
                    s,
                    "{{\"hook\":\"alloc\",\"device_id\":{},\"mem_size\":{},\"mem_ptr\":{}",
                    e.device_id, e.mem_size, e.mem_ptr
                );
            }
            Observed::Malloc(e) => {
                let _ = write!(
                    s,
                    "{{\"hook\":\"malloc\",\"device_id\":{},\"size\":{},\"mem_size\":{},\"mem_ptr\":{},\"pmem_id\":\"{:#x}\"",
                    e.device_id, e.size, e.mem_size, e.mem_ptr, e.pmem_id
                );
            }
            Observed::Free(e) => {
                let _ = write!(
                    s,
                    "{{\"hook\":\"free\",\"device_id\":{},\"mem_size\":{},\"mem_ptr\":{},\"pmem_id\":\"{:#x}\"",
                    e.device_id, e.mem_size, e.mem_ptr, e.pmem_id
                );
            }
            Observed::RawFree(e) => {
                let _ = write!(
                    s,
                    "{{\"hook\":\"raw_free\",\"device_id\":{},\"mem_size\":{},\"mem_ptr\":{}",
                    e.device_id, e.mem_size, e.mem_ptr
                );
            }
            Observed::Step { device_id } => {
                let _ =
                    write!(s, "{{\"hook\":\"step\",\"device_id\":{device_id},\"mem_size\":0,\"mem_ptr\":0");
            }
        }
        let time_ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let _ = write!(s, ",\"stream\":{},\"thread\":{},\"time_ns\":{time_ns}", o.arena, thread_number());
        #[cfg(feature = "line-profile")]
        if let Some(site) = self.sites.as_ref().and_then(crate::site::SiteFinder::find) {
            s.push_str(",\"site\":");
            s.push_str(&site);
        }
        s.push_str("}\n");
        s
    }
}

thread_local! {
    /// Whether a recorder's writer runs on this thread (its operations are not recorded).
    static WRITING: Cell<bool> = const { Cell::new(false) };
}

/// Marks the thread as writing for as long as it lives (also when the writer panics).
struct Writing;

impl Writing {
    /// `None` when the thread already writes (or its locals are gone): the caller is a writer's
    /// own operation.
    fn enter() -> Option<Writing> {
        // (Not `then_some(Writing)`: a `Writing` made and dropped would clear the mark.)
        WRITING.try_with(|w| if w.replace(true) { None } else { Some(Writing) }).ok().flatten()
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        let _ = WRITING.try_with(|w| w.set(false));
    }
}

impl<W: Write + Send + 'static> ProcessObserver for Recorder<W> {
    fn observe(&self, o: &Observation) {
        // An operation made by a writer, while it holds a recorder's lock on this thread: taking
        // the lock again would never return (RC03).
        let Some(_writing) = Writing::enter() else {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let line = self.line(o);
        // A poisoned lock means a writer panicked mid-line: keep recording after it.
        let mut st = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if st.error.is_some() {
            return;
        }
        let Some(out) = st.out.as_mut() else { return };
        match out.write_all(line.as_bytes()) {
            Ok(()) => st.lines += 1,
            Err(e) => st.error = Some(e),
        }
    }
}

/// The installed [`Recorder`]; dropping it stops recording (and flushes, ignoring errors).
pub struct RecorderGuard<W: Write + Send + 'static> {
    recorder: Arc<Recorder<W>>,
    guard: Option<ProcessObserverGuard>,
}

impl<W: Write + Send + 'static> RecorderGuard<W> {
    /// Lines written so far.
    #[must_use]
    pub fn lines(&self) -> u64 {
        self.recorder.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner).lines
    }

    /// Operations not recorded so far because a recorder's writer made them (see
    /// [`Recorder`]).
    #[must_use]
    pub fn skipped(&self) -> u64 {
        self.recorder.skipped.load(Ordering::Relaxed)
    }

    /// Stops recording, flushes and returns the writer.
    ///
    /// # Errors
    ///
    /// The first write error, or the flush's.
    pub fn finish(mut self) -> io::Result<W> {
        drop(self.guard.take());
        let mut st = self.recorder.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let out = st.out.take();
        if let Some(e) = st.error.take() {
            return Err(e);
        }
        let Some(mut out) = out else {
            return Err(io::Error::other("the recorder was already finished"));
        };
        drop(st);
        out.flush()?;
        Ok(out)
    }
}

impl<W: Write + Send + 'static> Drop for RecorderGuard<W> {
    fn drop(&mut self) {
        drop(self.guard.take());
        if let Ok(mut st) = self.recorder.state.lock() {
            if let Some(out) = st.out.as_mut() {
                let _ = out.flush();
            }
        }
    }
}

impl<W: Write + Send + 'static> std::fmt::Debug for RecorderGuard<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecorderGuard")
            .field("lines", &self.lines())
            .field("skipped", &self.skipped())
            .finish_non_exhaustive()
    }
}

/// This thread's number: from 1, in order of each thread's first recorded operation.
fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static NUMBER: Cell<u64> = const { Cell::new(0) };
    }
    NUMBER
        .try_with(|n| {
            if n.get() == 0 {
                n.set(NEXT.fetch_add(1, Ordering::Relaxed));
            }
            n.get()
        })
        .unwrap_or(0)
}
