//! [`DebugPrintHook`]: one JSON line per allocation, pool allocation and free.

use std::cell::{Ref, RefCell, RefMut};
use std::fmt;
use std::io::{self, Write};

use gpumem_core::{AllocEvent, FreeEvent, HookResult, MallocEvent, MemoryHook};

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
/// Each line is formatted into a stack buffer and handed to the writer with a single
/// `write_all` (the newline included), then the writer is flushed if `flush` is set (the
/// default, as in CuPy). Into a [`BufWriter`](std::io::BufWriter) a line costs 25 to 30 ns on a
/// 2-core VM, flushing or not (`benches/debug_print.rs`); a `BufWriter` over a file with
/// `flush` off is the fast setting, since each flush of a file is a system call. A write or flush error is returned from the callback, so it reaches
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
    file: RefCell<W>,
    flush: bool,
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
        DebugPrintHook { file: RefCell::new(file), flush }
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
        self.file.borrow()
    }

    /// The writer, mutably (to flush a buffered writer or take what it holds) while the hook is
    /// still installed.
    ///
    /// # Panics
    ///
    /// If called from inside the writer's own `write` or `flush`, while the hook holds it.
    #[must_use]
    pub fn file_mut(&self) -> RefMut<'_, W> {
        self.file.borrow_mut()
    }

    /// Gives the writer back. A buffered writer is not flushed first; its own `into_inner` or
    /// drop does that.
    #[must_use]
    pub fn into_inner(self) -> W {
        self.file.into_inner()
    }

    /// Formats a line (newline included) on the stack, writes it with one `write_all`, then
    /// flushes if asked.
    #[inline]
    fn emit(&self, format: impl FnOnce(&mut Line)) -> HookResult {
        let mut line = Line::new();
        format(&mut line);
        let mut file =
            self.file.try_borrow_mut().map_err(|_| "the writer is already in use (re-entrant call)")?;
        file.write_all(line.as_bytes())?;
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

    /// Writes `{"hook":"alloc","device_id":..,"mem_size":..,"mem_ptr":..}`.
    fn alloc_postprocess(&self, e: &AllocEvent) -> HookResult {
        self.emit(|l| alloc_line(l, e))
    }

    /// Writes `{"hook":"malloc","device_id":..,"size":..,"mem_size":..,"mem_ptr":..,"pmem_id":".."}`.
    fn malloc_postprocess(&self, e: &MallocEvent) -> HookResult {
        self.emit(|l| malloc_line(l, e))
    }

    /// Writes `{"hook":"free","device_id":..,"mem_size":..,"mem_ptr":..,"pmem_id":".."}`.
    fn free_postprocess(&self, e: &FreeEvent) -> HookResult {
        self.emit(|l| free_line(l, e))
    }
}

// Lines are built from their end back (see `Line`), so each field comes in reverse order.

fn alloc_line(l: &mut Line, e: &AllocEvent) {
    l.put(b"}\n");
    l.unsigned(e.mem_ptr);
    l.put(b",\"mem_ptr\":");
    l.unsigned(e.mem_size);
    l.put(b",\"mem_size\":");
    l.signed(e.device_id.into());
    l.put(b"{\"hook\":\"alloc\",\"device_id\":");
}

fn malloc_line(l: &mut Line, e: &MallocEvent) {
    l.put(b"\"}\n");
    l.hex(e.pmem_id);
    l.put(b",\"pmem_id\":\"");
    l.unsigned(e.mem_ptr);
    l.put(b",\"mem_ptr\":");
    l.unsigned(e.mem_size);
    l.put(b",\"mem_size\":");
    l.unsigned(e.size);
    l.put(b",\"size\":");
    l.signed(e.device_id.into());
    l.put(b"{\"hook\":\"malloc\",\"device_id\":");
}

fn free_line(l: &mut Line, e: &FreeEvent) {
    l.put(b"\"}\n");
    l.hex(e.pmem_id);
    l.put(b",\"pmem_id\":\"");
    l.unsigned(e.mem_ptr);
    l.put(b",\"mem_ptr\":");
    l.unsigned(e.mem_size);
    l.put(b",\"mem_size\":");
    l.signed(e.device_id.into());
    l.put(b"{\"hook\":\"free\",\"device_id\":");
}

/// The longest line: the malloc line's 105 bytes of keys and punctuation, an `i32`, three
/// 20-digit integers and an 18-character hex id come to 164 bytes.
const LINE_CAP: usize = 192;

/// `"00" "01" ... "99"`: two digits per division by 100.
const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// A line formatted on the stack without `fmt` machinery, from its last byte back to its first:
/// a number's digits come out last digit first, so writing backwards needs neither its length
/// up front nor a temporary to copy from.
struct Line {
    buf: [u8; LINE_CAP],
    /// The line is `buf[start..]`.
    start: usize,
}

impl Line {
    #[inline]
    fn new() -> Self {
        Line { buf: [0; LINE_CAP], start: LINE_CAP }
    }

    #[inline]
    fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// Prepends a literal; its length is a constant, so the copy is a few moves, not a call.
    #[inline]
    fn put<const N: usize>(&mut self, s: &[u8; N]) {
        self.start -= N;
        self.buf[self.start..self.start + N].copy_from_slice(s);
    }

    #[inline]
    fn pair(&mut self, d: usize) {
        self.start -= 2;
        self.buf[self.start..self.start + 2].copy_from_slice(&PAIRS[2 * d..2 * d + 2]);
    }

    /// `%d` of an unsigned value.
    #[inline]
    fn unsigned(&mut self, v: usize) {
        self.decimal(v as u64);
    }

