//! Element types of arrays, named as NumPy and JAX name them.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The element type of an array. Serialized with NumPy's names (`float32`, `bfloat16`, ...),
/// which is what the JAX exporter writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE half precision.
    Float16,
    /// Brain float: float32's exponent, 8 bits of mantissa.
    Bfloat16,
    /// IEEE single precision.
    Float32,
    /// IEEE double precision.
    Float64,
    /// Signed 8-bit integer.
    Int8,
    /// Signed 32-bit integer.
    Int32,
    /// Signed 64-bit integer.
    Int64,
    /// Unsigned 8-bit integer.
    Uint8,
    /// Unsigned 32-bit integer.
    Uint32,
    /// One byte per boolean.
    Bool,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Int8 | DType::Uint8 | DType::Bool => 1,
            DType::Float16 | DType::Bfloat16 => 2,
            DType::Float32 | DType::Int32 | DType::Uint32 => 4,
            DType::Float64 | DType::Int64 => 8,
        }
    }

    /// NumPy's name for the type.
    pub fn name(self) -> &'static str {
        match self {
            DType::Float16 => "float16",
            DType::Bfloat16 => "bfloat16",
            DType::Float32 => "float32",
            DType::Float64 => "float64",
            DType::Int8 => "int8",
            DType::Int32 => "int32",
            DType::Int64 => "int64",
            DType::Uint8 => "uint8",
            DType::Uint32 => "uint32",
            DType::Bool => "bool",
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::Float16 | DType::Bfloat16 | DType::Float32 | DType::Float64)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
