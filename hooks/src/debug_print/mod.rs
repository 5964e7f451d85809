//! [`DebugPrintHook`]: one JSON line per allocation, pool allocation and free.

use std::cell::{Ref, RefCell, RefMut};
use std::fmt;
use std::io::{self, Write};

use gpumem_core::hooks::Callbacks;
use gpumem_core::{AllocEvent, FreeEvent, HookResult, MallocEvent, MemoryHook};

mod ends;
mod line;

use ends::LineEnds;
use line::{Line, LINE_CAP};

/// A memory hook that prints one JSON line for each raw allocation, pool allocation and free
/// (CuPy's `cupy.cuda.memory_hooks.DebugPrintHook`).
///
/// It implements only the three `*_postprocess` callbacks, so each line is written after the
/// operation, with its outcome (`mem_ptr` and `pmem_id` are 0 when an allocation failed):
///
/// ```text
/// {"hook":"alloc","device_id":0,"mem_size":512,"mem_ptr":150496608256}
/// {"hook":"malloc","device_id":0,"size":24,"mem_size":512,"mem_ptr":150496608256,"pmem_id":"0x7f39200c5278"}
/// {"hook":"free","device_id":0,"mem_size":512,"mem_ptr":150496608256,"pmem_id":"0x7f39200c5278"}
/// ```
///
/// The format is CuPy's to the byte: no spaces, these keys in this order, pointers in decimal,
/// `pmem_id` as Python's `hex()` (lowercase, `0x`, no padding). `size` is the size asked for and
/// `mem_size` the size rounded to the pool's unit.
///
/// Each line is formatted into a buffer the hook keeps (no allocation, no `fmt` machinery, no
/// loop over digits) and handed to the writer with a single `write_all` (the newline included),
/// then the writer is flushed if `flush` is set (the default, as in CuPy). A malloc line and the
/// free line of the same chunk end alike (size, address, `pmem_id`), and a pool lends the same
/// chunks again and again, so the hook keeps the last such end of 256 chunks, with the size of
/// the chunk's last malloc before it (44 KiB, indexed by the `pmem_id`'s low bits), and copies
/// it where it would format the same digits again: half the lines of GPT-2's three recorded
/// training steps, every line of a loop that frees what it allocates. The hook declares only
/// its three callbacks ([`MemoryHook::callbacks`]), so the pool skips the pre callbacks. A
/// `BufWriter` over a file with `flush` off is the fast setting, since each flush of a file is
/// a system call. A write or flush error is returned from the callback, so it reaches
/// the caller of `malloc` or [`PooledMemory::free`](gpumem_core::PooledMemory::free) as
/// [`Error::Hook`](gpumem_core::Error::Hook); the pool still returns or keeps its chunk as the
/// [hook rules](gpumem_core::hooks) say, so nothing leaks.
///
/// # Example
///
/// ```
/// use gpumem_core::hooks::install;
/// use gpumem_core::host::Host;
/// use gpumem_core::MemoryPool;
/// use gpumem_hooks::DebugPrintHook;
///
/// let pool = MemoryPool::<Host>::new();
/// let hook = install(DebugPrintHook::new(Vec::new()))?;
/// drop(pool.malloc(24)?);
/// let out = String::from_utf8(hook.into_inner().into_inner()).unwrap();
/// assert_eq!(out.lines().count(), 3); // alloc, malloc, free
/// # Ok::<(), gpumem_core::Error>(())
/// ```
pub struct DebugPrintHook<W: Write> {
    out: RefCell<Output<W>>,
    flush: bool,
}

/// The writer, the buffer lines are formatted in and the recent chunks' line ends, behind one
/// `RefCell` so an event takes one borrow. The buffer is kept between events: it is never
/// cleared, since a line only reads the bytes it wrote.
struct Output<W> {
    line: [u8; LINE_CAP],
    ends: LineEnds,
    file: W,
}

impl<W: Write> DebugPrintHook<W> {
    /// A hook writing to `file` and flushing it after each line (CuPy's default).
    #[must_use]
    pub fn new(file: W) -> Self {
        Self::with_flush(file, true)
    }

    /// A hook writing to `file`; with `flush` it flushes `file` after each line.
    #[must_use]
    pub fn with_flush(file: W, flush: bool) -> Self {
        DebugPrintHook {
            out: RefCell::new(Output { line: [0; LINE_CAP], ends: LineEnds::new(), file }),
            flush,
        }
    }

