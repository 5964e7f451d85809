//! DebugPrintHook against the host backend's pool: CuPy's `test_print`, the seed document's
//! example, the flush option and writer failures.

use std::io::{self, Write};

use gpumem_core::hooks::install;
use gpumem_core::host::Host;
use gpumem_core::{BaseMemory, DeviceId, Error, FnAllocator, MemoryPool, SingleDeviceMemoryPool};
use gpumem_hooks::DebugPrintHook;
use serde_json::Value;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const ALLOC_KEYS: &[&str] = &["hook", "device_id", "mem_size", "mem_ptr"];
const MALLOC_KEYS: &[&str] = &["hook", "device_id", "size", "mem_size", "mem_ptr", "pmem_id"];
const FREE_KEYS: &[&str] = &["hook", "device_id", "mem_size", "mem_ptr", "pmem_id"];

/// Parses one line, checks it has exactly `keys` in this order in the raw text, and that it
/// is byte for byte what CuPy's format string gives for the parsed values.
fn parse(line: &str, keys: &[&str]) -> Value {
    let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    let obj = v.as_object().expect("an object");
    assert_eq!(obj.len(), keys.len(), "{line}");
    let mut at = 0;
    for key in keys {
        let quoted = format!("\"{key}\":");
        let pos = line[at..].find(&quoted).unwrap_or_else(|| panic!("{key} missing or out of order: {line}"));
        at += pos + quoted.len();
    }
    let num = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} is not an integer: {line}"));
    let expected = match v["hook"].as_str().expect("hook is a string") {
        "alloc" => format!(
            r#"{{"hook":"alloc","device_id":{},"mem_size":{},"mem_ptr":{}}}"#,
            num("device_id"),
            num("mem_size"),
            num("mem_ptr")
        ),
        "malloc" => format!(
            r#"{{"hook":"malloc","device_id":{},"size":{},"mem_size":{},"mem_ptr":{},"pmem_id":"{}"}}"#,
            num("device_id"),
            num("size"),
            num("mem_size"),
            num("mem_ptr"),
            v["pmem_id"].as_str().expect("pmem_id is a string")
        ),
        "free" => format!(
            r#"{{"hook":"free","device_id":{},"mem_size":{},"mem_ptr":{},"pmem_id":"{}"}}"#,
            num("device_id"),
            num("mem_size"),
            num("mem_ptr"),
            v["pmem_id"].as_str().expect("pmem_id is a string")
        ),
        other => panic!("unknown hook {other}"),
    };
    assert_eq!(line, expected);
    v
}

fn hex(id: u64) -> String {
    format!("{id:#x}")
}

#[test]
fn cupy_test_print_five_lines() -> TestResult {
    let pool = MemoryPool::<Host>::new();
    let hook = install(DebugPrintHook::new(Vec::new()))?;
    let p1 = pool.malloc_pooled(1)?;
    let (ptr1, pmem1) = (p1.ptr(), p1.pmem_id());
    drop(p1);
    let p2 = pool.malloc_pooled(1)?;
    let (ptr2, pmem2) = (p2.ptr(), p2.pmem_id());
    drop(p2);
    let out = String::from_utf8(hook.into_inner().into_inner())?;

    assert!(out.ends_with('\n'));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 5, "{out}");
    let alloc = parse(lines[0], ALLOC_KEYS);
    let malloc1 = parse(lines[1], MALLOC_KEYS);
    let free1 = parse(lines[2], FREE_KEYS);
    let malloc2 = parse(lines[3], MALLOC_KEYS);
    let free2 = parse(lines[4], FREE_KEYS);
    let hooks: Vec<&str> =
        [&alloc, &malloc1, &free1, &malloc2, &free2].iter().map(|v| v["hook"].as_str().unwrap()).collect();
    assert_eq!(hooks, ["alloc", "malloc", "free", "malloc", "free"]);
    for v in [&alloc, &malloc1, &free1, &malloc2, &free2] {
        assert_eq!(v["mem_size"], 512);
        assert_eq!(v["device_id"], 0);
    }
    assert_eq!(malloc1["size"], 1);
    assert_eq!(alloc["mem_ptr"], ptr1 as u64);
    assert_eq!(malloc1["mem_ptr"], ptr1 as u64);
    assert_eq!(free1["mem_ptr"], ptr1 as u64);
    assert_eq!(malloc2["mem_ptr"], ptr2 as u64);
    assert_eq!(free2["mem_ptr"], ptr2 as u64);
    assert_eq!(ptr1, ptr2, "the second malloc reuses the cached block");
    assert_eq!(malloc1["pmem_id"], hex(pmem1));
    assert_eq!(free1["pmem_id"], hex(pmem1));
    assert_eq!(malloc2["pmem_id"], hex(pmem2));
    assert_eq!(free2["pmem_id"], hex(pmem2));
    Ok(())
}

