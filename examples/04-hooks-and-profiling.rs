//! Memory hooks and profiling: `LineProfileHook` (CuPy's, memory per call site), a hook of one's
//! own, and the pool's statistics.
//!
//! `cargo run --example 04-hooks-and-profiling` (host backend; `--features cuda` on an NVIDIA
//! GPU). It prints the profile report, what the counting hook saw, and the pool's figures.

use std::cell::Cell;
use std::sync::Arc;

use gpumem::{hooks, FreeEvent, HookResult, LineProfileHook, MallocEvent, MemoryHook, MemoryPool};

/// Counts the pool's mallocs and frees, and the bytes lent.
#[derive(Default)]
struct Counter {
    mallocs: Cell<usize>,
    frees: Cell<usize>,
    bytes: Cell<usize>,
}

impl MemoryHook for Counter {
    fn name(&self) -> &str {
        "Counter"
    }
    fn malloc_postprocess(&self, e: &MallocEvent) -> HookResult {
        self.mallocs.set(self.mallocs.get() + 1);
        self.bytes.set(self.bytes.get() + e.mem_size);
        Ok(())
    }
    fn free_postprocess(&self, _: &FreeEvent) -> HookResult {
        self.frees.set(self.frees.get() + 1);
        Ok(())
    }
}

fn small_buffers() -> gpumem::Result<Vec<gpumem::MemoryPointer>> {
    (0..4).map(|_| gpumem::alloc(1000)).collect()
}

fn one_large_buffer() -> gpumem::Result<gpumem::MemoryPointer> {
    gpumem::alloc(1 << 20)
}

fn main() -> gpumem::Result<()> {
    let pool = Arc::new(MemoryPool::new());
    gpumem::set_allocator(Some(pool.clone()))?;

    let profile = hooks::install(LineProfileHook::new(4))?;
    let counter = hooks::install(Counter::default())?;
    let small = small_buffers()?;
    let large = one_large_buffer()?;
    drop(small);
    let again = small_buffers()?; // served from the cache: no new raw allocation

    println!("LineProfileHook report (memory per call site):");
    profile.print_report(&mut std::io::stdout()).expect("stdout");
    println!(
        "Counter: {} mallocs, {} frees, {} bytes lent",
        counter.mallocs.get(),
        counter.frees.get(),
        counter.bytes.get()
    );
    println!(
        "pool: {} bytes used, {} bytes held, {} free blocks",
        pool.used_bytes(),
        pool.total_bytes(),
        pool.n_free_blocks()
    );
    drop((large, again));
    pool.free_all_blocks(None);
    println!("after free_all_blocks: {} bytes held", pool.total_bytes());
    Ok(())
}
