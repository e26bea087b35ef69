//! Element types of dumped tensors and their decoding to f64.
//!
//! Both sides of a compare may hold different dtypes (a bf16 NPU run against an fp32 GPU
//! run), so the float64 kernels work on f64 values decoded block by block from little-endian
//! bytes (the float32 metrics kernel widens f32/f16/bf16 itself: `metrics::chunk_f32`).
//! Decoding from bytes (not casting pointers) keeps unaligned mmap slices safe.

use std::fmt;

/// An element type probe can decode; serialized in lowercase (`f32`, `bf16`, ...).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 64-bit IEEE float (`float64`).
    F64,
    /// 32-bit IEEE float (`float32`).
    F32,
    /// 16-bit IEEE half float (`float16`).
    F16,
    /// 16-bit brain float (`bfloat16`): float32's exponent, 7-bit mantissa.
    BF16,
    /// Signed 64-bit integer.
    I64,
    /// Signed 32-bit integer.
    I32,
    /// Signed 16-bit integer.
    I16,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Boolean, one byte per element (non-zero is true, decoded as 1.0).
    Bool,
}

impl DType {
    /// Parses the names used by probe dumps (`float32`), PyTorch (`torch.float32`),
    /// numpy (`float32`, `<f4`) and safetensors (`F32`).
    pub fn parse(name: &str) -> Option<DType> {
        let n = name.strip_prefix("torch.").unwrap_or(name);
        Some(match n {
            "float64" | "double" | "F64" | "<f8" => DType::F64,
            "float32" | "float" | "F32" | "<f4" => DType::F32,
            "float16" | "half" | "F16" | "<f2" => DType::F16,
            "bfloat16" | "BF16" => DType::BF16,
            "int64" | "long" | "I64" | "<i8" => DType::I64,
            "int32" | "int" | "I32" | "<i4" => DType::I32,
            "int16" | "short" | "I16" | "<i2" => DType::I16,
            "int8" | "I8" | "|i1" => DType::I8,
            "uint8" | "U8" | "|u1" => DType::U8,
            "bool" | "BOOL" | "|b1" => DType::Bool,
            _ => return None,
        })
    }

    /// Canonical name, as written in probe dumps.
    pub fn name(self) -> &'static str {
        match self {
            DType::F64 => "float64",
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::I16 => "int16",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::Bool => "bool",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    /// Whether this is a floating-point type (f64, f32, f16 or bf16).
    pub(crate) fn is_float(self) -> bool {
        matches!(self, DType::F64 | DType::F32 | DType::F16 | DType::BF16)
    }

    /// The gap between 1 and the next larger value of a float type (torch.finfo(...).eps):
    /// the relative rounding of one operation. None for integers and bool.
    pub(crate) fn epsilon(self) -> Option<f64> {
        match self {
            DType::F64 => Some(f64::EPSILON),
            DType::F32 => Some(f32::EPSILON as f64),
            DType::F16 => Some(half::f16::EPSILON.to_f64()),
            DType::BF16 => Some(half::bf16::EPSILON.to_f64()),
            _ => None,
        }
    }

    /// Machine epsilon used by msprobe's relative error at positions where the benchmark
    /// is zero: float32's when the data is at most float32, else float64's.
    pub(crate) fn rel_eps(self) -> f64 {
        match self {
            DType::F64 => f64::EPSILON,
            _ => f32::EPSILON as f64,
        }
    }

    /// Decodes `out.len()` elements from `bytes` (little-endian, at least
    /// `out.len() * self.size()` bytes).
    #[inline(always)]
    pub fn decode(self, bytes: &[u8], out: &mut [f64]) {
        macro_rules! dec {
            ($n:expr, $f:expr) => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact($n)) {
                    let mut a = [0u8; $n];
                    a.copy_from_slice(b);
                    *o = $f(a);
                }
            };
        }
        match self {
            DType::F64 => dec!(8, f64::from_le_bytes),
            DType::F32 => dec!(4, |a| f32::from_le_bytes(a) as f64),
            DType::F16 => dec!(2, |a| half::f16::from_bits(u16::from_le_bytes(a)).to_f64()),
            DType::BF16 => dec!(2, |a| f32::from_bits((u16::from_le_bytes(a) as u32) << 16)
                as f64),
            DType::I64 => dec!(8, |a| i64::from_le_bytes(a) as f64),
            DType::I32 => dec!(4, |a| i32::from_le_bytes(a) as f64),
            DType::I16 => dec!(2, |a| i16::from_le_bytes(a) as f64),
            DType::I8 => dec!(1, |a: [u8; 1]| a[0] as i8 as f64),
            DType::U8 => dec!(1, |a: [u8; 1]| a[0] as f64),
            DType::Bool => dec!(1, |a: [u8; 1]| if a[0] != 0 { 1.0 } else { 0.0 }),
        }
    }
}

