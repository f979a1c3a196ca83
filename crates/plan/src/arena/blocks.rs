//! A set of byte ranges kept as sorted, disjoint, non-touching blocks: the union of the memory
//! taken by some placed buffers. Merging on insertion keeps it small, since a good plan packs
//! buffers side by side.

/// The union of half-open byte ranges `[start, end)`.
#[derive(Debug, Default, Clone)]
pub(super) struct Blocks {
    /// Sorted by start; `blocks[i].1 < blocks[i + 1].0` (neither overlapping nor touching).
    blocks: Vec<(u64, u64)>,
}

impl Blocks {
    /// Adds `[start, end)` (`start < end`), merging it with every block it overlaps or touches.
    pub(super) fn insert(&mut self, start: u64, end: u64) {
        let from = self.blocks.partition_point(|&(_, e)| e < start);
        let to = self.blocks.partition_point(|&(s, _)| s <= end);
        if from == to {
            self.blocks.insert(from, (start, end));
        } else {
            let merged = (
                start.min(self.blocks[from].0),
                end.max(self.blocks[to - 1].1),
            );
            self.blocks[from] = merged;
            self.blocks.drain(from + 1..to);
        }
    }

    /// The blocks, sorted by start.
    pub(super) fn as_slice(&self) -> &[(u64, u64)] {
        &self.blocks
    }
}

#[cfg(test)]
mod tests {
    use super::Blocks;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn blocks_are_the_union(ranges in prop::collection::vec((0u64..200, 1u64..30), 0..40)) {
            let mut blocks = Blocks::default();
            let mut covered = [false; 256];
            for &(start, len) in &ranges {
                blocks.insert(start, start + len);
                covered[start as usize..(start + len) as usize].fill(true);
            }
            let mut from_blocks = [false; 256];
            let slice = blocks.as_slice();
            for w in slice.windows(2) {
                prop_assert!(w[0].1 < w[1].0, "blocks touch or overlap: {:?}", slice);
            }
            for &(s, e) in slice {
                prop_assert!(s < e);
                from_blocks[s as usize..e as usize].fill(true);
            }
            prop_assert_eq!(covered, from_blocks);
        }
    }

    #[test]
    fn touching_ranges_merge() {
        let mut blocks = Blocks::default();
        blocks.insert(64, 128);
        blocks.insert(0, 64);
        blocks.insert(256, 320);
        assert_eq!(blocks.as_slice(), &[(0, 128), (256, 320)]);
        blocks.insert(100, 300);
        assert_eq!(blocks.as_slice(), &[(0, 320)]);
    }
}
