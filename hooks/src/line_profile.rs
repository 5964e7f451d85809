//! [`LineProfileHook`]: bytes asked for and bytes taken from the device, per call site.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::io::{self, Write};

use gpumem_core::hooks::Callbacks;
use gpumem_core::{AllocEvent, HookResult, MallocEvent, MemoryHook};

use crate::stack::{StackCapture, StackFrame};

/// A memory hook that attributes memory to the code that asked for it, call site by call site,
/// along the whole call stack (CuPy's `cupy.cuda.memory_hooks.LineProfileHook`).
///
/// Two amounts are kept for every call site, as in CuPy:
///
/// - **used**: bytes asked of the pool (`malloc_preprocess`, the size rounded to the pool's
///   unit), whether the pool served them from its cache or not;
/// - **acquired**: bytes the pool asked of the device (`alloc_preprocess`, its cache misses).
///
/// Both are recorded *before* the operation, so failed attempts count too. Each amount is added
/// to the root and to every frame of the user's call stack, so a frame's figures include those of
/// everything it called. [`print_report`](Self::print_report) prints the tree:
///
/// ```text
/// _root (3.00KB, 2.00KB)
///   src/main.rs:12:my_app::main (3.00KB, 2.00KB)
///     src/model.rs:40:my_app::model::Model::new (1.00KB, 0.00B)
///     src/model.rs:41:my_app::model::Model::new (2.00KB, 2.00KB)
/// ```
///
/// # How call sites are found, and what it costs
///
/// CuPy reads the Python stack (`traceback.extract_stack()`) and drops its own frames. Here
/// each event walks the native call stack and symbolises the return addresses from the
/// program's debug info, keeping only the user's frames: gpumem's own crates, the standard
/// library, the test harness, the unwinder and foreign code (libc's thread start) are dropped.
/// A frame is keyed by `(parent, file, line, function)`, so two calls in one function are two
/// nodes; children keep the order they were first seen in. Use
/// [`skip_crate`](Self::skip_crate) to hide a library of your own that wraps the pool, as CuPy's
/// own Cython frames are hidden.
///
/// A frame's crate is the first segment of its function's path. Where the debug info names the
/// function without its path (`new` for `my_app::model::Model::new`, see below), the frame's
/// source file decides instead, since the file is all such debug info says of a function's
/// origin: files of the standard library (`/rustc/...`), of gpumem's crates (their `src`
/// directories) and of skipped crates from a registry are not the user's; other Rust files are,
/// the tests of gpumem's own crates included; files of other languages and frames without a file
/// are foreign. This reads the absolute file names the compiler writes: a build that also
/// remaps source paths (`--remap-path-prefix`) can see gpumem's own frames reported where they
/// are named without a path.
///
/// This is a profiling tool:
///
/// - every `malloc` (and every cache miss) walks the stack: a few microseconds, against the
///   pool's tens of nanoseconds (about 4 µs for a stack of some twenty frames on a 2-core VM,
///   `benches/line_profile.rs`);
/// - the first event symbolises: loading the debug info takes tens to hundreds of milliseconds;
///   each new return address is then symbolised once (microseconds) and cached;
/// - file and line numbers need debug info in the profile that builds the program:
///   - `debug = "full"` (`true`, `2`) and `debug = "limited"` (`1`) give every frame its file,
///     line and function path, as in the report above;
///   - `debug = "line-tables-only"` gives file and line too, and the same call sites, but names
///     most functions without their module path (every inlined call, and every function that
///     calls were inlined into: nearly all of an optimised build): `src/model.rs:40:new`. Only
///     the functions this debug info says nothing of keep their path, named from the symbol
///     table;
///   - `debug = "none"` (`false`, `0`) gives no file or line: frames keep their function's path
///     (from the symbol table), with file `??` and line 0, and calls from one function merge
///     into one node; a function inlined into its caller has no frame of its own (one inlined
///     into the standard library disappears with it). A stripped binary has no symbols either:
///     its frames are dropped, and the report has the root alone.
///
///   With file and line, inlined calls are recovered as frames of their own.
///
/// `max_depth` limits the tree as in CuPy: `max_depth = N` keeps the `N - 1` outermost levels of
/// frames below the root (1: the root only); 0 keeps every level. With `max_depth = 1` no stack
/// is walked at all.
///
/// # Example
///
/// ```
/// use gpumem_core::hooks::install;
/// use gpumem_core::host::Host;
/// use gpumem_core::MemoryPool;
/// use gpumem_hooks::LineProfileHook;
///
/// let pool = MemoryPool::<Host>::new();
/// let profile = install(LineProfileHook::new(0))?;
/// let a = pool.malloc(1000)?;
/// let b = pool.malloc(2000)?;
/// let mut report = Vec::new();
/// profile.print_report(&mut report)?;
/// let report = String::from_utf8(report).unwrap();
/// assert!(report.starts_with("_root (3.00KB, 3.00KB)\n"));
/// # drop((a, b));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct LineProfileHook {
    max_depth: usize,
    state: RefCell<State>,
}

