//! The process-wide [`Recorder`]'s lines against DebugPrintHook's, with and without call sites.
//! Its own test binary, with one test: the recorder sees every thread of the process, so no other
//! test may run beside it.

use gpumem_core::hooks::install;
use gpumem_core::host::Host;
use gpumem_core::SingleDeviceMemoryPool;
use gpumem_hooks::{DebugPrintHook, Recorder};
use serde_json::Value;

/// Called by each function whose frames these tests look for, so that line-tables-only debug
/// info names it without its module path, as it names nearly every function of an optimised
/// build: that debug info describes (by name alone) only the functions that calls were inlined
/// into, and this is inlined even unoptimised. It changes nothing with other debug info.
#[inline(always)]
fn inlined_call() {
    std::hint::black_box(());
}

/// Allocates 24 bytes and frees them, with DebugPrintHook installed on this thread beside
/// `recorder`; returns both outputs and the lines of this file that allocated and freed.
fn record(pool: &SingleDeviceMemoryPool<Host>, recorder: Recorder<Vec<u8>>) -> (String, String, u32, u32) {
    inlined_call();
    let guard = recorder.install();
    let hook = install(DebugPrintHook::new(Vec::new())).unwrap();
    let (a, malloc_line) = (pool.malloc_pooled(24).unwrap(), line!());
    let free_line = line!() + 1;
    drop(a);
    let debug_print = String::from_utf8(hook.into_inner().into_inner()).unwrap();
    let recorded = String::from_utf8(guard.finish().unwrap()).unwrap();
    (debug_print, recorded, malloc_line, free_line)
}

#[test]
fn recorded_lines_extend_debug_print_lines_and_name_this_files_lines() {
    let pool = SingleDeviceMemoryPool::<Host>::new(0).unwrap();

    // Without call sites: each line is DebugPrintHook's, then stream, thread and time.
    let plain = Recorder::new(Vec::new());
    assert!(!plain.records_call_sites());
    let (debug_print, recorded, _, _) = record(&pool, plain);
    let (dp, rec): (Vec<&str>, Vec<&str>) = (debug_print.lines().collect(), recorded.lines().collect());
    assert_eq!(dp.len(), 3, "alloc, malloc, free:\n{debug_print}");
    assert_eq!(rec.len(), 3, "{recorded}");
    for (d, r) in dp.iter().zip(&rec) {
        let cupy = d.strip_suffix('}').unwrap();
        assert!(r.starts_with(&format!("{cupy},\"stream\":")), "{r}\nextends\n{d}");
        assert!(!r.contains("\"site\""), "{r}");
    }

    // With call sites: the same keys, then `site`, naming this file's lines.
    let with_sites = Recorder::new(Vec::new()).with_call_sites();
    assert!(with_sites.records_call_sites());
    let (debug_print, recorded, malloc_line, free_line) = record(&pool, with_sites);
    let (dp, rec): (Vec<&str>, Vec<&str>) = (debug_print.lines().collect(), recorded.lines().collect());
    assert_eq!((dp.len(), rec.len()), (2, 2), "a cache hit: malloc and free\n{recorded}");
    let mut sites = Vec::new();
    for (d, r) in dp.iter().zip(&rec) {
        let cupy = d.strip_suffix('}').unwrap();
        assert!(r.starts_with(&format!("{cupy},\"stream\":")), "{r}\nextends\n{d}");
        // The extension keys in their order, `site` last.
        let ext = &r[cupy.len()..];
        let at = |key: &str| ext.find(&format!(",\"{key}\":")).unwrap_or_else(|| panic!("{key} in {r}"));
        assert!(
            at("stream") < at("thread") && at("thread") < at("time_ns") && at("time_ns") < at("site"),
            "{r}"
        );
        let v: Value = serde_json::from_str(r).unwrap();
        let site = v["site"].as_str().unwrap().to_owned();
        assert!(r.ends_with(&format!("{}}}", serde_json::to_string(&site).unwrap())), "{r}");
        sites.push(site);
    }
    for (site, line) in sites.iter().zip([malloc_line, free_line]) {
        assert!(is_site(site, line, "recorder::record"), "{site:?} names line {line} of recorder::record");
    }

    // A crate skipped by name is not a call site: with this test's own crate skipped, no frame
    // of the thread named with its path is the user's (with full or limited debug info, the
    // lines have no `site`). Line-tables-only debug info names some frames without their path;
    // those are told by their file, which names no crate (it is not in a registry's
    // `<package>-<version>` directory), so they can still be sites, as `skip_crate` documents.
    let (_, recorded, _, _) = record(&pool, Recorder::new(Vec::new()).skip_crate("recorder"));
    assert_eq!(recorded.lines().count(), 2);
    for line in recorded.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        if let Some(site) = v.get("site").and_then(Value::as_str) {
            let (file, function) = site.rsplit_once(':').unwrap();
            assert!(file.contains(this_file()) && !function.contains("::"), "{line}");
        }
    }
}

/// Whether `site` (`FILE:LINE:FUNCTION`) is line `line` of this file in `function`, or in
/// `function`'s last segment: debug info built with `debug = "line-tables-only"` names most
/// functions without their module path.
fn is_site(site: &str, line: u32, function: &str) -> bool {
    let name = function.rsplit("::").next().unwrap_or(function);
    [function, name].iter().any(|f| site.ends_with(&format!("{}:{line}:{f}", this_file())))
}

/// This file's name.
fn this_file() -> &'static str {
    file!().rsplit('/').next().unwrap()
}
