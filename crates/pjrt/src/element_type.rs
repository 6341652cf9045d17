//! Element types of device buffers (`PJRT_Buffer_Type`), restricted to byte-sized ones.

use crate::error::{Error, Result};
use crate::ffi;

/// The element type of a buffer. Sub-byte types (S4, U4, F4E2M1FN, ...) are not modelled: their
/// host layout is packed and podctl never uses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementType {
    /// Boolean, one byte.
    Pred,
    /// Signed 8-bit integer.
    S8,
    /// Signed 16-bit integer.
    S16,
    /// Signed 32-bit integer.
    S32,
    /// Signed 64-bit integer.
    S64,
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
    /// IEEE half precision.
    F16,
    /// Brain float 16.
    BF16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// Complex of two f32.
    C64,
    /// Complex of two f64.
    C128,
    /// 8-bit float, 5 exponent bits, 2 mantissa bits.
    F8E5M2,
    /// 8-bit float, 4 exponent bits, 3 mantissa bits, finite only.
    F8E4M3FN,
}

impl ElementType {
    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            Self::Pred | Self::S8 | Self::U8 | Self::F8E5M2 | Self::F8E4M3FN => 1,
            Self::S16 | Self::U16 | Self::F16 | Self::BF16 => 2,
            Self::S32 | Self::U32 | Self::F32 => 4,
            Self::S64 | Self::U64 | Self::F64 | Self::C64 => 8,
            Self::C128 => 16,
        }
    }

    pub(crate) fn to_raw(self) -> ffi::PJRT_Buffer_Type {
        match self {
            Self::Pred => ffi::PJRT_Buffer_Type_PRED,
            Self::S8 => ffi::PJRT_Buffer_Type_S8,
            Self::S16 => ffi::PJRT_Buffer_Type_S16,
            Self::S32 => ffi::PJRT_Buffer_Type_S32,
            Self::S64 => ffi::PJRT_Buffer_Type_S64,
            Self::U8 => ffi::PJRT_Buffer_Type_U8,
            Self::U16 => ffi::PJRT_Buffer_Type_U16,
            Self::U32 => ffi::PJRT_Buffer_Type_U32,
            Self::U64 => ffi::PJRT_Buffer_Type_U64,
            Self::F16 => ffi::PJRT_Buffer_Type_F16,
            Self::BF16 => ffi::PJRT_Buffer_Type_BF16,
            Self::F32 => ffi::PJRT_Buffer_Type_F32,
            Self::F64 => ffi::PJRT_Buffer_Type_F64,
            Self::C64 => ffi::PJRT_Buffer_Type_C64,
            Self::C128 => ffi::PJRT_Buffer_Type_C128,
            Self::F8E5M2 => ffi::PJRT_Buffer_Type_F8E5M2,
            Self::F8E4M3FN => ffi::PJRT_Buffer_Type_F8E4M3FN,
        }
    }

    pub(crate) fn from_raw(raw: ffi::PJRT_Buffer_Type) -> Result<Self> {
        const ALL: [ElementType; 17] = [
            ElementType::Pred,
            ElementType::S8,
            ElementType::S16,
            ElementType::S32,
            ElementType::S64,
            ElementType::U8,
            ElementType::U16,
            ElementType::U32,
            ElementType::U64,
            ElementType::F16,
            ElementType::BF16,
            ElementType::F32,
            ElementType::F64,
            ElementType::C64,
            ElementType::C128,
            ElementType::F8E5M2,
            ElementType::F8E4M3FN,
        ];
        ALL.into_iter().find(|t| t.to_raw() == raw).ok_or(Error::UnsupportedElementType(raw))
    }
}

impl From<mesh::DType> for ElementType {
    fn from(dtype: mesh::DType) -> Self {
        match dtype {
            mesh::DType::Float16 => Self::F16,
            mesh::DType::Bfloat16 => Self::BF16,
            mesh::DType::Float32 => Self::F32,
            mesh::DType::Float64 => Self::F64,
            mesh::DType::Int8 => Self::S8,
            mesh::DType::Int32 => Self::S32,
            mesh::DType::Int64 => Self::S64,
            mesh::DType::Uint8 => Self::U8,
            mesh::DType::Uint32 => Self::U32,
            mesh::DType::Bool => Self::Pred,
        }
    }
}

impl TryFrom<ElementType> for mesh::DType {
    type Error = Error;

    fn try_from(ty: ElementType) -> Result<Self> {
        Ok(match ty {
            ElementType::F16 => Self::Float16,
            ElementType::BF16 => Self::Bfloat16,
            ElementType::F32 => Self::Float32,
            ElementType::F64 => Self::Float64,
            ElementType::S8 => Self::Int8,
            ElementType::S32 => Self::Int32,
            ElementType::S64 => Self::Int64,
            ElementType::U8 => Self::Uint8,
            ElementType::U32 => Self::Uint32,
            ElementType::Pred => Self::Bool,
            other => {
                return Err(Error::InvalidArgument {
                    what: "element type",
                    reason: format!("{other:?} has no podctl dtype (mesh::DType)"),
                });
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_values_round_trip() {
        for raw in 0..40 {
            if let Ok(ty) = ElementType::from_raw(raw) {
                assert_eq!(ty.to_raw(), raw);
            }
        }
        assert_eq!(ElementType::from_raw(ffi::PJRT_Buffer_Type_F32).unwrap(), ElementType::F32);
        assert!(matches!(
            ElementType::from_raw(ffi::PJRT_Buffer_Type_S4),
            Err(Error::UnsupportedElementType(_))
        ));
    }

    #[test]
    fn sizes_match_mesh_dtypes() {
        let dtypes = [
            mesh::DType::Float16,
            mesh::DType::Bfloat16,
            mesh::DType::Float32,
            mesh::DType::Float64,
            mesh::DType::Int8,
            mesh::DType::Int32,
            mesh::DType::Int64,
            mesh::DType::Uint8,
            mesh::DType::Uint32,
            mesh::DType::Bool,
        ];
        for dtype in dtypes {
            let ty = ElementType::from(dtype);
            assert_eq!(ty.size_in_bytes(), dtype.size(), "{dtype}");
            assert_eq!(mesh::DType::try_from(ty).unwrap(), dtype);
        }
        assert!(mesh::DType::try_from(ElementType::C64).is_err());
    }
}