    /// Whether the writer is flushed after each line.
    #[must_use]
    pub fn flushes(&self) -> bool {
        self.flush
    }

    /// The writer, to read what was written while the hook is still installed.
    ///
    /// # Panics
    ///
    /// If called from inside the writer's own `write` or `flush`, while the hook holds it.
    #[must_use]
    pub fn file(&self) -> Ref<'_, W> {
        Ref::map(self.out.borrow(), |o| &o.file)
    }

    /// The writer, mutably (to flush a buffered writer or take what it holds) while the hook is
    /// still installed.
    ///
    /// # Panics
    ///
    /// If called from inside the writer's own `write` or `flush`, while the hook holds it.
    #[must_use]
    pub fn file_mut(&self) -> RefMut<'_, W> {
        RefMut::map(self.out.borrow_mut(), |o| &mut o.file)
    }

    /// Gives the writer back. A buffered writer is not flushed first; its own `into_inner` or
    /// drop does that.
    #[must_use]
    pub fn into_inner(self) -> W {
        self.out.into_inner().file
    }

    /// Formats a line (newline included) in the hook's buffer, writes it with one `write_all`,
    /// then flushes if asked.
    #[inline]
    fn emit(&self, format: impl FnOnce(&mut Line<'_>, &mut LineEnds)) -> HookResult {
        let mut out =
            self.out.try_borrow_mut().map_err(|_| "the writer is already in use (re-entrant call)")?;
        let Output { line, ends, file } = &mut *out;
        let mut l = Line::new(line);
        format(&mut l, ends);
        file.write_all(l.as_bytes())?;
        if self.flush {
            file.flush()?;
        }
        Ok(())
    }
}

impl DebugPrintHook<io::Stdout> {
    /// A hook printing to standard output, flushing after each line (CuPy's
    /// `DebugPrintHook()`).
    #[must_use]
    pub fn stdout() -> Self {
        Self::new(io::stdout())
    }
}

impl Default for DebugPrintHook<io::Stdout> {
    /// [`DebugPrintHook::stdout`].
    fn default() -> Self {
        Self::stdout()
    }
}

impl<W: Write> fmt::Debug for DebugPrintHook<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DebugPrintHook").field("flush", &self.flush).finish_non_exhaustive()
    }
}

impl<W: Write> MemoryHook for DebugPrintHook<W> {
    fn name(&self) -> &str {
        "DebugPrintHook"
    }

    /// The three `*_postprocess` callbacks: the pre callbacks are not called at all.
    fn callbacks(&self) -> Callbacks {
        Callbacks::POSTPROCESS
    }

    /// Writes `{"hook":"alloc","device_id":..,"mem_size":..,"mem_ptr":..}`.
    fn alloc_postprocess(&self, e: &AllocEvent) -> HookResult {
        self.emit(|l, _| alloc_line(l, e))
    }

    /// Writes `{"hook":"malloc","device_id":..,"size":..,"mem_size":..,"mem_ptr":..,"pmem_id":".."}`.
    fn malloc_postprocess(&self, e: &MallocEvent) -> HookResult {
        self.emit(|l, ends| malloc_line(l, e, ends))
    }

    /// Writes `{"hook":"free","device_id":..,"mem_size":..,"mem_ptr":..,"pmem_id":".."}`.
    fn free_postprocess(&self, e: &FreeEvent) -> HookResult {
        self.emit(|l, ends| free_line(l, e, ends))
    }
}

// Lines are built from their end back (see `Line`), so each field comes in reverse order.

#[inline(always)]
fn alloc_line(l: &mut Line<'_>, e: &AllocEvent) {
    l.put(b"}\n");
    l.unsigned(e.mem_ptr);
    l.put(b",\"mem_ptr\":");
    l.unsigned(e.mem_size);
    l.put(b",\"mem_size\":");
    l.signed(e.device_id);
    l.put(b"{\"hook\":\"alloc\",\"device_id\":");
}

#[inline(always)]
fn malloc_line(l: &mut Line<'_>, e: &MallocEvent, ends: &mut LineEnds) {
    ends.put_sized_end(l, e.size, e.mem_size, e.mem_ptr, e.pmem_id);
    l.signed(e.device_id);
    l.put(b"{\"hook\":\"malloc\",\"device_id\":");
}

#[inline(always)]
fn free_line(l: &mut Line<'_>, e: &FreeEvent, ends: &mut LineEnds) {
    ends.put_end(l, e.mem_size, e.mem_ptr, e.pmem_id);
    l.signed(e.device_id);
    l.put(b"{\"hook\":\"free\",\"device_id\":");
}