#[test]
fn lines_name_the_memory_pointer() -> TestResult {
    let pool = MemoryPool::<Host>::new();
    let hook = install(DebugPrintHook::new(Vec::new()))?;
    let a = pool.malloc(1)?;
    let b = pool.malloc(600)?;
    let (pa, pb) = (a.ptr(), b.ptr());
    drop(b);
    drop(a);
    let out = String::from_utf8(hook.into_inner().into_inner())?;
    let events: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let of = |hook: &str| -> Vec<&Value> { events.iter().filter(|v| v["hook"] == hook).collect() };
    let (allocs, mallocs, frees) = (of("alloc"), of("malloc"), of("free"));
    assert_eq!((allocs.len(), mallocs.len(), frees.len()), (2, 2, 2));
    assert_eq!(mallocs[0]["mem_ptr"], pa as u64);
    assert_eq!(mallocs[1]["mem_ptr"], pb as u64);
    assert_eq!((mallocs[1]["size"].as_u64(), mallocs[1]["mem_size"].as_u64()), (Some(600), Some(1024)));
    // Freed in reverse order; each free repeats its malloc's pointer and id.
    assert_eq!(frees[0]["mem_ptr"], pb as u64);
    assert_eq!(frees[0]["pmem_id"], mallocs[1]["pmem_id"]);
    assert_eq!(frees[1]["pmem_id"], mallocs[0]["pmem_id"]);
    assert_ne!(mallocs[0]["pmem_id"], mallocs[1]["pmem_id"]);
    Ok(())
}

#[test]
fn seed_example_three_lines() -> TestResult {
    // `cupy.array([1, 2, 3])`: 3 x int64.
    let pool = SingleDeviceMemoryPool::<Host>::new(0)?;
    let hook = install(DebugPrintHook::new(Vec::new()))?;
    let x = pool.malloc(3 * std::mem::size_of::<i64>())?;
    let ptr = x.ptr() as u64;
    drop(x);
    let out = String::from_utf8(hook.into_inner().into_inner())?;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    let alloc = parse(lines[0], ALLOC_KEYS);
    let malloc = parse(lines[1], MALLOC_KEYS);
    let free = parse(lines[2], FREE_KEYS);
    assert_eq!(lines[0], format!(r#"{{"hook":"alloc","device_id":0,"mem_size":512,"mem_ptr":{ptr}}}"#));
    assert_eq!(
        (&malloc["hook"], &malloc["size"], &malloc["mem_size"], &malloc["mem_ptr"]),
        (&"malloc".into(), &24.into(), &512.into(), &ptr.into())
    );
    assert_eq!(
        (&free["hook"], &free["mem_size"], &free["mem_ptr"]),
        (&"free".into(), &512.into(), &ptr.into())
    );
    assert_eq!(alloc["mem_ptr"], ptr);
    let id = malloc["pmem_id"].as_str().unwrap();
    assert!(
        id.starts_with("0x") && id.len() > 2 && id[2..].chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
    );
    assert!(!id[2..].starts_with('0'), "no padding: {id}");
    assert_eq!(free["pmem_id"], id);
    Ok(())
}

/// Counts write and flush calls.
#[derive(Default)]
struct Counting {
    data: Vec<u8>,
    writes: usize,
    flushes: usize,
}

impl Write for Counting {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.writes += 1;
        self.data.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.flushes += 1;
        Ok(())
    }
}

#[test]
fn flush_after_each_line_unless_turned_off() -> TestResult {
    let pool = MemoryPool::<Host>::new();
    for (hook, flushes) in [
        (DebugPrintHook::new(Counting::default()), 3),
        (DebugPrintHook::with_flush(Counting::default(), false), 0),
    ] {
        assert_eq!(hook.flushes(), flushes != 0);
        let hook = install(hook)?;
        drop(pool.malloc(100)?);
        assert_eq!(hook.file().flushes, flushes);
        let w = hook.into_inner().into_inner();
        let lines = w.data.iter().filter(|&&b| b == b'\n').count();
        // The first round misses the cache (alloc, malloc, free); the second hits it.
        assert!(lines == 3 || lines == 2, "{lines}");
        assert_eq!(w.writes, lines, "one write per line");
        if flushes != 0 {
            assert_eq!(w.flushes, lines);
        }
    }
    Ok(())
}

/// Fails every write (or only the lines containing `only`), or every flush.
struct Failing {
    only: Option<&'static str>,
    on_flush: bool,
    data: Vec<u8>,
}

impl Failing {
    fn writes() -> Self {
        Failing { only: None, on_flush: false, data: Vec::new() }
    }
    fn lines_with(only: &'static str) -> Self {
        Failing { only: Some(only), on_flush: false, data: Vec::new() }
    }
    fn flushes() -> Self {
        Failing { only: None, on_flush: true, data: Vec::new() }
    }
}

impl Write for Failing {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let line = String::from_utf8_lossy(buf);
        if !self.on_flush && self.only.is_none_or(|s| line.contains(s)) {
            return Err(io::Error::other("disk full"));
        }
        self.data.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        if self.on_flush {
            return Err(io::Error::other("flush failed"));
        }
        Ok(())
    }
}

