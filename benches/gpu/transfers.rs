//! Copies and memsets against the raw calls, and pageable copies staged through pinned memory
//! against the raw `cuMemcpy`.

use gpumem::core::MemoryOps;
use gpumem::{DefaultBackend as B, MemoryPointer, PinnedMemoryPointer, Stream};

use crate::report::Report;
use crate::timing::{dev, device_ms_pair, wall_pair};

pub(crate) fn transfers(report: &mut Report) {
    const N: usize = 1 << 30;
    eprintln!("1 GiB transfers (GB/s, CUDA events, median of 7, alternating with the raw call)");
    let gb = |bytes: usize, ms: f64| bytes as f64 / (ms * 1e-3) / 1e9;
    let s = Stream::non_blocking().unwrap();
    let a = gpumem::Memory::new(N).map(MemoryPointer::from_memory).unwrap();
    let b = gpumem::Memory::new(N).map(MemoryPointer::from_memory).unwrap();
    a.memset(1, N).unwrap();
    let pinned = PinnedMemoryPointer::alloc(N).unwrap();
    pinned.write(&vec![3u8; N]).unwrap();
    let (h, d, host) = (s.handle(), dev(), pinned.ptr() as usize);

    // Every raw call below uses ranges of live allocations of N bytes (`a`, `b`, `pinned`) that
    // outlive the synchronised timing.
    let (ours, raw) = device_ms_pair(
        &s,
        || a.copy_from_host_async(&pinned, N, Some(&s)).unwrap(),
        // SAFETY: live N-byte ranges, as above.
        || unsafe { B::memcpy_async(d, a.ptr(), host, N, h).unwrap() },
    );
    report.add(
        "transfers",
        "host to device, pinned",
        gb(N, ours),
        "cuMemcpyAsync",
        Some(gb(N, raw)),
        "GB/s",
        false,
    );
    let (ours, raw) = device_ms_pair(
        &s,
        || a.copy_to_host_async(&pinned, N, Some(&s)).unwrap(),
        // SAFETY: live N-byte ranges, as above.
        || unsafe { B::memcpy_async(d, host, a.ptr(), N, h).unwrap() },
    );
    report.add(
        "transfers",
        "device to host, pinned",
        gb(N, ours),
        "cuMemcpyAsync",
        Some(gb(N, raw)),
        "GB/s",
        false,
    );
    // Pageable copies: `pageable`, timed on the host clock (they are synchronous).
    let (ours, raw) = device_ms_pair(
        &s,
        || b.copy_from_device_async(&a, N, Some(&s)).unwrap(),
        // SAFETY: live N-byte ranges, as above.
        || unsafe { B::memcpy_async(d, b.ptr(), a.ptr(), N, h).unwrap() },
    );
    report.add(
        "transfers",
        "device to device (read + write)",
        gb(2 * N, ours),
        "cuMemcpyAsync",
        Some(gb(2 * N, raw)),
        "GB/s",
        false,
    );
    let (ours, raw) = device_ms_pair(
        &s,
        || b.memset_async(7, N, Some(&s)).unwrap(),
        // SAFETY: live N-byte ranges, as above.
        || unsafe { B::memset_async(d, b.ptr(), 7, N, h).unwrap() },
    );
    report.add("transfers", "memset", gb(N, ours), "cuMemsetD8Async", Some(gb(N, raw)), "GB/s", false);
}