/// A dtype as a dump declares it: one probe decodes, or another (FP8, complex, ...) kept by
/// name so that reports can show it. Parsed once, by the readers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AnyDType {
    /// A dtype probe decodes.
    Known(DType),
    /// Any other dtype, as written (empty when the dump gave none); boxed, as every tensor
    /// record and both sides of every row hold a dtype.
    Other(Box<str>),
}

impl Default for AnyDType {
    /// No dtype (what a record without one reads as).
    fn default() -> Self {
        AnyDType::Other(Box::default())
    }
}

impl AnyDType {
    /// Parses any of the naming conventions [`DType::parse`] knows; keeps others by name.
    pub fn parse(name: &str) -> AnyDType {
        match DType::parse(name) {
            Some(d) => AnyDType::Known(d),
            None => AnyDType::Other(name.into()),
        }
    }

    /// The decodable dtype, if this is one.
    pub(crate) fn known(&self) -> Option<DType> {
        match self {
            AnyDType::Known(d) => Some(*d),
            AnyDType::Other(_) => None,
        }
    }

    /// The canonical name of a known dtype, or the name as written.
    pub(crate) fn name(&self) -> &str {
        match self {
            AnyDType::Known(d) => d.name(),
            AnyDType::Other(s) => s,
        }
    }
}

impl serde::Serialize for AnyDType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for AnyDType {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<AnyDType, D::Error> {
        Ok(AnyDType::parse(&String::deserialize(d)?))
    }
}

impl fmt::Display for AnyDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_each_dtype_against_std_conversions() {
        let vals = [1.5f32, -2.25, 0.0, 65504.0];
        let mut out = [0.0; 4];
        let b: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        DType::F32.decode(&b, &mut out);
        assert_eq!(out, [1.5, -2.25, 0.0, 65504.0]);
        let b: Vec<u8> = vals
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect();
        DType::F16.decode(&b, &mut out);
        assert_eq!(out, [1.5, -2.25, 0.0, 65504.0]);
        let b: Vec<u8> = vals
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect();
        DType::BF16.decode(&b, &mut out);
        assert_eq!(out[..3], [1.5, -2.25, 0.0]);
        assert_eq!(out[3], half::bf16::from_f32(65504.0).to_f64());
        DType::I8.decode(&[255, 1, 0, 128], &mut out);
        assert_eq!(out, [-1.0, 1.0, 0.0, -128.0]);
        DType::Bool.decode(&[0, 1, 2, 0], &mut out);
        assert_eq!(out, [0.0, 1.0, 1.0, 0.0]);
    }

    #[test]
    fn parses_all_naming_conventions() {
        for (n, d) in [
            ("float32", DType::F32),
            ("torch.bfloat16", DType::BF16),
            ("F16", DType::F16),
            ("<f8", DType::F64),
            ("torch.int64", DType::I64),
            ("BOOL", DType::Bool),
        ] {
            assert_eq!(DType::parse(n), Some(d), "{n}");
        }
        assert_eq!(DType::parse("torch.float8_e4m3fn"), None);
        for d in [DType::F64, DType::BF16, DType::U8] {
            assert_eq!(DType::parse(d.name()), Some(d));
        }
    }
}
