//! The segment rules of [`GrowthPolicy::Segments`](super::GrowthPolicy::Segments): what size of
//! raw block a miss asks for, and which of an arena's two free lists a request and a chunk use.
//!
//! PyTorch's caching allocator settles because it never asks the driver for exactly the request:
//! requests of at most 1 MiB come from 2 MiB blocks, requests up to 10 MiB from 20 MiB blocks,
//! larger ones from blocks rounded up to 2 MiB, and the small and the large requests never share a
//! block, so a long-lived small tensor cannot pin a large block. gpumem keeps those classes (its
//! `kMinLargeAlloc`, `kSmallBuffer`, `kLargeBuffer`, `kRoundLarge`) and adds what PyTorch lacks:
//! on a miss, the whole free blocks of the same class in the arena are given back and one block as
//! large as all of them (or as the request, if that is larger) is asked for instead. A miss so
//! grows the memory held by at most what the request lacks, and the transient blocks of a
//! training loop's first step fuse into a few large ones, which the later steps cut up again
//! without a raw call.
//!
//! With expandable segments the two classes share one growing block, where PyTorch keeps a
//! segment for each: a growing block gives memory back only from its free tail, which any live
//! chunk before it pins, small or large, so the classes protect nothing there. Replayed (with
//! growth in 20 MiB steps, before the 1/64 rule of [`growth`]), one block held less on GPT-2's
//! steps (1.0028 held over in use against 1.0033) and the random trace (1.66 against 1.67), 0.1 %
//! more on BERT's (1.0110 against 1.0099), with fewer raw allocations on all three (171 against
//! 173, 48 against 111, 154 against 157).
//!
//! With stitching the requests of at most [`STITCH_SMALL_REQUEST`] (256 KiB) are kept apart
//! again, in a growing block of their own: a page moves only when no live chunk lies in it, and a
//! small chunk left in a large request's page keeps that page (2 MiB) from moving. The bound is
//! lower than PyTorch's 1 MiB because the requests between the two are many in generation (a
//! growing KV cache), and apart from the large ones they held pages of their own that the large
//! requests could not take. Replayed through the pool (`gpumem-trace recommend`, `Segments` with
//! stitching; held over in use, raw allocations), one growing block for all / apart at 256 KiB /
//! apart at 1 MiB:
//!
//! | trace | one block | apart at 256 KiB | apart at 1 MiB |
//! | --- | --- | --- | --- |
//! | GPT-2 `generate()`, varied lengths (recorded through the C ABI) | 1.020, 68 | 1.030, 76 | 1.074, 102 |
//! | ResNet-50 training, 6 steps (recorded through the C ABI) | 1.008, 281 | 1.005, 275 | 1.009, 444 |
//! | random trace, one stream, median of seeds 1 to 50 | 1.0504, 155 | 1.0398, 197 | 1.0423, 303 |
//! | GPT-2 training | 1.0011, 255 | 1.0018, 256 | 1.0016, 256 |
//! | BERT fine-tuning | 1.0036, 307 | 1.0041, 306 | 1.0031, 305 |
//! | ViT-B/16 training | 1.0078, 214 | 1.0100, 216 | 1.0071, 225 |

use super::UNIT;

/// Requests of at most this many bytes are small: they come from small blocks only.
pub(crate) const SMALL_REQUEST: usize = 1 << 20;
/// With stitching, requests of at most this many bytes come from a growing block of their own.
pub(crate) const STITCH_SMALL_REQUEST: usize = 256 << 10;
/// The `small_up_to` of an arena whose requests all share its blocks.
pub(crate) const ONE_CLASS: usize = usize::MAX;
/// The raw block a small miss asks for.
pub(crate) const SMALL_BLOCK: usize = 2 << 20;
/// Requests above [`SMALL_REQUEST`] and below this come from blocks of [`MID_BLOCK`] bytes.
pub(crate) const MID_REQUEST: usize = 10 << 20;
/// The raw block a mid-sized miss asks for.
pub(crate) const MID_BLOCK: usize = 20 << 20;
/// Larger requests ask for a block rounded up to this.
pub(crate) const LARGE_ROUND: usize = 2 << 20;

/// The free list (0: small, 1: large) of a request or chunk of `size` bytes in an arena whose
/// small requests are those of at most `small_up_to` bytes ([`ONE_CLASS`]: all are, one list).
#[inline(always)]
pub(crate) fn class(size: usize, small_up_to: usize) -> usize {
    usize::from(size > small_up_to)
}

/// The raw block a miss of `size` bytes (rounded to the unit) asks for, given `fused` bytes of
/// whole free blocks of the same class that are given back for it. `None` when it overflows.
pub(crate) fn block_size(size: usize, fused: usize) -> Option<usize> {
    let own = if size <= SMALL_REQUEST {
        SMALL_BLOCK
    } else if size < MID_REQUEST {
        MID_BLOCK
    } else {
        size.checked_next_multiple_of(LARGE_ROUND)?
    };
    debug_assert!(own.is_multiple_of(UNIT) && fused.is_multiple_of(UNIT));
    if size <= SMALL_REQUEST {
        // Small blocks stay small: fusing them would make a large block out of small ones.
        return Some(own);
    }
    Some(own.max(fused.checked_next_multiple_of(LARGE_ROUND)?))
}