/// Synchronous copies of pageable memory: gpumem's (staged through pinned buffers from the
/// threshold up) against the runtime's own `cuMemcpy` of the same bytes, on the host clock, as
/// the caller sees them (both return when the copy is done).
pub(crate) fn pageable(report: &mut Report) {
    const N: usize = 1 << 30;
    eprintln!("pageable copies (GB/s, host clock, median, alternating with the raw cuMemcpy)");
    let gb = |bytes: usize, s: f64| bytes as f64 / s / 1e9;
    let runs = |size: usize| if size >= 64 << 20 { 7 } else { 51 };
    let d = dev();
    let a = gpumem::Memory::new(N).map(MemoryPointer::from_memory).unwrap();
    a.memset(1, N).unwrap();
    let mut host = vec![5u8; N];
    let host_ptr = host.as_mut_ptr() as usize;
    let default = gpumem::PageableStaging::current::<B>().unwrap();
    eprintln!(
        "  staging: threshold {:?}, chunk {} B, {} lanes",
        default.threshold(),
        default.chunk(),
        default.lanes()
    );
    // Every raw call and slice below is of at most N bytes of `a` and `host`, live allocations
    // of N bytes that outlive the timing; nothing else touches `host` meanwhile.
    // SAFETY: as above; the slice is only read, and no mutable one lives meanwhile.
    let src = |n: usize| unsafe { std::slice::from_raw_parts(host_ptr as *const u8, n) };
    // SAFETY: as above; each slice is the only view of `host` while it lives.
    let dst = |n: usize| unsafe { std::slice::from_raw_parts_mut(host_ptr as *mut u8, n) };
    let h2d = |n: usize| a.copy_from_host(src(n), n).unwrap();
    let d2h = |n: usize| a.copy_to_host(dst(n), n).unwrap();
    // SAFETY: live ranges of N bytes, as above.
    let raw_h2d = |n: usize| unsafe { B::memcpy(d, a.ptr(), host_ptr, n).unwrap() };
    // SAFETY: live ranges of N bytes, as above.
    let raw_d2h = |n: usize| unsafe { B::memcpy(d, host_ptr, a.ptr(), n).unwrap() };

    // The rows users get: the default setting (staged from its threshold up).
    for (label, n) in [("1 MiB", 1usize << 20), ("64 MiB", 64 << 20), ("1 GiB", N)] {
        let (ours, raw) = wall_pair(runs(n), || h2d(n), || raw_h2d(n));
        let what = format!("host to device, pageable, {label}");
        report.add("pageable", what, gb(n, ours), "cuMemcpy", Some(gb(n, raw)), "GB/s", false);
        let (ours, raw) = wall_pair(runs(n), || d2h(n), || raw_d2h(n));
        let what = format!("device to host, pageable, {label}");
        report.add("pageable", what, gb(n, ours), "cuMemcpy", Some(gb(n, raw)), "GB/s", false);
    }

    // Where staging starts to win: every copy staged, against the raw copy, by size (the
    // default threshold should sit where the ratio passes 1).
    let forced = gpumem::PageableStaging::from_size(0);
    for (label, n) in [
        ("64 KiB", 64usize << 10),
        ("256 KiB", 256 << 10),
        ("1 MiB", 1 << 20),
        ("2 MiB", 2 << 20),
        ("4 MiB", 4 << 20),
        ("8 MiB", 8 << 20),
        ("16 MiB", 16 << 20),
    ] {
        let _scope = forced.enter();
        let (ours, raw) = wall_pair(runs(n), || h2d(n), || raw_h2d(n));
        let what = format!("host to device, always staged, {label}");
        report.add("staging", what, gb(n, ours), "cuMemcpy", Some(gb(n, raw)), "GB/s", false);
        let (ours, raw) = wall_pair(runs(n), || d2h(n), || raw_d2h(n));
        let what = format!("device to host, always staged, {label}");
        report.add("staging", what, gb(n, ours), "cuMemcpy", Some(gb(n, raw)), "GB/s", false);
    }

    // What the lanes (threads copying into staging buffers) bring at 1 GiB.
    for lanes in [1usize, 2, 4, 8] {
        let _scope = forced.with_lanes(lanes).unwrap().enter();
        let (ours, raw) = wall_pair(5, || h2d(N), || raw_h2d(N));
        let what = format!("host to device, 1 GiB, {lanes} lanes");
        report.add("staging", what, gb(N, ours), "cuMemcpy", Some(gb(N, raw)), "GB/s", false);
        let (ours, raw) = wall_pair(5, || d2h(N), || raw_d2h(N));
        let what = format!("device to host, 1 GiB, {lanes} lanes");
        report.add("staging", what, gb(N, ours), "cuMemcpy", Some(gb(N, raw)), "GB/s", false);
    }
    // The staged path's bytes, checked once (a benchmark of wrong copies is worthless).
    let pattern: Vec<u8> = (0..N).map(|i| (i % 251) as u8).collect();
    {
        let _scope = forced.enter();
        a.copy_from_host(&pattern, N).unwrap();
        let back = dst(N);
        back.fill(0);
        a.copy_to_host(back, N).unwrap();
        assert!(back == &pattern[..], "the staged copies changed the bytes");
    }
    drop(host);
}
