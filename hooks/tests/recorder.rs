//! The process-wide [`Recorder`]'s lines against DebugPrintHook's, with and without call sites.
//! Its own test binary, with one test: the recorder sees every thread of the process, so no other
//! test may run beside it.

use gpumem_core::hooks::install;
use gpumem_core::host::Host;
use gpumem_core::SingleDeviceMemoryPool;
use gpumem_hooks::{DebugPrintHook, Recorder};
use serde_json::Value;

/// Allocates 24 bytes and frees them, with DebugPrintHook installed on this thread beside
/// `recorder`; returns both outputs and the lines of this file that allocated and freed.
fn record(pool: &SingleDeviceMemoryPool<Host>, recorder: Recorder<Vec<u8>>) -> (String, String, u32, u32) {
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
    let this_file = file!().rsplit('/').next().unwrap();
    for (site, line) in sites.iter().zip([malloc_line, free_line]) {
        let want = format!("{this_file}:{line}:recorder::record");
        assert!(site.contains(&want), "{site:?} names {want:?}");
    }

    // A crate skipped by name is not a call site: with this test's own crate skipped, no frame
    // of the thread is the user's, and the lines have no `site`.
    let (_, recorded, _, _) = record(&pool, Recorder::new(Vec::new()).skip_crate("recorder"));
    assert_eq!(recorded.lines().count(), 2);
    assert!(!recorded.contains("\"site\""), "{recorded}");
}
