//! Rectangular index regions of an array and copies between row-major buffers that hold them.

use std::ops::Range;

/// A rectangular set of indices of an array: one half-open range per dimension, in global
/// coordinates. A rank-0 array has the empty region list and one element.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Region(Vec<Range<u64>>);

impl Region {
    /// A region from per-dimension ranges.
    pub fn new(ranges: Vec<Range<u64>>) -> Self {
        Self(ranges)
    }

    /// The whole of an array of `shape`.
    pub fn full(shape: &[u64]) -> Self {
        Self(shape.iter().map(|&s| 0..s).collect())
    }

    /// The per-dimension ranges.
    pub fn ranges(&self) -> &[Range<u64>] {
        &self.0
    }

    /// The extent along each dimension.
    pub fn shape(&self) -> Vec<u64> {
        self.0.iter().map(|r| r.end - r.start).collect()
    }

    /// The number of elements (1 for rank 0).
    pub fn num_elements(&self) -> u64 {
        self.0.iter().map(|r| r.end - r.start).product()
    }

    /// The indices in both regions, or `None` when they do not overlap.
    pub fn intersect(&self, other: &Region) -> Option<Region> {
        assert_eq!(self.0.len(), other.0.len(), "intersecting regions of different rank");
        let mut out = Vec::with_capacity(self.0.len());
        for (a, b) in self.0.iter().zip(&other.0) {
            let (start, end) = (a.start.max(b.start), a.end.min(b.end));
            if start >= end {
                return None;
            }
            out.push(start..end);
        }
        Some(Region(out))
    }

    /// Whether `other` lies entirely inside this region.
    pub fn contains(&self, other: &Region) -> bool {
        self.0.len() == other.0.len()
            && self.0.iter().zip(&other.0).all(|(a, b)| a.start <= b.start && b.end <= a.end)
    }
}

/// Copies the elements of `region` (global coordinates) from `src`, a row-major buffer holding
/// `src_region`, into `dst`, a row-major buffer holding `dst_region`.
///
/// Runs along the trailing dimensions that both buffers hold whole are copied as one slice, so
/// a copy between identical layouts is a single `memcpy`.
///
/// # Panics
/// If `region` is not inside both buffers' regions or a buffer's length does not match its
/// region: callers validate shapes first, so this is a bug, not bad input.
pub fn copy_region(
    src: &[u8],
    src_region: &Region,
    dst: &mut [u8],
    dst_region: &Region,
    region: &Region,
    elem_size: usize,
) {
    assert!(src_region.contains(region), "copy source {src_region:?} does not hold {region:?}");
    assert!(dst_region.contains(region), "copy destination {dst_region:?} does not hold {region:?}");
    assert_eq!(src.len() as u64, src_region.num_elements() * elem_size as u64, "source length");
    assert_eq!(dst.len() as u64, dst_region.num_elements() * elem_size as u64, "destination length");
    if region.num_elements() == 0 {
        return;
    }
    for_each_run(src_region, dst_region, region, elem_size as u64, |s, d, len| {
        let (s, d, len) = (s as usize, d as usize, len as usize);
        dst[d..d + len].copy_from_slice(&src[s..s + len]);
    });
}

/// Calls `f(src_offset, dst_offset, len)` (bytes) for every row-major run of `overlap` between a
/// buffer holding `src` and one holding `dst`. Trailing dimensions that all three span whole
/// merge into one run, so identical layouts give a single call. [`copy_region`] copies by it;
/// a checkpoint's restore reads by it, straight from a shard's bytes into a device's buffer.
pub fn for_each_run(
    src: &Region,
    dst: &Region,
    overlap: &Region,
    elem: u64,
    mut f: impl FnMut(u64, u64, u64),
) {
    let rank = overlap.ranges().len();
    let (src_shape, dst_shape, shape) = (src.shape(), dst.shape(), overlap.shape());
    let mut run = elem;
    let mut outer = rank;
    while outer > 0 {
        let d = outer - 1;
        run *= shape[d];
        outer -= 1;
        if shape[d] != src_shape[d] || shape[d] != dst_shape[d] {
            break;
        }
    }
    let strides = |s: &[u64]| {
        let mut out = vec![elem; rank];
        for d in (0..rank.saturating_sub(1)).rev() {
            out[d] = out[d + 1] * s[d + 1];
        }
        out
    };
    let (src_strides, dst_strides) = (strides(&src_shape), strides(&dst_shape));
    let offset = |index: &[u64], buf: &Region, strides: &[u64]| -> u64 {
        (0..rank).map(|d| (index[d] - buf.ranges()[d].start) * strides[d]).sum()
    };
    let mut index: Vec<u64> = overlap.ranges().iter().map(|r| r.start).collect();
    loop {
        f(offset(&index, src, &src_strides), offset(&index, dst, &dst_strides), run);
        let mut dim = outer;
        loop {
            if dim == 0 {
                return;
            }
            dim -= 1;
            index[dim] += 1;
            if index[dim] < overlap.ranges()[dim].end {
                break;
            }
            index[dim] = overlap.ranges()[dim].start;
        }
    }
}

