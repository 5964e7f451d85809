//! Staging's unit tests: the variable, the plans, and the fallback and failure paths (driven by
//! the injections only a test build has).

use super::*;

#[test]
fn the_variable_takes_off_auto_and_sizes_with_binary_units() {
    assert_eq!(PageableStaging::parse("auto").unwrap(), None);
    assert_eq!(PageableStaging::parse(" ").unwrap(), None);
    assert_eq!(PageableStaging::parse("OFF").unwrap().unwrap().threshold(), None);
    let size = |v: &str| PageableStaging::parse(v).unwrap().unwrap().threshold();
    assert_eq!(size("0"), Some(0));
    assert_eq!(size("65536"), Some(65536));
    assert_eq!(size("64KiB"), Some(64 << 10));
    assert_eq!(size("8 MiB"), Some(8 << 20));
    assert_eq!(size("1g"), Some(1 << 30));
    assert_eq!(size("12b"), Some(12));
    assert_eq!(size("8MB"), Some(8_000_000));
    assert_eq!(size("1.5MiB"), Some(3 << 19));
}

#[test]
fn a_malformed_value_names_the_variable_the_value_and_the_forms() {
    for bad in ["8XB", "-1", "on", "MiB", "99999999999999999999", "4 KiB x"] {
        match PageableStaging::parse(bad) {
            Err(Error::InvalidEnvironment { variable, value, expected }) => {
                assert_eq!(variable, PAGEABLE_STAGING_ENV);
                assert_eq!(value, bad);
                assert_eq!(expected, ENV_FORMS);
            }
            other => panic!("{bad:?} gave {other:?}"),
        }
    }
    let e = PageableStaging::parse("8XB").unwrap_err().to_string();
    assert!(e.contains(PAGEABLE_STAGING_ENV) && e.contains("8XB") && e.contains("64KiB"), "{e}");
}

#[test]
fn plans_cut_small_copies_finer_and_spread_large_ones_over_lanes() {
    let _s = PageableStaging::from_size(0).with_lanes(4).unwrap().enter();
    let p = plan::<crate::host::Host>(1 << 30).unwrap().unwrap();
    assert_eq!((p.chunk, p.lanes), (DEFAULT_STAGING_CHUNK, 4));
    let p = plan::<crate::host::Host>(1 << 20).unwrap().unwrap();
    assert_eq!((p.chunk, p.lanes), (256 << 10, 2));
    let p = plan::<crate::host::Host>(100).unwrap().unwrap();
    assert_eq!((p.chunk, p.lanes), (MIN_AUTO_CHUNK, 1));
    {
        let _off = PageableStaging::off().enter();
        assert!(plan::<crate::host::Host>(1 << 30).unwrap().is_none());
    }
    let _t = PageableStaging::from_size(4096).enter();
    assert!(plan::<crate::host::Host>(4095).unwrap().is_none());
    assert!(plan::<crate::host::Host>(4096).unwrap().is_some());
}

#[test]
fn without_buffers_the_copy_is_the_direct_one_and_exact() {
    let _s = PageableStaging::from_size(0).with_chunk(100).unwrap().enter();
    let p = crate::runtime::allocator::alloc::<crate::host::Host>(1000).unwrap();
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 256) as u8).collect();
    let before = PageableStaging::counts_on_this_thread();
    REFUSE_BUFFERS.with(|r| r.set(true));
    p.copy_from_host(&data, 999).unwrap();
    let mut back = vec![0u8; 1000];
    p.copy_to_host(&mut back, 999).unwrap();
    REFUSE_BUFFERS.with(|r| r.set(false));
    assert_eq!(back[..999], data[..999]);
    assert_eq!(back[999], 0, "the byte past the copy stays as it was");
    let after = PageableStaging::counts_on_this_thread();
    assert_eq!((after.direct - before.direct, after.staged - before.staged), (2, 0));
    p.copy_to_host(&mut back, 1000).unwrap();
    assert_eq!(PageableStaging::counts_on_this_thread().staged - after.staged, 1);
}

#[test]
fn a_failed_transfer_is_the_copy_s_error_and_the_buffers_serve_again() {
    let _s = PageableStaging::from_size(0).with_chunk(100).unwrap().with_lanes(1).unwrap().enter();
    let p = crate::runtime::allocator::alloc::<crate::host::Host>(1000).unwrap();
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 13 % 256) as u8).collect();
    let mut back = vec![0u8; 1000];
    FAIL_CHUNK.with(|f| f.set(Some(3)));
    let up = p.copy_from_host(&data, 1000);
    let down = p.copy_to_host(&mut back, 1000);
    FAIL_CHUNK.with(|f| f.set(None));
    for r in [up, down] {
        assert!(matches!(r, Err(Error::InvalidArgument(ref m)) if m.contains("injected")), "{r:?}");
    }
    p.copy_from_host(&data, 1000).unwrap();
    p.copy_to_host(&mut back, 1000).unwrap();
    assert_eq!(back, data);
}

#[test]
fn the_host_backend_stages_nothing_by_default() {
    assert_eq!(PageableStaging::backend_default::<crate::host::Host>().threshold(), None);
    assert!(PageableStaging::from_size(0).with_chunk(0).is_err());
    assert!(PageableStaging::from_size(0).with_lanes(0).is_err());
}

/// ST03: a lane count past the bound is refused (a copy on `usize::MAX` lanes started a thread
/// per chunk and aborted the process).
#[test]
fn lanes_past_the_bound_are_refused() {
    let staging = PageableStaging::from_size(0);
    assert_eq!(staging.with_lanes(MAX_STAGING_LANES).unwrap().lanes(), MAX_STAGING_LANES);
    for lanes in [MAX_STAGING_LANES + 1, usize::MAX] {
        match staging.with_lanes(lanes) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(&MAX_STAGING_LANES.to_string()), "{m}"),
            other => panic!("{lanes} lanes gave {other:?}"),
        }
    }
}
