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
    fill_input_raw(name, ty, array.shape(), array.dtype(), array.data(), dst)
}

/// Writes `data`, elements of type `from` and shape `shape`, into `dst` (the input's buffer,
/// `ty.bytes()` long) as `ty` elements, as [`fill_input`] writes an array's.
pub fn fill_input_raw(
    name: &str,
    ty: &TensorType,
    shape: &[usize],
    from: NpyDType,
    data: &[u8],
    dst: &mut [u8],
) -> Result<(), String> {
    check_shape(name, ty, shape)?;
    if data.len() != shape.iter().product::<usize>() * from.size() {
        return Err(format!(
            "input `{name}`: {} bytes for {shape:?} elements of {} bytes",
            data.len(),
            from.size()
        ));
    }
    convert(name, ty.dtype, from, data, dst)
}

/// Writes f32 `values` of shape `shape` into `dst` (the input's buffer, `ty.bytes()` long) as
/// `ty` elements, which must be floats.
pub fn fill_input_f32(
    name: &str,
    ty: &TensorType,
    shape: &[usize],
    values: &[f32],
    dst: &mut [u8],
) -> Result<(), String> {
    check_shape(name, ty, shape)?;
    if !ty.dtype.is_float() {
        return Err(format!("input `{name}` is {}, not a float", ty.dtype));
    }
    if values.len() != shape.iter().product::<usize>() {
        return Err(format!(
            "input `{name}`: {} values for shape {shape:?}",
            values.len()
        ));
    }
    store_f32(ty.dtype, values, dst);
    Ok(())
}

/// Writes the samples `rows` of `array` (indices along its first axis, in that order) into
/// `dst` (the input's buffer, `ty.bytes()` long) as `ty` elements: a batch taken straight
/// from a dataset, without first copying its rows out of it.
pub fn fill_input_rows(
    name: &str,
    ty: &TensorType,
    array: &NpyArray,
    rows: &[usize],
    dst: &mut [u8],
) -> Result<(), String> {
    let Some(&samples) = array.shape().first() else {
        return Err(format!("input `{name}`: a scalar array has no samples"));
    };
    let mut shape = array.shape().to_vec();
    shape[0] = rows.len();
    check_shape(name, ty, &shape)?;
    if let Some(&r) = rows.iter().find(|&&r| r >= samples) {
        return Err(format!(
            "input `{name}`: sample {r} is past the array's {samples}"
        ));
    }
    let src = array.data();
    let (src_row, dst_row) = (src.len() / samples.max(1), dst.len() / rows.len().max(1));
    for (&r, out) in rows.iter().zip(dst.chunks_exact_mut(dst_row.max(1))) {
        convert(
            name,
            ty.dtype,
            array.dtype(),
            &src[r * src_row..(r + 1) * src_row],
            out,
        )?;
    }
    Ok(())
}

/// An error naming `name` when `shape` is not `ty`'s.
fn check_shape(name: &str, ty: &TensorType, shape: &[usize]) -> Result<(), String> {
    let shape_ok = ty.shape.len() == shape.len()
        && ty
            .shape
            .iter()
            .zip(shape)
            .all(|(&a, &b)| a as u64 == b as u64);
    if shape_ok {
        return Ok(());
    }
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    Err(format!(
        "input `{name}` must have shape {ty}, but the array is [{}]",
        dims.join(",")
    ))
}

/// Elements a float conversion takes through f32 at a time (4 KiB on the stack).
const CONVERT_BLOCK: usize = 1024;