#[derive(Default)]
struct State {
    stack: StackCapture,
    tree: Tree,
    /// Scratch: the current event's frames, outermost first.
    frames: Vec<u32>,
}

/// Node 0 is the root.
struct Tree {
    nodes: Vec<Node>,
    /// `(parent node, frame)` -> node.
    index: HashMap<(u32, u32), u32>,
}

struct Node {
    /// The frame's id; unused for the root.
    frame: u32,
    used: u64,
    acquired: u64,
    children: Vec<u32>,
}

impl Default for Tree {
    fn default() -> Self {
        Tree {
            nodes: vec![Node { frame: u32::MAX, used: 0, acquired: 0, children: Vec::new() }],
            index: HashMap::new(),
        }
    }
}

impl Tree {
    /// Adds the amounts to the root and along `frames` (outermost first), CuPy's
    /// `_create_frame_tree`.
    fn add(&mut self, frames: &[u32], max_depth: usize, used: u64, acquired: u64) {
        let Tree { nodes, index } = self;
        let root = &mut nodes[0];
        root.used = root.used.saturating_add(used);
        root.acquired = root.acquired.saturating_add(acquired);
        let mut parent = 0u32;
        for (depth, &frame) in frames.iter().enumerate() {
            if 0 < max_depth && max_depth <= depth + 1 {
                break;
            }
            let node = *index.entry((parent, frame)).or_insert_with(|| {
                let id = u32::try_from(nodes.len()).expect("fewer than 2^32 call sites");
                nodes.push(Node { frame, used: 0, acquired: 0, children: Vec::new() });
                nodes[parent as usize].children.push(id);
                id
            });
            let n = &mut nodes[node as usize];
            n.used = n.used.saturating_add(used);
            n.acquired = n.acquired.saturating_add(acquired);
            parent = node;
        }
    }

    /// `(node, depth)` depth-first from the root's children, children in insertion order.
    fn walk(&self) -> Vec<(u32, usize)> {
        let mut out = Vec::with_capacity(self.nodes.len() - 1);
        let mut todo: Vec<(u32, usize)> = self.nodes[0].children.iter().rev().map(|&c| (c, 1)).collect();
        while let Some((node, depth)) = todo.pop() {
            out.push((node, depth));
            todo.extend(self.nodes[node as usize].children.iter().rev().map(|&c| (c, depth + 1)));
        }
        out
    }
}

/// One line of a [`LineProfileHook`]'s report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileEntry {
    /// The depth below the root: 1 for the outermost frames.
    pub depth: usize,
    /// The call site.
    pub frame: StackFrame,
    /// Bytes asked of the pool from here and below (rounded sizes).
    pub used_bytes: u64,
    /// Bytes the pool asked of the device for the allocations made from here and below.
    pub acquired_bytes: u64,
}

impl LineProfileHook {
    /// A profile keeping `max_depth - 1` levels of frames below the root; 0 keeps all
    /// (CuPy's `LineProfileHook(max_depth=0)`).
    #[must_use]
    pub fn new(max_depth: usize) -> Self {
        LineProfileHook { max_depth, state: RefCell::new(State::default()) }
    }

