//! [`Line`]: a line formatted from its end back into a fixed buffer, with numbers as CuPy's
//! format strings print them (`%d`, Python's `hex()`).

/// The longest line: the malloc line's 105 bytes of keys and punctuation, an `i32`, three
/// 20-digit integers and an 18-character hex id come to 164 bytes.
pub(super) const LINE_CAP: usize = 192;

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
pub(super) struct Line<'a> {
    buf: &'a mut [u8; LINE_CAP],
    /// The line is `buf[start..]`.
    start: usize,
}

impl<'a> Line<'a> {
    #[inline]
    pub(super) fn new(buf: &'a mut [u8; LINE_CAP]) -> Self {
        Line { buf, start: LINE_CAP }
    }

    #[inline]
    pub(super) fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// The line's length so far.
    #[inline(always)]
    pub(super) fn len(&self) -> usize {
        LINE_CAP - self.start
    }

    /// The buffer's last `N` bytes: the line so far, right-aligned, and before it whatever the
    /// buffer held.
    #[inline(always)]
    pub(super) fn last<const N: usize>(&self) -> &[u8; N] {
        const { assert!(N <= LINE_CAP) };
        self.buf.last_chunk().expect("N is at most LINE_CAP")
    }

    /// Makes the line the last `len` bytes of `end` (right-aligned, as [`Line::last`] gives
    /// them; at most `N`): one copy of a constant length, whatever `len` is. The first thing
    /// written to a line, since it replaces what the line held.
    #[inline(always)]
    pub(super) fn start_with<const N: usize>(&mut self, end: &[u8; N], len: usize) {
        const { assert!(N <= LINE_CAP) };
        debug_assert_eq!(self.start, LINE_CAP, "a line starts with its end");
        *self.buf.last_chunk_mut::<N>().expect("N is at most LINE_CAP") = *end;
        self.start = LINE_CAP - len.min(N);
    }

    /// Prepends a literal; its length is a constant, so the copy is a few moves, not a call.
    #[inline(always)]
    pub(super) fn put<const N: usize>(&mut self, s: &[u8; N]) {
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
    pub(super) fn unsigned(&mut self, v: usize) {
        self.decimal(v as u64);
    }

    /// `%d` of a signed value (a device number: one digit, nearly always).
    #[inline(always)]
    pub(super) fn signed(&mut self, v: i32) {
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
    pub(super) fn hex(&mut self, v: u64) {
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
pub(super) mod tests {
    use super::*;

    /// The line `f` formats, in a buffer full of junk (the hook's buffer keeps old lines).
    pub(crate) fn line(f: impl FnOnce(&mut Line<'_>)) -> String {
        let mut buf = [b'#'; LINE_CAP];
        let mut l = Line::new(&mut buf);
        f(&mut l);
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
}
