//! Reading a model input from a `.npy` array: the shape must be the input's, the element type
//! one that converts to the input's dtype without guessing (ints to ints, floats to floats).

use mslc_core::ops::{DType, TensorType};
use mslc_io::npy::{NpyArray, NpyDType};

use super::storage::{load_f32, store_f32};

/// The module dtype whose bytes an `.npy` element type shares, if any.
fn same_layout(d: NpyDType) -> Option<DType> {
    Some(match d {
        NpyDType::F32 => DType::F32,
        NpyDType::F64 => DType::F64,
        NpyDType::F16 => DType::F16,
        NpyDType::I32 => DType::I32,
        NpyDType::I64 => DType::I64,
        NpyDType::Bool => DType::Bool,
        NpyDType::U8 => return None,
    })
}

/// Writes `array` into `dst` (the input's buffer, `ty.bytes()` long) as `ty` elements.
pub fn fill_input(
    name: &str,
    ty: &TensorType,
    array: &NpyArray,
    dst: &mut [u8],
) -> Result<(), String> {
    let shape_ok = ty.shape.len() == array.shape().len()
        && ty
            .shape
            .iter()
            .zip(array.shape())
            .all(|(&a, &b)| a as u64 == b as u64);
    if !shape_ok {
        let dims: Vec<String> = array.shape().iter().map(usize::to_string).collect();
        return Err(format!(
            "input `{name}` must have shape {ty}, but the array is [{}]",
            dims.join(",")
        ));
    }
    let src = array.data();
    match (same_layout(array.dtype()), ty.dtype) {
        (Some(d), want) if d == want => dst.copy_from_slice(src),
        (Some(DType::I64), DType::I32) => {
            for (o, c) in dst.chunks_exact_mut(4).zip(src.chunks_exact(8)) {
                let v = i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
                let v = i32::try_from(v).map_err(|_| {
                    format!("input `{name}` is i32, but the array holds {v}, which does not fit")
                })?;
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        (Some(DType::I32), DType::I64) => {
            for (o, c) in dst.chunks_exact_mut(8).zip(src.chunks_exact(4)) {
                let v = i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        (Some(from), want) if from.is_float() && want.is_float() => {
            let mut values = vec![0f32; array.len()];
            load_f32(from, src, &mut values);
            store_f32(want, &values, dst);
        }
        _ => {
            return Err(format!(
                "input `{name}` is {}, but the array's elements are `{}`",
                ty.dtype,
                array.dtype()
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_widen_and_narrow_with_range_checks() {
        let ty = TensorType::new(DType::I32, [1, 2]);
        let a = NpyArray::from_i64(vec![1, 2], &[7, 9]).unwrap();
        let mut dst = [0u8; 8];
        fill_input("tokens", &ty, &a, &mut dst).unwrap();
        assert_eq!(dst[..4], 7i32.to_le_bytes());
        let big = NpyArray::from_i64(vec![1, 2], &[7, 1 << 40]).unwrap();
        let e = fill_input("tokens", &ty, &big, &mut dst).unwrap_err();
        assert!(e.contains("does not fit"), "{e}");
    }

    #[test]
    fn shape_and_kind_mismatches_are_named() {
        let ty = TensorType::new(DType::I32, [1, 2]);
        let f = NpyArray::from_f32(vec![1, 2], &[1.0, 2.0]).unwrap();
        let mut dst = [0u8; 8];
        let e = fill_input("tokens", &ty, &f, &mut dst).unwrap_err();
        assert!(
            e.contains("input `tokens` is i32, but the array's elements are `<f4`"),
            "{e}"
        );
        let wrong = NpyArray::from_i64(vec![2], &[1, 2]).unwrap();
        let e = fill_input("tokens", &ty, &wrong, &mut dst).unwrap_err();
        assert!(
            e.contains("must have shape i32[1,2], but the array is [2]"),
            "{e}"
        );
    }

    #[test]
    fn floats_convert_to_the_input_dtype() {
        let ty = TensorType::new(DType::F16, [2]);
        let f = NpyArray::from_f32(vec![2], &[1.5, -2.0]).unwrap();
        let mut dst = [0u8; 4];
        fill_input("x", &ty, &f, &mut dst).unwrap();
        assert_eq!(dst[..2], half::f16::from_f32(1.5).to_le_bytes());
    }
}