fn assert_hook_error(e: &Error, message: &str) {
    match e {
        Error::Hook { hook, source, .. } => {
            assert_eq!(hook, "DebugPrintHook");
            assert_eq!(source.to_string(), message);
        }
        other => panic!("expected a hook error, got {other:?}"),
    }
}

#[test]
fn a_failing_writer_fails_malloc_without_leaking() -> TestResult {
    let pool = MemoryPool::<Host>::new();

    // Cache miss: alloc_postprocess fails, the new block is freed, malloc_postprocess fails too.
    let hook = install(DebugPrintHook::new(Failing::writes()))?;
    let e = pool.malloc(100).unwrap_err();
    assert_hook_error(&e, "disk full");
    drop(hook);
    assert_eq!(pool.used_bytes(), 0);
    assert_eq!(pool.total_bytes(), 0);

    // Cache hit: malloc_postprocess fails and the chunk goes back.
    drop(pool.malloc(100)?);
    let hook = install(DebugPrintHook::new(Failing::writes()))?;
    let e = pool.malloc(100).unwrap_err();
    assert_hook_error(&e, "disk full");
    drop(hook);
    assert_eq!(pool.used_bytes(), 0);
    assert_eq!(pool.total_bytes(), 512);

    // A failing flush is an error as well, unless flushing is off.
    let hook = install(DebugPrintHook::new(Failing::flushes()))?;
    assert_hook_error(&pool.malloc(100).unwrap_err(), "flush failed");
    drop(hook);
    let hook = install(DebugPrintHook::with_flush(Failing::flushes(), false))?;
    drop(pool.malloc(100)?);
    assert_eq!(hook.into_inner().into_inner().data.iter().filter(|&&b| b == b'\n').count(), 2);
    assert_eq!(pool.used_bytes(), 0);
    Ok(())
}

#[test]
fn a_failing_writer_fails_free_without_leaking() -> TestResult {
    let pool = SingleDeviceMemoryPool::<Host>::new(0)?;
    let hook = install(DebugPrintHook::new(Failing::lines_with("\"hook\":\"free\"")))?;
    let p = pool.malloc_pooled(1000)?;
    assert_eq!(pool.used_bytes(), 1024);
    assert_hook_error(&p.free().unwrap_err(), "disk full");
    assert_eq!(pool.used_bytes(), 0);

    // Dropping discards the error; the chunk goes back all the same.
    let p = pool.malloc(1000)?;
    assert_eq!(pool.used_bytes(), 1024);
    drop(p);
    assert_eq!(pool.used_bytes(), 0);
    let out = String::from_utf8(hook.into_inner().into_inner().data)?;
    assert_eq!(out.lines().filter(|l| l.contains("\"hook\":\"malloc\"")).count(), 2);
    assert_eq!(out.lines().filter(|l| l.contains("\"hook\":\"free\"")).count(), 0);
    Ok(())
}

#[test]
fn failed_allocations_print_zero_pointers() -> TestResult {
    let oom = FnAllocator(|_: DeviceId, size: usize| -> gpumem_core::Result<Box<dyn BaseMemory<Host>>> {
        Err(Error::OutOfMemory { size, total: None })
    });
    let pool = SingleDeviceMemoryPool::<Host, _>::with_allocator(0, oom)?;
    let hook = install(DebugPrintHook::new(Vec::new()))?;
    let e = pool.malloc(10).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let out = String::from_utf8(hook.into_inner().into_inner())?;
    let alloc = r#"{"hook":"alloc","device_id":0,"mem_size":512,"mem_ptr":0}"#;
    let malloc = r#"{"hook":"malloc","device_id":0,"size":10,"mem_size":512,"mem_ptr":0,"pmem_id":"0x0"}"#;
    // Three raw attempts (CuPy's retry ladder), then the failed malloc.
    assert_eq!(out, format!("{alloc}\n{alloc}\n{alloc}\n{malloc}\n"));
    Ok(())
}

