//! LineProfileHook against the host backend's pool: CuPy's `test_print_report`, `max_depth`,
//! nesting, and failed allocations.
//!
//! These need the test binary's debug info (the test profile has it) and must live outside
//! gpumem-hooks' own unit tests: frames of gpumem's crates are never reported. They pass with any
//! debug info that has line tables: `.ci/run` also runs them built with
//! `debug = "line-tables-only"`, whose debug info names most functions without their module path.

use gpumem_core::hooks::install;
use gpumem_core::host::Host;
use gpumem_core::{BaseMemory, DeviceId, Error, FnAllocator, MemoryHook, MemoryPool, SingleDeviceMemoryPool};
use gpumem_hooks::{LineProfileHook, ProfileEntry};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Called by each function whose frames these tests look for, so that line-tables-only debug
/// info names it without its module path, as it names nearly every function of an optimised
/// build: that debug info describes (by name alone) only the functions that calls were inlined
/// into, and this is inlined even unoptimised. It changes nothing with other debug info.
#[inline(always)]
fn inlined_call() {
    std::hint::black_box(());
}

/// Whether a frame's `function` is `path`, or `path`'s last segment: debug info built with
/// `debug = "line-tables-only"` names most functions without their module path.
fn is_function(function: &str, path: &str) -> bool {
    function == path || path.rsplit_once("::").is_some_and(|(_, name)| function == name)
}

fn report(hook: &LineProfileHook) -> String {
    let mut out = Vec::new();
    hook.print_report(&mut out).expect("writing to a Vec");
    String::from_utf8(out).expect("UTF-8")
}

/// Checks every line below the root is `INDENT FILE:LINE:FUNCTION (SIZE, SIZE)` with an even
/// indent of at least 2 that grows by at most one level from one line to the next.
fn assert_layout(report: &str) {
    let mut lines = report.lines();
    assert!(lines.next().is_some_and(|l| l.starts_with("_root (")));
    let mut previous = 0;
    for line in lines {
        let indent = line.len() - line.trim_start_matches(' ').len();
        assert!(indent >= 2 && indent % 2 == 0 && indent <= previous + 2, "{line}");
        previous = indent;
        let (site, sizes) = line.trim_start().rsplit_once(" (").expect("sizes");
        let (used, acquired) = sizes.strip_suffix(')').and_then(|s| s.split_once(", ")).expect("two sizes");
        for s in [used, acquired] {
            assert!(s.ends_with('B') && s.contains('.'), "{line}");
        }
        let mut parts = site.splitn(3, ':');
        let (file, lineno, function) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
        assert!(!file.is_empty() && lineno.parse::<u32>().is_ok() && !function.is_empty(), "{line}");
        assert!(!function.starts_with("gpumem") && !function.starts_with("std::"), "{line}");
    }
    assert!(report.ends_with('\n'));
}

#[test]
fn cupy_test_print_report() -> TestResult {
    inlined_call();
    let pool = MemoryPool::<Host>::new();
    drop(pool.malloc(1000)?);
    let hook = install(LineProfileHook::new(0))?;
    let (hit, hit_line) = (pool.malloc(1000)?, line!());
    let (miss, miss_line) = (pool.malloc(2000)?, line!());
    drop((hit, miss));
    let hook = hook.into_inner();
    let text = report(&hook);

    assert!(text.starts_with("_root (3.00KB, 2.00KB)\n"), "{text}");
    assert_layout(&text);
    // The line of this file's call at `line`, with `sizes`.
    let find = |line: u32, sizes: &str| {
        text.lines()
            .find(|l| {
                let Some(site) = l.trim_start().strip_suffix(sizes) else { return false };
                let Some((file, function)) = site.trim_end().split_once(&format!(":{line}:")) else {
                    return false;
                };
                file.ends_with(file!()) && is_function(function, "line_profile::cupy_test_print_report")
            })
            .unwrap_or_else(|| panic!("no call at line {line} with {sizes} in\n{text}"))
    };
    let (a, b) = (find(hit_line, "(1.00KB, 0.00B)"), find(miss_line, "(2.00KB, 2.00KB)"));
    // The two calls are siblings, in the order they were made.
    let indent = |l: &str| l.len() - l.trim_start().len();
    assert_eq!(indent(a), indent(b));
    assert!(text.find(a) < text.find(b));
    assert_eq!((hook.used_bytes(), hook.acquired_bytes()), (3072, 2048));
    Ok(())
}

#[test]
fn max_depth_one_prints_only_the_root() -> TestResult {
    let pool = MemoryPool::<Host>::new();
    drop(pool.malloc(1000)?);
    let hook = install(LineProfileHook::new(1))?;
    drop(pool.malloc(1000)?);
    drop(pool.malloc(2000)?);
    assert_eq!(report(&hook), "_root (3.00KB, 2.00KB)\n");
    assert!(hook.entries().is_empty());
    Ok(())
}