    /// Also drops the frames of crate `name` (its name as in paths: `my_arrays`, not
    /// `my-arrays`), for a library of your own that allocates from the pool on its users'
    /// behalf: its callers are then the call sites.
    ///
    /// A frame is the crate's when its function's path starts with `name`, or when its file is
    /// in the crate's package directory from a registry (`.../my-arrays-0.3.1/src/...`). Debug
    /// info built with `debug = "line-tables-only"` names most functions without their path, and
    /// then cannot tell a frame of a crate that is not from a registry (a path or git
    /// dependency, a member of your workspace): its frames stay in the report. Building that
    /// crate with more debug info gives its functions their paths back
    /// (`[profile.release.package.my-arrays] debug = "limited"`), except where they were inlined
    /// into a crate built with line tables only.
    #[must_use]
    pub fn skip_crate(self, name: impl Into<String>) -> Self {
        self.state.borrow_mut().stack.skip_crate(name.into());
        self
    }

    /// The `max_depth` the hook was made with.
    #[must_use]
    pub fn max_depth(&self) -> usize {
        self.max_depth
    }

    /// Total bytes asked of the pool while the hook was installed (the root's first figure).
    #[must_use]
    pub fn used_bytes(&self) -> u64 {
        self.state.try_borrow().map_or(0, |s| s.tree.nodes[0].used)
    }

    /// Total bytes the pool asked of the device while the hook was installed (the root's second
    /// figure).
    #[must_use]
    pub fn acquired_bytes(&self) -> u64 {
        self.state.try_borrow().map_or(0, |s| s.tree.nodes[0].acquired)
    }

    /// The report's lines below the root, depth first, children in the order they were first
    /// seen.
    #[must_use]
    pub fn entries(&self) -> Vec<ProfileEntry> {
        let Ok(state) = self.state.try_borrow() else { return Vec::new() };
        state
            .tree
            .walk()
            .into_iter()
            .map(|(id, depth)| {
                let node = &state.tree.nodes[id as usize];
                ProfileEntry {
                    depth,
                    frame: state.stack.frame(node.frame).clone(),
                    used_bytes: node.used,
                    acquired_bytes: node.acquired,
                }
            })
            .collect()
    }

    /// Writes the report in CuPy's layout, then flushes `file`: first `_root (USED, ACQUIRED)`,
    /// then each call site depth first as `file:line:function (USED, ACQUIRED)`, indented by two
    /// spaces per level, sizes as [`humanized_size`] prints them. Pass `&mut std::io::stdout()`
    /// for CuPy's default.
    ///
    /// # Errors
    ///
    /// The writer's error.
    pub fn print_report<W: Write + ?Sized>(&self, file: &mut W) -> io::Result<()> {
        let state = self.state.try_borrow().map_err(|_| io::Error::other("the profile is being recorded"))?;
        let root = &state.tree.nodes[0];
        writeln!(
            file,
            "_root ({}, {})",
            humanized_size(root.used.into()),
            humanized_size(root.acquired.into())
        )?;
        for (id, depth) in state.tree.walk() {
            let node = &state.tree.nodes[id as usize];
            let frame = state.stack.frame(node.frame);
            writeln!(
                file,
                "{:indent$}{}:{}:{} ({}, {})",
                "",
                frame.file,
                frame.line,
                frame.function,
                humanized_size(node.used.into()),
                humanized_size(node.acquired.into()),
                indent = depth * 2
            )?;
        }
        file.flush()
    }

    fn record(&self, used: usize, acquired: usize) -> HookResult {
        let mut state = self
            .state
            .try_borrow_mut()
            .map_err(|_| "the profile is already being recorded (re-entrant call)")?;
        let State { stack, tree, frames } = &mut *state;
        if self.max_depth == 1 {
            frames.clear();
        } else {
            stack.capture(frames);
        }
        tree.add(frames, self.max_depth, used as u64, acquired as u64);
        Ok(())
    }
}

impl Default for LineProfileHook {
    /// `LineProfileHook::new(0)`: every level.
    fn default() -> Self {
        Self::new(0)
    }
}

impl fmt::Debug for LineProfileHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LineProfileHook")
            .field("max_depth", &self.max_depth)
            .field("used_bytes", &self.used_bytes())
            .field("acquired_bytes", &self.acquired_bytes())
            .finish_non_exhaustive()
    }
}

impl MemoryHook for LineProfileHook {
    fn name(&self) -> &str {
        "LineProfileHook"
    }