#[test]
fn the_writer_is_reachable_while_installed() -> TestResult {
    let pool = MemoryPool::<Host>::new();
    let hook = install(DebugPrintHook::with_flush(io::BufWriter::new(Vec::new()), false))?;
    drop(pool.malloc(1)?);
    assert!(hook.file().get_ref().is_empty(), "still buffered");
    hook.file_mut().flush()?;
    assert_eq!(hook.file().get_ref().iter().filter(|&&b| b == b'\n').count(), 3);
    assert_eq!(format!("{:?}", *hook), "DebugPrintHook { flush: false, .. }");
    Ok(())
}

#[test]
fn stdout_is_the_default() {
    use gpumem_core::MemoryHook;
    let hook = DebugPrintHook::default();
    assert_eq!(hook.name(), "DebugPrintHook");
    assert!(hook.flushes());
}

/// Formats each event with `format!`, as CuPy's format strings read, to hold DebugPrintHook's
/// own formatting (and the line ends it keeps for chunks lent again) to them.
#[derive(Default)]
struct Reference {
    lines: std::cell::RefCell<String>,
    /// Each malloc and free line's (mem_size, mem_ptr, pmem_id), in order.
    chunks: std::cell::RefCell<Vec<(usize, usize, u64)>>,
}

impl gpumem_core::MemoryHook for Reference {
    fn name(&self) -> &str {
        "Reference"
    }
    fn callbacks(&self) -> gpumem_core::hooks::Callbacks {
        gpumem_core::hooks::Callbacks::POSTPROCESS
    }
    fn alloc_postprocess(&self, e: &gpumem_core::AllocEvent) -> gpumem_core::HookResult {
        let line = format!(
            "{{\"hook\":\"alloc\",\"device_id\":{},\"mem_size\":{},\"mem_ptr\":{}}}\n",
            e.device_id, e.mem_size, e.mem_ptr
        );
        self.lines.borrow_mut().push_str(&line);
        Ok(())
    }
    fn malloc_postprocess(&self, e: &gpumem_core::MallocEvent) -> gpumem_core::HookResult {
        let line = format!(
            "{{\"hook\":\"malloc\",\"device_id\":{},\"size\":{},\"mem_size\":{},\"mem_ptr\":{},\"pmem_id\":\"{:#x}\"}}\n",
            e.device_id, e.size, e.mem_size, e.mem_ptr, e.pmem_id
        );
        self.lines.borrow_mut().push_str(&line);
        self.chunks.borrow_mut().push((e.mem_size, e.mem_ptr, e.pmem_id));
        Ok(())
    }
    fn free_postprocess(&self, e: &gpumem_core::FreeEvent) -> gpumem_core::HookResult {
        let line = format!(
            "{{\"hook\":\"free\",\"device_id\":{},\"mem_size\":{},\"mem_ptr\":{},\"pmem_id\":\"{:#x}\"}}\n",
            e.device_id, e.mem_size, e.mem_ptr, e.pmem_id
        );
        self.lines.borrow_mut().push_str(&line);
        self.chunks.borrow_mut().push((e.mem_size, e.mem_ptr, e.pmem_id));
        Ok(())
    }
}

/// The share of malloc and free lines whose end DebugPrintHook copies rather than formats: its
/// table's entry (the id's low 8 bits) last held the same chunk.
fn kept_ends(chunks: &[(usize, usize, u64)]) -> f64 {
    let mut table = vec![(0usize, 0usize, 0u64); 256];
    let kept =
        chunks.iter().filter(|&&c| std::mem::replace(&mut table[(c.2 % 256) as usize], c) == c).count();
    kept as f64 / chunks.len() as f64
}

/// A recorded training trace (GPT-2, three steps), a generated one and the random trace, replayed
/// through the pool with DebugPrintHook installed: every line, those whose end the hook kept
/// from an earlier line of the same chunk among them, is what CuPy's format strings give.
#[test]
fn traces_print_every_line_as_the_format_strings_do() -> TestResult {
    use gpumem_core::pool::{trace, GrowthPolicy};
    let gpt2 = include_str!("../../core/tests/fixtures/gpt2-training.trace");
    let traces = [
        ("GPT-2 training", trace::parse(gpt2)?),
        ("generated training", trace::training(4, 256, 128, 3)),
        ("random", trace::standard_random()),
    ];
    for (name, steps) in traces {
        let reference = install(Reference::default())?;
        let hook = install(DebugPrintHook::with_flush(Vec::new(), false))?;
        trace::replay(&steps, GrowthPolicy::default())?;
        let out = String::from_utf8(hook.into_inner().into_inner())?;
        let reference = reference.into_inner();
        let expected = reference.lines.into_inner();
        assert!(expected.lines().count() > 1000, "{name}: {} lines", expected.lines().count());
        assert!(out == expected, "{name}: the hook's lines differ from the reference's");
        let share = kept_ends(&reference.chunks.into_inner());
        eprintln!("{name}: {:.1} % of the malloc and free lines' ends kept", share * 100.0);
    }
    Ok(())
}