/// With expandable segments, how far a miss of `size` bytes grows its block, when its free tail
/// lacks `lacking` bytes (whole granules) and the block maps `mapped` bytes: a large request's
/// block grows by at least [`MID_BLOCK`] bytes (PyTorch's expandable segments map large memory in
/// pieces of that size) and by at least 1/[`GROWTH_FRACTION`] of what it maps, so that a block
/// of tens of gigabytes grows in steps that keep pace with it; a small request's by what it
/// lacks. Each growth is three driver calls; what a step grows beyond its need is at most one
/// such step per arena (1/256 of what it maps, or 20 MiB), and that excess is held at the peak:
/// the growth that meets the peak is the last one. So the fraction trades memory held for
/// growths, and the growths of a loop's first steps are few enough that memory wins.
///
/// Replayed (the host replay of the recorded traces, Segments with expandable segments, held over
/// in use and raw calls):
///
/// | growth at least | GPT-2 training | BERT fine-tuning | ViT-B/16 training |
/// | --- | --- | --- | --- |
/// | 20 MiB only | 1.0028, 171 | 1.0110, 154 | 1.0261, 120 |
/// | **1/256 of the block** | 1.0028, 171 | 1.0110, 154 | 1.0261, 120 |
/// | 1/128 | 1.0028, 156 | 1.0141, 144 | 1.0261, 120 |
/// | 1/64 | 1.0028, 126 | 1.0183, 115 | 1.0374, 111 |
/// | 1/32 | 1.0028, 91 | 1.0167, 81 | 1.0549, 86 |
///
/// The random trace holds the same under 1/64 and 1/256 (1.660 on four streams, 1.055 shared
/// across them). Below 5 GiB, 1/256 grows as 20 MiB steps do; a block that grows without freeing
/// grows 368 times for 400 tensors of 30 MiB (12 GiB; 1/64: under 200) and 776 times for 2,000
/// (59 GiB), where 20 MiB steps would grow once per tensor.
pub(crate) fn growth(size: usize, lacking: usize, granule: usize, mapped: usize) -> usize {
    if size <= SMALL_REQUEST {
        return lacking;
    }
    let granule = granule.max(1);
    let step = MID_BLOCK.max(mapped / GROWTH_FRACTION).next_multiple_of(granule);
    lacking.max(step)
}

/// A large request's growth is at least `1 / GROWTH_FRACTION` of what its block maps.
pub(crate) const GROWTH_FRACTION: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_follow_the_classes() {
        assert_eq!(block_size(UNIT, 0), Some(SMALL_BLOCK));
        assert_eq!(block_size(SMALL_REQUEST, 0), Some(SMALL_BLOCK));
        assert_eq!(block_size(SMALL_REQUEST + UNIT, 0), Some(MID_BLOCK));
        assert_eq!(block_size(MID_REQUEST, 0), Some(MID_REQUEST));
        assert_eq!(block_size(MID_REQUEST + UNIT, 0), Some(MID_REQUEST + LARGE_ROUND));
        assert_eq!(block_size(usize::MAX / UNIT * UNIT, 0), None);
    }

    #[test]
    fn fused_blocks_make_one_block_as_large_as_all() {
        assert_eq!(block_size(3 << 20, 60 << 20), Some(60 << 20));
        assert_eq!(block_size(30 << 20, (20 << 20) + UNIT), Some(30 << 20));
        assert_eq!(block_size(30 << 20, 41 << 20), Some(42 << 20));
        assert_eq!(block_size(UNIT, 8 << 20), Some(SMALL_BLOCK), "small blocks do not fuse");
    }

    #[test]
    fn large_requests_grow_their_block_by_at_least_a_mid_block() {
        const G: usize = 2 << 20;
        assert_eq!(growth(SMALL_REQUEST, G, G, 0), G, "small blocks grow by what they lack");
        assert_eq!(growth(SMALL_REQUEST, G, G, 64 << 30), G, "whatever the block maps");
        assert_eq!(growth(SMALL_REQUEST + UNIT, G, G, 0), MID_BLOCK);
        assert_eq!(growth(100 << 20, 64 << 20, G, 0), 64 << 20, "never less than what is lacking");
        assert_eq!(growth(100 << 20, G, 3 << 20, 0), 21 << 20, "whole granules");
    }

    #[test]
    fn large_blocks_grow_by_a_fraction_of_what_they_map() {
        const G: usize = 2 << 20;
        assert_eq!(growth(30 << 20, G, G, 4 << 30), MID_BLOCK, "4 GiB / 256 is under 20 MiB");
        assert_eq!(growth(30 << 20, G, G, 16 << 30), 64 << 20, "16 GiB / 256");
        assert_eq!(growth(30 << 20, G, G, (16 << 30) + (256 << 20)), 66 << 20, "65 MiB, in granules");
        assert_eq!(growth(30 << 20, 200 << 20, G, 16 << 30), 200 << 20, "never less than lacking");
    }

    #[test]
    fn only_segmented_arenas_have_two_classes() {
        assert_eq!(class(SMALL_REQUEST, SMALL_REQUEST), 0);
        assert_eq!(class(SMALL_REQUEST + UNIT, SMALL_REQUEST), 1);
        assert_eq!(class(usize::MAX, ONE_CLASS), 0);
    }
}