#[cfg(test)]
mod tests {
    use super::*;
    use line::tests::line;

    #[test]
    fn lines_match_cupy_format_strings() {
        let a = AllocEvent { device_id: 0, mem_size: 512, mem_ptr: 150_496_608_256 };
        assert_eq!(
            line(|l| alloc_line(l, &a)),
            "{\"hook\":\"alloc\",\"device_id\":0,\"mem_size\":512,\"mem_ptr\":150496608256}\n"
        );
        let m = MallocEvent {
            device_id: 0,
            size: 24,
            mem_size: 512,
            mem_ptr: 150_496_608_256,
            pmem_id: 0x7f39_200c_5278,
        };
        assert_eq!(
            line(|l| malloc_line(l, &m, &mut LineEnds::new())),
            "{\"hook\":\"malloc\",\"device_id\":0,\"size\":24,\"mem_size\":512,\"mem_ptr\":150496608256,\"pmem_id\":\"0x7f39200c5278\"}\n"
        );
        let f =
            FreeEvent { device_id: 3, mem_size: 512, mem_ptr: 150_496_608_256, pmem_id: 0x7f39_200c_5278 };
        assert_eq!(
            line(|l| free_line(l, &f, &mut LineEnds::new())),
            "{\"hook\":\"free\",\"device_id\":3,\"mem_size\":512,\"mem_ptr\":150496608256,\"pmem_id\":\"0x7f39200c5278\"}\n"
        );
        let failed = MallocEvent { device_id: 1, size: 7, mem_size: 512, mem_ptr: 0, pmem_id: 0 };
        assert_eq!(
            line(|l| malloc_line(l, &failed, &mut LineEnds::new())),
            "{\"hook\":\"malloc\",\"device_id\":1,\"size\":7,\"mem_size\":512,\"mem_ptr\":0,\"pmem_id\":\"0x0\"}\n"
        );
    }

    #[test]
    fn the_longest_line_fits() {
        let m = MallocEvent {
            device_id: i32::MIN,
            size: usize::MAX,
            mem_size: usize::MAX,
            mem_ptr: usize::MAX,
            pmem_id: u64::MAX,
        };
        let l = line(|l| malloc_line(l, &m, &mut LineEnds::new()));
        assert_eq!(l.len(), 164);
        assert_eq!(
            l,
            format!(
                "{{\"hook\":\"malloc\",\"device_id\":{},\"size\":{},\"mem_size\":{},\"mem_ptr\":{},\"pmem_id\":\"{:#x}\"}}\n",
                i32::MIN,
                usize::MAX,
                usize::MAX,
                usize::MAX,
                u64::MAX
            )
        );
    }

    #[test]
    fn lines_match_a_reference_formatter_on_many_values() {
        // A xorshift sequence, masked to every width so that every digit count comes up.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |bits: u32| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if bits == 64 {
                x
            } else {
                x & ((1 << bits) - 1)
            }
        };
        for i in 0..20_000u32 {
            let bits = 1 + i % 64;
            let device_id = next(32) as u32 as i32;
            let (size, mem_size, mem_ptr) = (next(bits) as usize, next(bits) as usize, next(bits) as usize);
            let pmem_id = next(bits);
            let m = MallocEvent { device_id, size, mem_size, mem_ptr, pmem_id };
            assert_eq!(
                line(|l| malloc_line(l, &m, &mut LineEnds::new())),
                format!(
                    "{{\"hook\":\"malloc\",\"device_id\":{device_id},\"size\":{size},\"mem_size\":{mem_size},\"mem_ptr\":{mem_ptr},\"pmem_id\":\"{pmem_id:#x}\"}}\n"
                )
            );
            let a = AllocEvent { device_id, mem_size, mem_ptr };
            assert_eq!(
                line(|l| alloc_line(l, &a)),
                format!("{{\"hook\":\"alloc\",\"device_id\":{device_id},\"mem_size\":{mem_size},\"mem_ptr\":{mem_ptr}}}\n")
            );
            let f = FreeEvent { device_id, mem_size, mem_ptr, pmem_id };
            assert_eq!(
                line(|l| free_line(l, &f, &mut LineEnds::new())),
                format!(
                    "{{\"hook\":\"free\",\"device_id\":{device_id},\"mem_size\":{mem_size},\"mem_ptr\":{mem_ptr},\"pmem_id\":\"{pmem_id:#x}\"}}\n"
                )
            );
        }
    }
}