#[test]
fn max_depth_two_prints_one_level() -> TestResult {
    let pool = MemoryPool::<Host>::new();
    let hook = install(LineProfileHook::new(2))?;
    drop(pool.malloc(1000)?);
    drop(pool.malloc(2000)?);
    let text = report(&hook);
    assert_layout(&text);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "_root (3.00KB, 3.00KB)");
    assert!(lines.len() >= 2, "{text}");
    for line in &lines[1..] {
        assert!(line.starts_with("  ") && !line.starts_with("   "), "{text}");
    }
    // Three levels keep the call sites' parents and the call sites.
    let deep = install(LineProfileHook::new(3));
    assert!(deep.is_err(), "one LineProfileHook per thread");
    drop(hook);
    let hook = install(LineProfileHook::new(3))?;
    drop(pool.malloc(1000)?);
    assert!(hook.entries().iter().all(|e| e.depth <= 2));
    assert!(hook.entries().iter().any(|e| e.depth == 2) || hook.entries().len() == 1);
    Ok(())
}

#[inline(never)]
fn allocate_for(pool: &MemoryPool<Host>, size: usize) -> gpumem_core::Result<()> {
    inlined_call();
    let (p, _) = (pool.malloc(size)?, line!());
    drop(p);
    Ok(())
}

#[test]
fn a_helper_called_from_two_places_is_two_nodes() -> TestResult {
    inlined_call();
    let pool = MemoryPool::<Host>::new();
    let hook = install(LineProfileHook::default())?;
    let first = line!() + 1;
    allocate_for(&pool, 512)?;
    let second = line!() + 1;
    allocate_for(&pool, 1024)?;
    let hook = hook.into_inner();
    assert_layout(&report(&hook));

    let entries = hook.entries();
    let caller = |line: u32| -> &ProfileEntry {
        entries
            .iter()
            .find(|e| {
                e.frame.line == line
                    && is_function(
                        &e.frame.function,
                        "line_profile::a_helper_called_from_two_places_is_two_nodes",
                    )
            })
            .unwrap_or_else(|| panic!("no caller at line {line}: {entries:#?}"))
    };
    let helpers: Vec<&ProfileEntry> =
        entries.iter().filter(|e| is_function(&e.frame.function, "line_profile::allocate_for")).collect();
    assert_eq!(helpers.len(), 2, "{entries:#?}");
    assert_eq!(helpers[0].frame, helpers[1].frame, "the same line of the helper");
    let (a, b) = (caller(first), caller(second));
    assert_eq!((a.used_bytes, a.acquired_bytes), (512, 512));
    assert_eq!((b.used_bytes, b.acquired_bytes), (1024, 1024));
    assert_eq!((helpers[0].used_bytes, helpers[1].used_bytes), (512, 1024));
    assert_eq!(helpers[0].depth, a.depth + 1);
    assert_eq!(helpers[1].depth, b.depth + 1);
    assert!(a.frame.file.ends_with("tests/line_profile.rs"), "{}", a.frame.file);
    Ok(())
}

#[test]
fn skipped_crates_are_not_reported() -> TestResult {
    inlined_call();
    let pool = MemoryPool::<Host>::new();
    let hook = install(LineProfileHook::new(0).skip_crate("line_profile"))?;
    drop(pool.malloc(1)?);
    let hook = hook.into_inner();
    assert!(report(&hook).starts_with("_root (512.00B, 512.00B)\n"));
    // Every frame of this test is this crate's. Those named with their path (with full or
    // limited debug info, all of them) are skipped. Line-tables-only debug info names some
    // without it; those are told by their file, which names no crate (it is not in a registry's
    // `<package>-<version>` directory), so they stay, as `skip_crate` documents.
    for entry in hook.entries() {
        let frame = &entry.frame;
        assert!(!frame.function.starts_with("line_profile::"), "{frame} is of a skipped crate");
        assert!(frame.file.ends_with(file!()) && !frame.function.contains("::"), "{frame}");
    }
    Ok(())
}

#[test]
fn failed_attempts_count_as_in_cupy() -> TestResult {
    let oom = FnAllocator(|_: DeviceId, size: usize| -> gpumem_core::Result<Box<dyn BaseMemory<Host>>> {
        Err(Error::OutOfMemory { size, total: None })
    });
    let pool = SingleDeviceMemoryPool::<Host, _>::with_allocator(0, oom)?;
    let hook = install(LineProfileHook::new(0))?;
    assert!(pool.malloc(100).unwrap_err().is_out_of_memory());
    // Recorded before each operation: one malloc, three raw attempts.
    assert_eq!((hook.used_bytes(), hook.acquired_bytes()), (512, 1536));
    assert!(report(&hook).starts_with("_root (512.00B, 1.50KB)\n"));
    Ok(())
}

#[test]
fn name_and_defaults() {
    let hook = LineProfileHook::default();
    assert_eq!(hook.name(), "LineProfileHook");
    assert_eq!(hook.max_depth(), 0);
    assert_eq!(report(&hook), "_root (0.00B, 0.00B)\n");
    assert_eq!(format!("{hook:?}"), "LineProfileHook { max_depth: 0, used_bytes: 0, acquired_bytes: 0, .. }");
}
