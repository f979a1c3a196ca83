//! Little-endian floating-point elements, as both tensor formats store them, widened or narrowed
//! to `f32`.

use half::{bf16, f16};

/// How the floating-point elements of a byte buffer are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FloatLayout {
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE binary32.
    F32,
    /// IEEE binary64 (narrowed to the nearest `f32`).
    F64,
}

/// Decodes `bytes` (whose length is a multiple of the element size) as `layout` elements.
pub(crate) fn to_f32(bytes: &[u8], layout: FloatLayout) -> Vec<f32> {
    match layout {
        FloatLayout::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        FloatLayout::BF16 => bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        FloatLayout::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        FloatLayout::F64 => bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_layout_decodes_little_endian() {
        let f16_bytes: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect();
        assert_eq!(to_f32(&f16_bytes, FloatLayout::F16), vec![1.5, -2.0]);
        let bf16_bytes: Vec<u8> = [0.5f32, 3.0]
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect();
        assert_eq!(to_f32(&bf16_bytes, FloatLayout::BF16), vec![0.5, 3.0]);
        assert_eq!(to_f32(&1.25f32.to_le_bytes(), FloatLayout::F32), vec![1.25]);
        assert_eq!(
            to_f32(&0.1f64.to_le_bytes(), FloatLayout::F64),
            vec![0.1f32]
        );
        assert!(to_f32(&[], FloatLayout::F64).is_empty());
    }
}