#[cfg(test)]
// `vec![0..2]` is a rank-1 region here, not a mistaken range of elements.
#[allow(clippy::single_range_in_vec_init)]
mod tests {
    use super::*;

    fn array(shape: &[u64]) -> Vec<u8> {
        let n: u64 = shape.iter().product();
        (0..n).map(|i| i as u8).collect()
    }

    #[test]
    fn extracts_a_shard_and_puts_it_back() {
        let shape = [4u64, 6];
        let full = Region::full(&shape);
        let src = array(&shape);
        let shard = Region::new(vec![2..4, 3..6]);
        let mut piece = vec![0u8; 6];
        copy_region(&src, &full, &mut piece, &shard, &shard, 1);
        assert_eq!(piece, vec![15, 16, 17, 21, 22, 23]);
        let mut back = vec![0u8; 24];
        copy_region(&piece, &shard, &mut back, &full, &shard, 1);
        assert_eq!(&back[15..18], &[15, 16, 17]);
        assert_eq!(&back[21..24], &[21, 22, 23]);
        assert_eq!(back.iter().filter(|&&b| b != 0).count(), 6);
    }

    #[test]
    fn reshards_through_intersections() {
        // Saved as 2 row shards, restored as 3 column shards of a 4x6 array of u16.
        let shape = [4u64, 6];
        let full = Region::full(&shape);
        let src: Vec<u8> = (0..24u16).flat_map(|v| v.to_le_bytes()).collect();
        let saved: Vec<(Region, Vec<u8>)> = [0..2u64, 2..4]
            .into_iter()
            .map(|rows| {
                let r = Region::new(vec![rows, 0..6]);
                let mut buf = vec![0u8; r.num_elements() as usize * 2];
                copy_region(&src, &full, &mut buf, &r, &r, 2);
                (r, buf)
            })
            .collect();
        let mut rebuilt = vec![0u8; 48];
        for cols in [0..2u64, 2..4, 4..6] {
            let target = Region::new(vec![0..4, cols]);
            let mut piece = vec![0u8; target.num_elements() as usize * 2];
            for (r, buf) in &saved {
                let overlap = r.intersect(&target).unwrap();
                copy_region(buf, r, &mut piece, &target, &overlap, 2);
            }
            copy_region(&piece, &target, &mut rebuilt, &full, &target, 2);
        }
        assert_eq!(rebuilt, src);
    }

    #[test]
    fn rank_zero_and_disjoint_regions() {
        let scalar = Region::full(&[]);
        assert_eq!(scalar.num_elements(), 1);
        let mut dst = [0u8; 4];
        copy_region(&[1, 2, 3, 4], &scalar, &mut dst, &scalar, &scalar, 4);
        assert_eq!(dst, [1, 2, 3, 4]);
        assert!(Region::new(vec![0..2]).intersect(&Region::new(vec![2..4])).is_none());
    }

    #[test]
    fn three_dims_with_partial_middle() {
        let shape = [2u64, 3, 4];
        let full = Region::full(&shape);
        let src = array(&shape);
        let r = Region::new(vec![0..2, 1..3, 0..4]);
        let mut out = vec![0u8; 16];
        copy_region(&src, &full, &mut out, &r, &r, 1);
        assert_eq!(out, vec![4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23]);
    }
}
