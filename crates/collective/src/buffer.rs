//! [`Buffer`]: the bytes of one gradient shard (or a group of them) and their element type.

use crate::error::{Error, Result};
use crate::reduce::Elem;
use bytes::{Bytes, BytesMut};
use half::bf16;
use mesh::DType;

/// A contiguous run of float32 or bfloat16 values, stored little-endian, as PJRT copies them to
/// host memory on every supported machine.
///
/// It is backed by [`BytesMut`] so the ring can cut it into chunks that move between threads and
/// stitch it back together without copying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Buffer {
    elem: Elem,
    bytes: BytesMut,
}

impl Buffer {
    /// Wraps raw little-endian bytes of `dtype` elements.
    pub fn new(dtype: DType, bytes: BytesMut) -> Result<Buffer> {
        let elem = match dtype {
            DType::Float32 => Elem::F32,
            DType::Bfloat16 => Elem::Bf16,
            other => return Err(Error::UnsupportedDtype { dtype: other }),
        };
        if !bytes.len().is_multiple_of(elem.size()) {
            return Err(Error::InvalidSubmission {
                reason: format!(
                    "a {dtype} buffer of {} bytes is not a whole number of {}-byte elements",
                    bytes.len(),
                    elem.size()
                ),
            });
        }
        Ok(Buffer { elem, bytes })
    }

    /// Wraps a vector of raw little-endian bytes of `dtype` elements, without copying.
    pub fn from_vec(dtype: DType, bytes: Vec<u8>) -> Result<Buffer> {
        let bytes = Bytes::from(bytes).try_into_mut().unwrap_or_else(|shared| BytesMut::from(&shared[..]));
        Buffer::new(dtype, bytes)
    }

    /// A float32 buffer holding a copy of `values`.
    pub fn from_f32(values: &[f32]) -> Buffer {
        let mut bytes = BytesMut::with_capacity(values.len() * 4);
        for v in values {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        Buffer { elem: Elem::F32, bytes }
    }

    /// A bfloat16 buffer holding a copy of `values`.
    pub fn from_bf16(values: &[bf16]) -> Buffer {
        let mut bytes = BytesMut::with_capacity(values.len() * 2);
        for v in values {
            bytes.extend_from_slice(&v.to_bits().to_le_bytes());
        }
        Buffer { elem: Elem::Bf16, bytes }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self.elem {
            Elem::F32 => DType::Float32,
            Elem::Bf16 => DType::Bfloat16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.elem.size()
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The raw little-endian bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The raw bytes, to hand back to the device without a copy.
    pub fn into_bytes(self) -> BytesMut {
        self.bytes
    }

    /// The raw bytes as a vector (no copy when the ring handed the buffer back whole).
    pub fn into_vec(self) -> Vec<u8> {
        Vec::from(self.bytes)
    }

    /// The values of a float32 buffer.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        match self.elem {
            Elem::F32 => Ok(self.bytes.as_chunks::<4>().0.iter().map(|b| f32::from_le_bytes(*b)).collect()),
            Elem::Bf16 => Err(self.wrong_type(DType::Float32)),
        }
    }

    /// The values of a bfloat16 buffer.
    pub fn to_bf16(&self) -> Result<Vec<bf16>> {
        match self.elem {
            Elem::Bf16 => Ok(self
                .bytes
                .as_chunks::<2>()
                .0
                .iter()
                .map(|b| bf16::from_bits(u16::from_le_bytes(*b)))
                .collect()),
            Elem::F32 => Err(self.wrong_type(DType::Bfloat16)),
        }
    }

    pub(crate) fn elem(&self) -> Elem {
        self.elem
    }

    pub(crate) fn from_parts(elem: Elem, bytes: BytesMut) -> Buffer {
        Buffer { elem, bytes }
    }

    fn wrong_type(&self, asked: DType) -> Error {
        Error::InvalidSubmission {
            reason: format!(
                "asked for {asked} values of a {} buffer; read it with its own type",
                self.dtype()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_values() {
        let b = Buffer::from_f32(&[1.0, -2.0, 3.5]);
        assert_eq!(b.len(), 3);
        assert_eq!(b.dtype(), DType::Float32);
        assert_eq!(b.to_f32().unwrap(), vec![1.0, -2.0, 3.5]);
        assert!(b.to_bf16().is_err());
        let h = Buffer::from_bf16(&[bf16::from_f32(0.5), bf16::from_f32(-4.0)]);
        assert_eq!(h.as_bytes().len(), 4);
        assert_eq!(h.to_bf16().unwrap()[1].to_f32(), -4.0);
    }

    #[test]
    fn rejects_other_types_and_partial_elements() {
        let err = Buffer::new(DType::Int32, BytesMut::zeroed(8)).unwrap_err();
        assert_eq!(err, Error::UnsupportedDtype { dtype: DType::Int32 });
        let err = Buffer::new(DType::Float32, BytesMut::zeroed(6)).unwrap_err();
        assert!(err.to_string().contains("6 bytes"), "{err}");
        assert_eq!(Buffer::new(DType::Bfloat16, BytesMut::zeroed(6)).unwrap().len(), 3);
        let v = Buffer::from_vec(DType::Float32, 2.5f32.to_le_bytes().to_vec()).unwrap();
        assert_eq!(v.to_f32().unwrap(), vec![2.5]);
        assert_eq!(v.into_vec(), 2.5f32.to_le_bytes().to_vec());
    }
}