    /// `%d` of a signed value.
    #[inline]
    fn signed(&mut self, v: i64) {
        self.decimal(v.unsigned_abs());
        if v < 0 {
            self.put(b"-");
        }
    }

    /// Prepends the digits: four per division by 10 000 (whose two halves are independent),
    /// then two per division by 100.
    #[inline(always)]
    fn decimal(&mut self, mut v: u64) {
        while v >= 10_000 {
            let rem = (v % 10_000) as usize;
            v /= 10_000;
            self.pair(rem % 100);
            self.pair(rem / 100);
        }
        let mut v = v as usize;
        if v >= 100 {
            self.pair(v % 100);
            v /= 100;
        }
        if v >= 10 {
            self.pair(v);
        } else {
            self.start -= 1;
            self.buf[self.start] = b'0' + v as u8;
        }
    }

    /// Python's `hex()`: `0x`, lowercase, no padding, `0x0` for zero.
    #[inline]
    fn hex(&mut self, mut v: u64) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let n = (64 - (v | 1).leading_zeros()).div_ceil(4) as usize;
        self.start -= n;
        for digit in self.buf[self.start..self.start + n].iter_mut().rev() {
            *digit = HEX[(v & 0xf) as usize];
            v >>= 4;
        }
        self.put(b"0x");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(f: impl FnOnce(&mut Line)) -> Line {
        let mut l = Line::new();
        f(&mut l);
        l
    }

    fn text(l: &Line) -> &str {
        std::str::from_utf8(l.as_bytes()).unwrap()
    }

    #[test]
    fn decimals_match_the_standard_formatter() {
        let mut cases =
            vec![0u64, 1, 9, 10, 11, 99, 100, 101, 999, 1000, 1023, 65536, u64::MAX, u64::MAX - 1];
        for p in 0..20 {
            let x = 10u64.pow(p);
            cases.extend([x - 1, x, x + 1]);
        }
        for v in cases {
            let mut l = Line::new();
            l.decimal(v);
            assert_eq!(text(&l), v.to_string());
        }
        for v in [0i64, 1, -1, 9, -10, i64::from(i32::MIN), i64::from(i32::MAX), i64::MIN, i64::MAX] {
            let mut l = Line::new();
            l.signed(v);
            assert_eq!(text(&l), v.to_string());
        }
    }

    #[test]
    fn hex_matches_python() {
        for (v, s) in [
            (0u64, "0x0"),
            (1, "0x1"),
            (15, "0xf"),
            (16, "0x10"),
            (0x7f39_200c_5278, "0x7f39200c5278"),
            (u64::MAX, "0xffffffffffffffff"),
            (1 << 63, "0x8000000000000000"),
        ] {
            let mut l = Line::new();
            l.hex(v);
            assert_eq!(text(&l), s);
        }
        for shift in 0..64 {
            for v in [1u64 << shift, (1u64 << shift) - 1, (1u64 << shift) + 1] {
                let mut l = Line::new();
                l.hex(v);
                assert_eq!(text(&l), format!("{v:#x}"));
            }
        }
    }

    #[test]
    fn lines_match_cupy_format_strings() {
        let a = AllocEvent { device_id: 0, mem_size: 512, mem_ptr: 150_496_608_256 };
        assert_eq!(
            text(&line(|l| alloc_line(l, &a))),
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
            text(&line(|l| malloc_line(l, &m))),
            "{\"hook\":\"malloc\",\"device_id\":0,\"size\":24,\"mem_size\":512,\"mem_ptr\":150496608256,\"pmem_id\":\"0x7f39200c5278\"}\n"
        );
        let f =
            FreeEvent { device_id: 3, mem_size: 512, mem_ptr: 150_496_608_256, pmem_id: 0x7f39_200c_5278 };
        assert_eq!(
            text(&line(|l| free_line(l, &f))),
            "{\"hook\":\"free\",\"device_id\":3,\"mem_size\":512,\"mem_ptr\":150496608256,\"pmem_id\":\"0x7f39200c5278\"}\n"
        );
        let failed = MallocEvent { device_id: 1, size: 7, mem_size: 512, mem_ptr: 0, pmem_id: 0 };
        assert_eq!(
            text(&line(|l| malloc_line(l, &failed))),
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
        let l = line(|l| malloc_line(l, &m));
        assert_eq!(l.as_bytes().len(), 164);
        assert_eq!(
            text(&l),
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
                text(&line(|l| malloc_line(l, &m))),
                format!(
                    "{{\"hook\":\"malloc\",\"device_id\":{device_id},\"size\":{size},\"mem_size\":{mem_size},\"mem_ptr\":{mem_ptr},\"pmem_id\":\"{pmem_id:#x}\"}}\n"
                )
            );
            let a = AllocEvent { device_id, mem_size, mem_ptr };
            assert_eq!(
                text(&line(|l| alloc_line(l, &a))),
                format!("{{\"hook\":\"alloc\",\"device_id\":{device_id},\"mem_size\":{mem_size},\"mem_ptr\":{mem_ptr}}}\n")
            );
            let f = FreeEvent { device_id, mem_size, mem_ptr, pmem_id };
            assert_eq!(
                text(&line(|l| free_line(l, &f))),
                format!(
                    "{{\"hook\":\"free\",\"device_id\":{device_id},\"mem_size\":{mem_size},\"mem_ptr\":{mem_ptr},\"pmem_id\":\"{pmem_id:#x}\"}}\n"
                )
            );
        }
    }
}
