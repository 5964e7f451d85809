//! [`LineEnds`]: the ends of recent chunks' malloc and free lines, kept formatted.
//!
//! A chunk's malloc line and its free line end alike, from `,"mem_size":` on (its size, its
//! address, its `pmem_id`), and a caching pool lends the same chunks again and again: that is
//! what it is for. So the hook keeps the end of the last line of each of [`SLOTS`] chunks,
//! in a table indexed by the low bits of the `pmem_id` (the chunk's slot in its arena), and
//! formats the end only when its entry holds another chunk's: a copy of 124 bytes in place of
//! three numbers' digits. The entry also keeps the `,"size":` before the end of the chunk's
//! last malloc line, for a malloc that asks for the same size again. It costs the hook 44 KiB.

use super::line::Line;

/// The longest end: `,"mem_size":` and `,"mem_ptr":` with 20 digits each, then `,"pmem_id":"`,
/// 18 characters of hex and `"}` and the newline.
pub(super) const END_CAP: usize = 12 + 20 + 11 + 20 + 12 + 18 + 3;

/// Entries of the table: a power of two, so the index is a mask.
pub(super) const SLOTS: usize = 256;

/// `,"size":` and 20 digits: what a malloc line has between its head and its end.
const SIZE_CAP: usize = 8 + 20;

/// The bytes an entry keeps: a malloc line's size, then the end.
const TEXT_CAP: usize = SIZE_CAP + END_CAP;

/// One chunk's line end, right-aligned in `text`, and before it, when `sized_len` is not 0,
/// `,"size":{size}` (the last `sized_len` bytes of `text` are a malloc line's from its size on).
#[derive(Clone, Copy)]
struct End {
    mem_size: usize,
    mem_ptr: usize,
    pmem_id: u64,
    /// The length of the end.
    len: usize,
    size: usize,
    /// The length of the size and the end together; 0 when `text` holds no size.
    sized_len: usize,
    text: [u8; TEXT_CAP],
}

impl End {
    /// Whether this entry holds the end of that chunk's lines.
    #[inline(always)]
    fn holds(&self, mem_size: usize, mem_ptr: usize, pmem_id: u64) -> bool {
        self.mem_size == mem_size && self.mem_ptr == mem_ptr && self.pmem_id == pmem_id
    }
}

/// The table of line ends (see the module docs).
pub(super) struct LineEnds(Box<[End; SLOTS]>);

impl LineEnds {
    /// Every entry holds the end for size, address and id 0 (a failed allocation of nothing),
    /// without a size: an entry's text is always its key's, so a match needs no other check.
    pub(super) fn new() -> Self {
        let mut buf = [0; super::line::LINE_CAP];
        let mut l = Line::new(&mut buf);
        format_end(&mut l, 0, 0, 0);
        let zero =
            End { mem_size: 0, mem_ptr: 0, pmem_id: 0, len: l.len(), size: 0, sized_len: 0, text: *l.last() };
        LineEnds(Box::new([zero; SLOTS]))
    }

    /// The entry of chunk `pmem_id`, holding its end: copied into `l` (still empty) if the entry
    /// held this chunk's, formatted into `l` and kept if not (the entry then holds no size).
    #[inline(always)]
    fn end(&mut self, l: &mut Line<'_>, mem_size: usize, mem_ptr: usize, pmem_id: u64) -> &mut End {
        let e = &mut self.0[pmem_id as usize % SLOTS];
        if e.holds(mem_size, mem_ptr, pmem_id) {
            l.start_with(&e.text, e.len);
        } else {
            format_end(l, mem_size, mem_ptr, pmem_id);
            *e = End { mem_size, mem_ptr, pmem_id, len: l.len(), size: 0, sized_len: 0, text: *l.last() };
        }
        e
    }

    /// Starts `l` (still empty) with a free line's end,
    /// `,"mem_size":..,"mem_ptr":..,"pmem_id":".."}\n`.
    #[inline(always)]
    pub(super) fn put_end(&mut self, l: &mut Line<'_>, mem_size: usize, mem_ptr: usize, pmem_id: u64) {
        self.end(l, mem_size, mem_ptr, pmem_id);
    }