    /// `alloc_preprocess` and `malloc_preprocess` only.
    fn callbacks(&self) -> Callbacks {
        Callbacks::ALLOC_PREPROCESS | Callbacks::MALLOC_PREPROCESS
    }

    /// Adds `mem_size` to the acquired bytes of the root and of each frame of the call stack.
    fn alloc_preprocess(&self, e: &AllocEvent) -> HookResult {
        self.record(0, e.mem_size)
    }

    /// Adds `mem_size` to the used bytes of the root and of each frame of the call stack.
    fn malloc_preprocess(&self, e: &MallocEvent) -> HookResult {
        self.record(e.mem_size, 0)
    }
}

/// A byte count as CuPy's `LineProfileHook` prints it: `'%3.2f%sB'`, dividing by 1024 while the
/// size is 1024 or more, over the units `''`, `K`, `M`, `G`, `T`, `P`, `E`, then `Z`.
///
/// ```
/// use gpumem_hooks::humanized_size;
///
/// assert_eq!(humanized_size(0), "0.00B");
/// assert_eq!(humanized_size(1000), "1000.00B");
/// assert_eq!(humanized_size(1024), "1.00KB");
/// assert_eq!(humanized_size(3 << 30), "3.00GB");
/// ```
#[must_use]
pub fn humanized_size(size: u128) -> String {
    let mut size = size as f64;
    for unit in ["", "K", "M", "G", "T", "P", "E"] {
        if size < 1024.0 {
            return format!("{size:3.2}{unit}B");
        }
        size /= 1024.0;
    }
    format!("{size:.2}ZB")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn humanized_sizes_match_python() {
        // Expected values printed by CPython 3.11 running CuPy's `_humanized_size`.
        for (size, text) in [
            (0u128, "0.00B"),
            (1, "1.00B"),
            (512, "512.00B"),
            (1000, "1000.00B"),
            (1023, "1023.00B"),
            (1024, "1.00KB"),
            (1025, "1.00KB"),
            (1152, "1.12KB"),
            (1408, "1.38KB"),
            (1536, "1.50KB"),
            (2048, "2.00KB"),
            (3072, "3.00KB"),
            (1_048_575, "1024.00KB"),
            (1 << 20, "1.00MB"),
            (3 << 30, "3.00GB"),
            (1 << 40, "1.00TB"),
            (1 << 50, "1.00PB"),
            (1 << 60, "1.00EB"),
            (u128::from(u64::MAX), "16.00EB"),
            (1 << 70, "1.00ZB"),
            (1 << 80, "1024.00ZB"),
            (1 << 90, "1048576.00ZB"),
        ] {
            assert_eq!(humanized_size(size), text, "{size}");
        }
    }

    #[test]
    fn tree_follows_cupys_max_depth_rule() {
        // Frames 10 -> 11 -> 12 (outermost first); a second stack shares 10 and 11.
        for (max_depth, nodes) in [(0, 5), (1, 1), (2, 2), (3, 3), (4, 5), (9, 5)] {
            let mut t = Tree::default();
            t.add(&[10, 11, 12], max_depth, 512, 0);
            t.add(&[10, 11, 13], max_depth, 1024, 1024);
            assert_eq!(t.nodes.len(), nodes, "max_depth {max_depth}");
            assert_eq!((t.nodes[0].used, t.nodes[0].acquired), (1536, 1024));
            for node in &t.nodes[1..] {
                assert!(node.used >= 512);
            }
        }
    }

    #[test]
    fn tree_keeps_insertion_order_and_sums_along_the_path() {
        let mut t = Tree::default();
        t.add(&[1, 3], 0, 100, 0);
        t.add(&[1, 2], 0, 10, 10);
        t.add(&[1, 3], 0, 1, 1);
        t.add(&[4], 0, 5, 0);
        let walked: Vec<(u32, usize, u64, u64)> = t
            .walk()
            .into_iter()
            .map(|(id, d)| {
                let n = &t.nodes[id as usize];
                (n.frame, d, n.used, n.acquired)
            })
            .collect();
        assert_eq!(walked, [(1, 1, 111, 11), (3, 2, 101, 1), (2, 2, 10, 10), (4, 1, 5, 0)]);
        // The same frame under two parents is two nodes.
        t.add(&[4, 1], 0, 7, 0);
        assert_eq!(t.nodes.len(), 6);
    }
}
