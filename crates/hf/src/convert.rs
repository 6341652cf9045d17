//! Element copies between a Hugging Face tensor and a podctl shard: dtype conversion and, for
//! `nn.Linear` weights, transposition, one block of a row-major matrix at a time.
//!
//! Conversions are exact or rounded to nearest even: BF16 -> F32 and F16 -> F32 are exact,
//! F32 -> BF16 rounds (so BF16 -> F32 -> BF16 gives back the same bits), same-type copies are
//! bit copies.

use crate::header::SourceDType;
use mesh::DType;
use std::ops::Range;

/// A block of a row-major source matrix `[_, width]` to copy: rows `rows` and columns `cols`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// Source rows of the block handled by this copy.
    pub rows: Range<u64>,
    /// Source columns of the block.
    pub cols: Range<u64>,
    /// The block's first row in the destination (the destination holds rows
    /// `first_row..first_row + block_rows`, of which `rows` is a part).
    pub first_row: u64,
    /// Rows of the whole destination block.
    pub block_rows: u64,
    /// The destination is the block transposed (`[cols, block_rows]`) rather than as-is
    /// (`[block_rows, cols]`).
    pub transposed: bool,
}

/// Copies `block` from `src` (source rows starting at `src_first_row`, `width` elements each,
/// of `from`) into `dst` (the destination block in `to`). Errors name the pair of dtypes podctl
/// does not convert between.
pub fn copy_block(
    src: &[u8],
    from: SourceDType,
    src_first_row: u64,
    width: u64,
    block: &Block,
    dst: &mut [u8],
    to: DType,
) -> Result<(), String> {
    let geometry = Geometry::new(src_first_row, width, block);
    match (from, to) {
        (SourceDType::F32, DType::Float32) | (SourceDType::Bf16, DType::Bfloat16) if !block.transposed => {
            geometry.copy_rows(src, dst, from.size())
        }
        (SourceDType::F32, DType::Float32) => geometry.run::<u32, u32>(src, dst, |x| x),
        (SourceDType::Bf16, DType::Bfloat16) => geometry.run::<u16, u16>(src, dst, |x| x),
        (SourceDType::Bf16, DType::Float32) => geometry.run::<u16, u32>(src, dst, |x| (x as u32) << 16),
        (SourceDType::F32, DType::Bfloat16) => geometry.run::<u32, u16>(src, dst, bf16_bits),
        (SourceDType::F16, DType::Float32) => {
            geometry.run::<u16, u32>(src, dst, |x| half::f16::from_bits(x).to_f32().to_bits())
        }
        (SourceDType::F16, DType::Bfloat16) => {
            geometry.run::<u16, u16>(src, dst, |x| bf16_bits(half::f16::from_bits(x).to_f32().to_bits()))
        }
        (from, to) => {
            return Err(format!(
                "{} weights cannot become {to} parameters; podctl's parameters are float32 or bfloat16",
                from.name()
            ));
        }
    }
    Ok(())
}

/// The bfloat16 nearest to a float32 (given as bits), ties to even; NaN stays NaN.
pub fn bf16_bits(bits: u32) -> u16 {
    checkpoint::export::f32_to_bf16(f32::from_bits(bits))
}

/// Elements as little-endian bits.
trait Bits: Copy {
    fn get(bytes: &[u8], index: usize) -> Self;
    fn put(self, bytes: &mut [u8], index: usize);
}

impl Bits for u16 {
    fn get(bytes: &[u8], index: usize) -> Self {
        u16::from_le_bytes([bytes[2 * index], bytes[2 * index + 1]])
    }
    fn put(self, bytes: &mut [u8], index: usize) {
        bytes[2 * index..2 * index + 2].copy_from_slice(&self.to_le_bytes());
    }
}

impl Bits for u32 {
    fn get(bytes: &[u8], index: usize) -> Self {
        u32::from_le_bytes(bytes[4 * index..4 * index + 4].try_into().expect("4 bytes"))
    }
    fn put(self, bytes: &mut [u8], index: usize) {
        bytes[4 * index..4 * index + 4].copy_from_slice(&self.to_le_bytes());
    }
}

/// Element offsets of one block copy.
struct Geometry {
    /// Source element index of (block row `rows.start`, column `cols.start`).
    src_origin: usize,
    width: usize,
    rows: usize,
    cols: usize,
    /// Destination row of `rows.start` within the block.
    dst_row: usize,
    block_rows: usize,
    transposed: bool,
}

/// Tile edge of the transposing copy: a tile's source rows and destination rows stay in cache.
const TILE: usize = 32;

impl Geometry {
    fn new(src_first_row: u64, width: u64, block: &Block) -> Self {
        Self {
            src_origin: ((block.rows.start - src_first_row) * width + block.cols.start) as usize,
            width: width as usize,
            rows: (block.rows.end - block.rows.start) as usize,
            cols: (block.cols.end - block.cols.start) as usize,
            dst_row: (block.rows.start - block.first_row) as usize,
            block_rows: block.block_rows as usize,
            transposed: block.transposed,
        }
    }

