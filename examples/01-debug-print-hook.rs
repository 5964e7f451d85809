//! The main job: what CuPy's `DebugPrintHook` document shows, on gpumem.
//!
//! ```python
//! cupy.cuda.set_allocator(cupy.cuda.MemoryPool().malloc)
//! with memory_hooks.DebugPrintHook():
//!     x = cupy.array([1, 2, 3])
//!     del x
//! ```
//!
//! Run it on the host backend with `cargo run --example 01-debug-print-hook` (or with
//! `--features cuda` on an NVIDIA GPU). It prints one JSON line per hook event: the raw
//! allocation, the pool's malloc, and the free; the pointer values and `pmem_id` differ from run to
//! run, as they do in CuPy.

use std::sync::Arc;

use gpumem::{hooks, DebugPrintHook, MemoryPool};

fn main() -> gpumem::Result<()> {
    // cupy.cuda.set_allocator(cupy.cuda.MemoryPool().malloc)
    gpumem::set_allocator(Some(Arc::new(MemoryPool::new())))?;

    // with memory_hooks.DebugPrintHook():
    let hook = hooks::install(DebugPrintHook::stdout())?;
    {
        // x = cupy.array([1, 2, 3]): three int64 values, 24 bytes.
        let values: [i64; 3] = [1, 2, 3];
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let x = gpumem::alloc(bytes.len())?;
        x.copy_from_host(&bytes, bytes.len())?;
        // del x
        drop(x);
    }
    drop(hook);
    Ok(())
}