/// Converts the `.npy` elements `src` (of type `from`) into `dst` as `want` elements: ints to
/// ints (narrowed with a range check), floats to floats.
fn convert(
    name: &str,
    want: DType,
    from: NpyDType,
    src: &[u8],
    dst: &mut [u8],
) -> Result<(), String> {
    match (same_layout(from), want) {
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
        (Some(d), want) if d.is_float() && want.is_float() => {
            // Through f32 a block at a time, on the stack: a batch's rows convert every step.
            let mut values = [0f32; CONVERT_BLOCK];
            let (from_size, to_size) = (d.size_bytes() as usize, want.size_bytes() as usize);
            for (s, o) in src
                .chunks(CONVERT_BLOCK * from_size)
                .zip(dst.chunks_mut(CONVERT_BLOCK * to_size))
            {
                let values = &mut values[..s.len() / from_size];
                load_f32(d, s, values);
                store_f32(want, values, o);
            }
        }
        _ => {
            return Err(format!(
                "input `{name}` is {want}, but the array's elements are `{from}`"
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

    /// A batch of chosen samples, converted as the whole array would be; a sample past the
    /// array is an error, not a panic.
    #[test]
    fn rows_fill_a_batch_in_their_order() {
        let ty = TensorType::new(DType::F16, [2, 2]);
        let f = NpyArray::from_f32(vec![3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let mut dst = [0u8; 8];
        fill_input_rows("x", &ty, &f, &[2, 0], &mut dst).unwrap();
        let got: Vec<f32> = dst
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect();
        assert_eq!(got, [5.0, 6.0, 1.0, 2.0]);
        let e = fill_input_rows("x", &ty, &f, &[2, 3], &mut dst).unwrap_err();
        assert!(e.contains("sample 3 is past the array's 3"), "{e}");
        let e = fill_input_rows("x", &ty, &f, &[0], &mut dst).unwrap_err();
        assert!(
            e.contains("must have shape f16[2,2], but the array is [1,2]"),
            "{e}"
        );
    }

    /// A conversion longer than one block of the stack buffer (and not a multiple of it)
    /// converts every element.
    #[test]
    fn long_float_conversions_cover_every_block() {
        let n = 2 * CONVERT_BLOCK + 3;
        let values: Vec<f64> = (0..n).map(|i| i as f64 * 0.5).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut dst = vec![0u8; 4 * n];
        convert("x", DType::F32, NpyDType::F64, &bytes, &mut dst).unwrap();
        let got: Vec<f64> = dst
            .chunks_exact(4)
            .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect();
        assert_eq!(got, values);
    }

    /// f32 values go into a float input of their shape, converted to its dtype; another
    /// shape, a count that is not the shape's, or an integer input is an error naming it.
    #[test]
    fn f32_values_fill_a_float_input_of_their_shape() {
        let ty = TensorType::new(DType::F16, [2]);
        let mut dst = [0u8; 4];
        fill_input_f32("m", &ty, &[2], &[1.5, -2.0], &mut dst).unwrap();
        assert_eq!(dst[2..], half::f16::from_f32(-2.0).to_le_bytes());
        let e = fill_input_f32("m", &ty, &[1, 2], &[1.5, -2.0], &mut dst).unwrap_err();
        assert!(e.contains("input `m` must have shape f16[2]"), "{e}");
        let e = fill_input_f32("m", &ty, &[2], &[1.5], &mut dst).unwrap_err();
        assert!(e.contains("1 values for shape [2]"), "{e}");
        let ids = TensorType::new(DType::I32, [2]);
        let e = fill_input_f32("ids", &ids, &[2], &[1.0, 2.0], &mut dst[..]).unwrap_err();
        assert!(e.contains("input `ids` is i32, not a float"), "{e}");
    }

    /// Stored bytes of another float type convert into the input as an array's would; bytes
    /// that are not the shape's count of elements are an error, not a short copy.
    #[test]
    fn stored_bytes_of_their_shape_fill_an_input() {
        let ty = TensorType::new(DType::F32, [2]);
        let stored: Vec<u8> = [0.25f64, -3.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mut dst = [0u8; 8];
        fill_input_raw("v", &ty, &[2], NpyDType::F64, &stored, &mut dst).unwrap();
        assert_eq!(dst[4..], (-3.0f32).to_le_bytes());
        let e = fill_input_raw("v", &ty, &[2], NpyDType::F64, &stored[..8], &mut dst).unwrap_err();
        assert!(
            e.contains("input `v`: 8 bytes for [2] elements of 8 bytes"),
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
