//! [`LineEnds`]: the ends of recent chunks' malloc and free lines, kept formatted.
//!
//! A chunk's malloc line and its free line end alike, from `,"mem_size":` on (its size, its
//! address, its `pmem_id`), and a caching pool lends the same chunks again and again: that is
//! what it is for. So the hook keeps the end of the last line of each of [`SLOTS`] chunks,
//! in a table indexed by the low bits of the `pmem_id` (the chunk's slot in its arena), and
//! formats the end only when its entry holds another chunk's: a copy of 96 bytes in place of
//! three numbers' digits. It costs the hook 32 KiB.

use super::line::Line;

/// The longest end: `,"mem_size":` and `,"mem_ptr":` with 20 digits each, then `,"pmem_id":"`,
/// 18 characters of hex and `"}` and the newline.
pub(super) const END_CAP: usize = 12 + 20 + 11 + 20 + 12 + 18 + 3;

/// Entries of the table: a power of two, so the index is a mask.
pub(super) const SLOTS: usize = 256;

/// One chunk's line end, right-aligned in `text`.
#[derive(Clone, Copy)]
struct End {
    mem_size: usize,
    mem_ptr: usize,
    pmem_id: u64,
    len: usize,
    text: [u8; END_CAP],
}

/// The table of line ends (see the module docs).
pub(super) struct LineEnds(Box<[End; SLOTS]>);

impl LineEnds {
    /// Every entry holds the end for size, address and id 0 (a failed allocation of nothing):
    /// an entry's text is always its key's, so a match needs no other check.
    pub(super) fn new() -> Self {
        let mut buf = [0; super::line::LINE_CAP];
        let mut l = Line::new(&mut buf);
        format_end(&mut l, 0, 0, 0);
        let zero = End { mem_size: 0, mem_ptr: 0, pmem_id: 0, len: l.len(), text: *l.last() };
        LineEnds(Box::new([zero; SLOTS]))
    }

    /// Starts `l` (still empty) with the end `,"mem_size":..,"mem_ptr":..,"pmem_id":".."}\n`:
    /// copied from the table if it holds this chunk's, formatted (and kept) if not.
    #[inline(always)]
    pub(super) fn put_end(&mut self, l: &mut Line<'_>, mem_size: usize, mem_ptr: usize, pmem_id: u64) {
        let e = &mut self.0[pmem_id as usize % SLOTS];
        if e.mem_size == mem_size && e.mem_ptr == mem_ptr && e.pmem_id == pmem_id {
            l.start_with(&e.text, e.len);
            return;
        }
        format_end(l, mem_size, mem_ptr, pmem_id);
        *e = End { mem_size, mem_ptr, pmem_id, len: l.len(), text: *l.last() };
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
    /// another chunk of the same index (ids `SLOTS` apart), or nothing yet (key 0).
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
        for round in 0..4_000usize {
            let (mem_size, mem_ptr, pmem_id) = keys[(next() as usize ^ round) % keys.len()];
            let end = line(|l| ends.put_end(l, mem_size, mem_ptr, pmem_id));
            assert_eq!(end, reference(mem_size, mem_ptr, pmem_id));
        }
    }
}