    /// Starts `l` (still empty) with a malloc line's size and end, `,"size":..` and the end of
    /// [`LineEnds::put_end`]: one copy when the chunk's last malloc asked for `size` too.
    #[inline(always)]
    pub(super) fn put_sized_end(
        &mut self,
        l: &mut Line<'_>,
        size: usize,
        mem_size: usize,
        mem_ptr: usize,
        pmem_id: u64,
    ) {
        let e = &mut self.0[pmem_id as usize % SLOTS];
        if e.holds(mem_size, mem_ptr, pmem_id) && e.size == size && e.sized_len != 0 {
            l.start_with(&e.text, e.sized_len);
            return;
        }
        let e = self.end(l, mem_size, mem_ptr, pmem_id);
        l.unsigned(size);
        l.put(b",\"size\":");
        (e.size, e.sized_len, e.text) = (size, l.len(), *l.last());
    }
}

/// Formats the end into an empty `l` (backwards, as lines are built).
#[inline(always)]
fn format_end(l: &mut Line<'_>, mem_size: usize, mem_ptr: usize, pmem_id: u64) {
    l.put(b"\"}\n");
    l.hex(pmem_id);
    l.put(b",\"pmem_id\":\"");
    l.unsigned(mem_ptr);
    l.put(b",\"mem_ptr\":");
    l.unsigned(mem_size);
    l.put(b",\"mem_size\":");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::debug_print::line::tests::line;

    fn reference(mem_size: usize, mem_ptr: usize, pmem_id: u64) -> String {
        format!(",\"mem_size\":{mem_size},\"mem_ptr\":{mem_ptr},\"pmem_id\":\"{pmem_id:#x}\"}}\n")
    }

    #[test]
    fn the_longest_end_fits() {
        let end = line(|l| format_end(l, usize::MAX, usize::MAX, u64::MAX));
        assert_eq!(end.len(), END_CAP);
        assert_eq!(end, reference(usize::MAX, usize::MAX, u64::MAX));
    }

    /// Kept ends come back as formatted ones would, whether the entry held the chunk (a repeat),
    /// another chunk of the same index (ids `SLOTS` apart), or nothing yet (key 0); and a
    /// malloc's size with them, whether the chunk's last line was a malloc of the same size, of
    /// another, or a free.
    #[test]
    fn kept_ends_equal_formatted_ones() {
        let mut ends = LineEnds::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let keys: Vec<(usize, usize, u64)> = (0..64u64)
            .map(|i| {
                let bits = 1 + (i % 64) as u32;
                let mask = if bits == 64 { u64::MAX } else { (1 << bits) - 1 };
                // Ids in four groups that share their indices.
                ((next() & mask) as usize, (next() & mask) as usize, (i % 16) + (i / 16) * SLOTS as u64)
            })
            .chain([(0, 0, 0), (512, 0, 0), (0, 0, SLOTS as u64)])
            .collect();
        let sizes = [0usize, 1, 24, 512, 513, usize::MAX];
        for round in 0..8_000usize {
            let r = next() as usize ^ round;
            let (mem_size, mem_ptr, pmem_id) = keys[r % keys.len()];
            if r.is_multiple_of(3) {
                let end = line(|l| ends.put_end(l, mem_size, mem_ptr, pmem_id));
                assert_eq!(end, reference(mem_size, mem_ptr, pmem_id));
            } else {
                let size = sizes[(r / 3) % sizes.len()];
                let end = line(|l| ends.put_sized_end(l, size, mem_size, mem_ptr, pmem_id));
                assert_eq!(end, format!(",\"size\":{size}{}", reference(mem_size, mem_ptr, pmem_id)));
            }
        }
    }

    #[test]
    fn the_longest_size_and_end_fit() {
        let mut ends = LineEnds::new();
        for _ in 0..2 {
            let text = line(|l| ends.put_sized_end(l, usize::MAX, usize::MAX, usize::MAX, u64::MAX));
            assert_eq!(text.len(), TEXT_CAP);
            assert_eq!(
                text,
                format!(",\"size\":{}{}", usize::MAX, reference(usize::MAX, usize::MAX, u64::MAX))
            );
        }
    }
}