    /// A same-type copy as-is: each row's run of bytes at once.
    fn copy_rows(&self, src: &[u8], dst: &mut [u8], size: usize) {
        let Geometry { src_origin, width, rows, cols, dst_row, .. } = *self;
        for r in 0..rows {
            let from = (src_origin + r * width) * size;
            let to = (dst_row + r) * cols * size;
            dst[to..to + cols * size].copy_from_slice(&src[from..from + cols * size]);
        }
    }

    fn run<S: Bits, D: Bits>(&self, src: &[u8], dst: &mut [u8], convert: impl Fn(S) -> D) {
        let Geometry { src_origin, width, rows, cols, dst_row, block_rows, .. } = *self;
        if !self.transposed {
            for r in 0..rows {
                let from = src_origin + r * width;
                let to = (dst_row + r) * cols;
                for c in 0..cols {
                    convert(S::get(src, from + c)).put(dst, to + c);
                }
            }
            return;
        }
        for r0 in (0..rows).step_by(TILE) {
            for c0 in (0..cols).step_by(TILE) {
                for r in r0..(r0 + TILE).min(rows) {
                    let from = src_origin + r * width;
                    for c in c0..(c0 + TILE).min(cols) {
                        convert(S::get(src, from + c)).put(dst, c * block_rows + dst_row + r);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn as_f32(bytes: &[u8]) -> Vec<f32> {
        bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    }

    #[test]
    fn blocks_copy_as_is_and_transposed() {
        // A 4x5 source, values r * 10 + c; its rows 1..3 are in `src`.
        let all: Vec<f32> = (0..4).flat_map(|r| (0..5).map(move |c| (r * 10 + c) as f32)).collect();
        let src = f32s(&all[5..15]);
        // Rows 1..3, columns 1..4 of a destination block holding rows 0..3.
        let block = Block { rows: 1..3, cols: 1..4, first_row: 0, block_rows: 3, transposed: false };
        let mut dst = vec![0u8; 3 * 3 * 4];
        copy_block(&src, SourceDType::F32, 1, 5, &block, &mut dst, DType::Float32).unwrap();
        assert_eq!(as_f32(&dst), [0.0, 0.0, 0.0, 11.0, 12.0, 13.0, 21.0, 22.0, 23.0]);
        let mut dst = vec![0u8; 3 * 3 * 4];
        copy_block(
            &src,
            SourceDType::F32,
            1,
            5,
            &Block { transposed: true, ..block },
            &mut dst,
            DType::Float32,
        )
        .unwrap();
        // [cols, block_rows]: row c holds source column c's rows 0..3.
        assert_eq!(as_f32(&dst), [0.0, 11.0, 21.0, 0.0, 12.0, 22.0, 0.0, 13.0, 23.0]);
    }

    #[test]
    fn dtypes_convert_exactly_or_to_nearest_even() {
        let values = [1.0f32, -2.5, 1.0 + 1.0 / 256.0, 3.0e-39, f32::INFINITY];
        let block = Block { rows: 0..1, cols: 0..5, first_row: 0, block_rows: 1, transposed: false };
        let mut bf16 = vec![0u8; 10];
        copy_block(&f32s(&values), SourceDType::F32, 0, 5, &block, &mut bf16, DType::Bfloat16).unwrap();
        let mut back = vec![0u8; 20];
        copy_block(&bf16, SourceDType::Bf16, 0, 5, &block, &mut back, DType::Float32).unwrap();
        let back = as_f32(&back);
        assert_eq!(&back[..2], [1.0, -2.5]);
        assert_eq!(back[2], 1.0, "halfway rounds to the even 1.0");
        assert_eq!(back[4], f32::INFINITY);
        // bf16 -> f32 -> bf16 is the identity on bits.
        let mut again = vec![0u8; 10];
        copy_block(&f32s(&back), SourceDType::F32, 0, 5, &block, &mut again, DType::Bfloat16).unwrap();
        assert_eq!(again, bf16);
        let f16: Vec<u8> = [half::f16::from_f32(0.5), half::f16::from_f32(-3.0)]
            .iter()
            .flat_map(|h| h.to_bits().to_le_bytes())
            .collect();
        let mut out = vec![0u8; 8];
        let two = Block { cols: 0..2, ..block };
        copy_block(&f16, SourceDType::F16, 0, 2, &two, &mut out, DType::Float32).unwrap();
        assert_eq!(as_f32(&out), [0.5, -3.0]);
        let e = copy_block(&f16, SourceDType::F16, 0, 2, &two, &mut out, DType::Int32).unwrap_err();
        assert!(e.contains("F16 weights cannot become int32 parameters"), "{e}");
    }
}
