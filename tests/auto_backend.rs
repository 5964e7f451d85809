//! With the `auto` feature the facade's aliases name the backend chosen at run time, so one binary
//! built with `cuda` runs on the CPU where `GPUMEM_BACKEND=host` (its own test binary: the choice is
//! made once per process).

#![cfg(feature = "auto")]

use gpumem::auto::{chosen, Auto, Choice};

#[test]
fn the_aliases_follow_gpumem_backend() {
    std::env::set_var("GPUMEM_BACKEND", "host");

    // The aliases name `Auto`, and `Auto` chose the host backend: no driver is asked for anything.
    assert_eq!(std::any::TypeId::of::<gpumem::DefaultBackend>(), std::any::TypeId::of::<Auto>());
    assert_eq!(chosen().unwrap(), Choice::Host);

    let pool = gpumem::MemoryPool::new();
    let a = pool.malloc(256).unwrap();
    a.copy_from_host(&[7u8; 16], 16).unwrap();
    let mut out = [0u8; 16];
    a.copy_to_host(&mut out, 16).unwrap();
    assert_eq!(out, [7u8; 16]);

    // The process-wide functions go through the same choice.
    let p = gpumem::alloc(64).unwrap();
    p.memset(1, 64).unwrap();
    assert_eq!(gpumem::get_current_stream().synchronize().map_err(|e| e.to_string()), Ok(()));
}
