//! [`DebugPrintHook`]: one JSON line per allocation, pool allocation and free.

use std::cell::{Ref, RefCell, RefMut};
use std::fmt;
use std::io::{self, Write};

use gpumem_core::hooks::Callbacks;
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
/// Each line is formatted into a buffer the hook keeps (no allocation, no `fmt` machinery, no
/// loop over digits) and handed to the writer with a single `write_all` (the newline included),
/// then the writer is flushed if `flush` is set (the default, as in CuPy). The hook declares
/// only its three callbacks ([`MemoryHook::callbacks`]), so the pool skips the pre callbacks.
/// A `BufWriter` over a file with `flush` off is the fast setting, since each flush of a file
/// is a system call. A write or flush error is returned from the callback, so it reaches
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

/// The writer and the buffer lines are formatted in, behind one `RefCell` so an event takes one
/// borrow. The buffer is kept between events: it is never cleared, since a line only reads the
/// bytes it wrote.
struct Output<W> {
    line: [u8; LINE_CAP],
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
        DebugPrintHook { out: RefCell::new(Output { line: [0; LINE_CAP], file }), flush }
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
    fn emit(&self, format: impl FnOnce(&mut Line<'_>)) -> HookResult {
        let mut out =
            self.out.try_borrow_mut().map_err(|_| "the writer is already in use (re-entrant call)")?;
        let Output { line, file } = &mut *out;
        let mut l = Line::new(line);
        format(&mut l);
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
fn malloc_line(l: &mut Line<'_>, e: &MallocEvent) {
    l.put(b"\"}\n");
    l.hex(e.pmem_id);
    l.put(b",\"pmem_id\":\"");
    l.unsigned(e.mem_ptr);
    l.put(b",\"mem_ptr\":");
    l.unsigned(e.mem_size);
    l.put(b",\"mem_size\":");
    l.unsigned(e.size);
    l.put(b",\"size\":");
    l.signed(e.device_id);
    l.put(b"{\"hook\":\"malloc\",\"device_id\":");
}

#[inline(always)]
fn free_line(l: &mut Line<'_>, e: &FreeEvent) {
    l.put(b"\"}\n");
    l.hex(e.pmem_id);
    l.put(b",\"pmem_id\":\"");
    l.unsigned(e.mem_ptr);
    l.put(b",\"mem_ptr\":");
    l.unsigned(e.mem_size);
    l.put(b",\"mem_size\":");
    l.signed(e.device_id);
    l.put(b"{\"hook\":\"free\",\"device_id\":");
}

/// The longest line: the malloc line's 105 bytes of keys and punctuation, an `i32`, three
/// 20-digit integers and an 18-character hex id come to 164 bytes.
const LINE_CAP: usize = 192;

/// `"00" "01" ... "99"`: two digits per division by 100, copied as one two-byte move.
const PAIRS: [[u8; 2]; 100] = {
    let mut t = [[0; 2]; 100];
    let mut i = 0;
    while i < 100 {
        t[i] = [b'0' + (i / 10) as u8, b'0' + (i % 10) as u8];
        i += 1;
    }
    t
};

/// A line formatted without `fmt` machinery into a buffer, from its last byte back to its first:
/// a number's digits come out last digit first, so writing backwards needs neither its length
/// up front nor a temporary to copy from. The position is a local of the caller once this is
/// inlined, so formatting a line is stores and arithmetic, with no call.
struct Line<'a> {
    buf: &'a mut [u8; LINE_CAP],
    /// The line is `buf[start..]`.
    start: usize,
}

impl<'a> Line<'a> {
    #[inline]
    fn new(buf: &'a mut [u8; LINE_CAP]) -> Self {
        Line { buf, start: LINE_CAP }
    }

    #[inline]
    fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// Prepends a literal; its length is a constant, so the copy is a few moves, not a call.
    #[inline(always)]
    fn put<const N: usize>(&mut self, s: &[u8; N]) {
        self.start -= N;
        self.buf[self.start..self.start + N].copy_from_slice(s);
    }

    /// Prepends the two digits of `d < 100`.
    #[inline(always)]
    fn pair(&mut self, d: u32) {
        self.put(&PAIRS[d as usize]);
    }

    /// `%d` of an unsigned value.
    #[inline(always)]
    fn unsigned(&mut self, v: usize) {
        self.decimal(v as u64);
    }

    /// `%d` of a signed value (a device number: one digit, nearly always).
    #[inline(always)]
    fn signed(&mut self, v: i32) {
        if let Ok(d @ 0..=9) = u8::try_from(v) {
            self.put(&[b'0' + d]);
            return;
        }
        self.decimal(u64::from(v.unsigned_abs()));
        if v < 0 {
            self.put(b"-");
        }
    }

    /// Prepends the digits: eight at a time in 32-bit arithmetic (a `u64` has at most three
    /// such groups), two per division by 100 within a group.
    #[inline(always)]
    fn decimal(&mut self, v: u64) {
        const E8: u64 = 100_000_000;
        if v < E8 {
            self.digits(v as u32);
        } else if v < E8 * E8 {
            self.eight((v % E8) as u32);
            self.digits((v / E8) as u32);
        } else {
            self.eight((v % E8) as u32);
            let v = v / E8;
            self.eight((v % E8) as u32);
            self.digits((v / E8) as u32);
        }
    }

    /// Exactly eight digits of `v < 10^8`, leading zeros included.
    #[inline(always)]
    fn eight(&mut self, v: u32) {
        let (high, low) = (v / 10_000, v % 10_000);
        self.pair(low % 100);
        self.pair(low / 100);
        self.pair(high % 100);
        self.pair(high / 100);
    }

    /// The digits of `v < 10^8`, without leading zeros (`0` for zero): no loop, at most four
    /// divisions.
    #[inline(always)]
    fn digits(&mut self, v: u32) {
        if v >= 10_000 {
            let (high, low) = (v / 10_000, v % 10_000);
            self.pair(low % 100);
            self.pair(low / 100);
            self.four(high);
        } else {
            self.four(v);
        }
    }

    /// The digits of `v < 10^4`, without leading zeros.
    #[inline(always)]
    fn four(&mut self, mut v: u32) {
        if v >= 100 {
            self.pair(v % 100);
            v /= 100;
        }
        if v >= 10 {
            self.pair(v);
        } else {
            self.put(&[b'0' + v as u8]);
        }
    }

    /// Python's `hex()`: `0x`, lowercase, no padding, `0x0` for zero. All sixteen digits are
    /// made at once (each nibble moved into a byte of its own, then turned into its character
    /// by arithmetic on the eight bytes of a word) and written before the line's start; the
    /// start then moves over the significant ones only, and the literal written next covers the
    /// leading zeros.
    #[inline(always)]
    fn hex(&mut self, v: u64) {
        let n = (64 - (v | 1).leading_zeros()).div_ceil(4) as usize;
        let at = self.start - 16;
        self.buf[at..at + 8].copy_from_slice(&hex8((v >> 32) as u32));
        self.buf[at + 8..at + 16].copy_from_slice(&hex8(v as u32));
        self.start -= n;
        self.put(b"0x");
    }
}

/// The eight lowercase hex digits of `x`, most significant first.
#[inline(always)]
fn hex8(x: u32) -> [u8; 8] {
    const ONES: u64 = 0x0101_0101_0101_0101;
    // Spread the nibbles, most significant into the most significant byte.
    let mut x = u64::from(x);
    x = (x | (x << 16)) & 0x0000_ffff_0000_ffff;
    x = (x | (x << 8)) & 0x00ff_00ff_00ff_00ff;
    x = (x | (x << 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    // A byte d of 10 or more gets 1 in `letters` (d + 6 carries into its high nibble; no byte
    // carries into the next): '0' + d, plus 39 for 'a'..'f'.
    let letters = ((x + 6 * ONES) >> 4) & ONES;
    (x + u64::from(b'0') * ONES + letters * 39).to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line `f` formats, in a buffer full of junk (the hook's buffer keeps old lines).
    fn line(f: impl FnOnce(&mut Line<'_>)) -> String {
        let mut buf = [b'#'; LINE_CAP];
        let mut l = Line::new(&mut buf);
        f(&mut l);
        text(&l)
    }

    fn text(l: &Line<'_>) -> String {
        String::from_utf8(l.as_bytes().to_vec()).unwrap()
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
            assert_eq!(line(|l| l.decimal(v)), v.to_string());
        }
        for v in [0i32, 1, -1, 9, 10, -9, -10, 99, 100, i32::MIN, i32::MIN + 1, i32::MAX] {
            assert_eq!(line(|l| l.signed(v)), v.to_string());
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
            assert_eq!(line(|l| l.hex(v)), s);
        }
        for shift in 0..64 {
            for v in [1u64 << shift, (1u64 << shift) - 1, (1u64 << shift) + 1] {
                assert_eq!(line(|l| l.hex(v)), format!("{v:#x}"));
            }
        }
    }

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
            line(|l| malloc_line(l, &m)),
            "{\"hook\":\"malloc\",\"device_id\":0,\"size\":24,\"mem_size\":512,\"mem_ptr\":150496608256,\"pmem_id\":\"0x7f39200c5278\"}\n"
        );
        let f =
            FreeEvent { device_id: 3, mem_size: 512, mem_ptr: 150_496_608_256, pmem_id: 0x7f39_200c_5278 };
        assert_eq!(
            line(|l| free_line(l, &f)),
            "{\"hook\":\"free\",\"device_id\":3,\"mem_size\":512,\"mem_ptr\":150496608256,\"pmem_id\":\"0x7f39200c5278\"}\n"
        );
        let failed = MallocEvent { device_id: 1, size: 7, mem_size: 512, mem_ptr: 0, pmem_id: 0 };
        assert_eq!(
            line(|l| malloc_line(l, &failed)),
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
                line(|l| malloc_line(l, &m)),
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
                line(|l| free_line(l, &f)),
                format!(
                    "{{\"hook\":\"free\",\"device_id\":{device_id},\"mem_size\":{mem_size},\"mem_ptr\":{mem_ptr},\"pmem_id\":\"{pmem_id:#x}\"}}\n"
                )
            );
        }
    }
}
