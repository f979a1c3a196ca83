use super::*;
use crate::test_dir::TestDir;
use half::f16;
use proptest::prelude::*;
use std::process::Command;

/// Element `i` of the test arrays of `dtype`, as bytes; `python_value` below computes the same.
fn element(dtype: NpyDType, i: usize) -> Vec<u8> {
    let x = i as f64 * 0.5 - 3.0;
    let n = i as i64 * 1000 - 7;
    match dtype {
        NpyDType::F32 => (x as f32).to_le_bytes().to_vec(),
        NpyDType::F64 => x.to_le_bytes().to_vec(),
        NpyDType::F16 => f16::from_f64(x).to_le_bytes().to_vec(),
        NpyDType::I32 => (n as i32).to_le_bytes().to_vec(),
        NpyDType::I64 => (n * 1_000_000_007).to_le_bytes().to_vec(),
        NpyDType::Bool => vec![u8::from(i.is_multiple_of(3))],
        NpyDType::U8 => vec![(i * 37 % 256) as u8],
    }
}

/// The Python expression for element `i` (a numpy int array) of `dtype`'s test array.
fn python_value(dtype: NpyDType) -> &'static str {
    match dtype {
        NpyDType::F32 | NpyDType::F64 | NpyDType::F16 => "i * 0.5 - 3.0",
        NpyDType::I32 => "i * 1000 - 7",
        NpyDType::I64 => "(i * 1000 - 7) * 1000000007",
        NpyDType::Bool => "i % 3 == 0",
        NpyDType::U8 => "i * 37 % 256",
    }
}

fn test_array(dtype: NpyDType, shape: &[usize]) -> NpyArray {
    let n: usize = shape.iter().product();
    let data = (0..n).flat_map(|i| element(dtype, i)).collect();
    NpyArray::new(dtype, shape.to_vec(), data).unwrap()
}

const SHAPES: [&[usize]; 4] = [&[2, 3, 4], &[], &[0, 5], &[7]];

/// Whether `python3` with numpy is available; says so when it is not, and fails under CI
/// (`CI` set), where a reference that cannot run must not pass silently.
fn have_numpy() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok || std::env::var_os("CI").is_none(),
        "CI is set but python3 with numpy is missing: the numpy reference tests cannot run"
    );
    if !ok {
        eprintln!("skipping: python3 with numpy is not installed");
    }
    ok
}

fn run_python(script: &str) {
    let out = Command::new("python3")
        .args(["-c", script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn numpy_reads_what_we_write() {
    if !have_numpy() {
        return;
    }
    let dir = TestDir::new();
    let mut checks = String::new();
    for dtype in NpyDType::ALL {
        for (k, shape) in SHAPES.iter().enumerate() {
            let path = dir
                .path()
                .join(format!("{}_{k}.npy", dtype.descr().replace(['<', '|'], "")));
            write_npy(&path, &test_array(dtype, shape)).unwrap();
            checks += &format!(
                "a = np.load({path:?})\n\
                 assert a.dtype.str == {descr:?}, a.dtype.str\n\
                 assert a.shape == tuple({shape:?}), a.shape\n\
                 i = np.arange(a.size).reshape(a.shape)\n\
                 assert np.array_equal(a, ({value}).astype(a.dtype)), a\n",
                descr = dtype.descr(),
                value = python_value(dtype),
            );
        }
    }
    run_python(&format!("import numpy as np\n{checks}"));
}

#[test]
fn we_read_what_numpy_writes() {
    if !have_numpy() {
        return;
    }
    let dir = TestDir::new();
    let mut script = String::from("import numpy as np\nfrom numpy.lib import format as fmt\n");
    for dtype in NpyDType::ALL {
        for (k, shape) in SHAPES.iter().enumerate() {
            for version in ["(1, 0)", "(2, 0)", "(3, 0)"] {
                let name = format!(
                    "{}_{k}_{}.npy",
                    dtype.descr().replace(['<', '|'], ""),
                    &version[1..2]
                );
                script += &format!(
                    "i = np.arange(int(np.prod({shape:?}))).reshape({shape:?})\n\
                     with open({path:?}, 'wb') as f:\n    \
                     fmt.write_array(f, ({value}).astype({descr:?}), version={version})\n",
                    path = dir.path().join(&name),
                    value = python_value(dtype),
                    descr = dtype.descr(),
                );
            }
        }
    }
    script += &format!(
        "np.save({:?}, np.asfortranarray(np.ones((3, 2), np.float32)))\n\
         np.save({:?}, np.ones(3, '>f4'))\n\
         np.save({:?}, np.ones(3, np.complex64))\n",
        dir.path().join("fortran.npy"),
        dir.path().join("big_endian.npy"),
        dir.path().join("complex.npy"),
    );
    run_python(&script);

    for dtype in NpyDType::ALL {
        for (k, shape) in SHAPES.iter().enumerate() {
            for version in ["1", "2", "3"] {
                let name = format!(
                    "{}_{k}_{version}.npy",
                    dtype.descr().replace(['<', '|'], "")
                );
                let array = read_npy(dir.path().join(&name)).unwrap();
                assert_eq!(array, test_array(dtype, shape), "{name}");
            }
        }
    }
    let kind = |name: &str| read_npy(dir.path().join(name)).unwrap_err().kind;
    assert!(matches!(kind("fortran.npy"), NpyErrorKind::FortranOrder));
    assert!(matches!(kind("big_endian.npy"), NpyErrorKind::UnsupportedDType(d) if d == ">f4"));
    assert!(matches!(kind("complex.npy"), NpyErrorKind::UnsupportedDType(d) if d == "<c8"));
}

#[test]
fn writes_numpy_s_exact_layout() {
    let bytes = NpyArray::from_f32(vec![2, 3], &[0.0; 6])
        .unwrap()
        .to_npy_bytes();
    let dict = b"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
    assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), 118);
    assert_eq!(&bytes[10..10 + dict.len()], dict);
    assert!(bytes[10 + dict.len()..127].iter().all(|&b| b == b' '));
    assert_eq!(bytes[127], b'\n');
    assert_eq!(bytes.len(), 128 + 24);
}

#[test]
fn conversions() {
    let halves = NpyArray::new(
        NpyDType::F16,
        vec![2],
        [1.5f32, -0.25]
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
    )
    .unwrap();
    assert_eq!(halves.to_f32().unwrap(), vec![1.5, -0.25]);
    let wide = test_array(NpyDType::F64, &[3]);
    assert_eq!(wide.to_f32().unwrap(), vec![-3.0, -2.5, -2.0]);
    assert_eq!(
        test_array(NpyDType::I32, &[2]).to_i64().unwrap(),
        vec![-7, 993]
    );
    assert_eq!(
        test_array(NpyDType::Bool, &[4]).to_i64().unwrap(),
        vec![1, 0, 0, 1]
    );
    assert_eq!(
        test_array(NpyDType::U8, &[2]).to_i64().unwrap(),
        vec![0, 37]
    );
    let ids = NpyArray::from_i64(vec![3], &[5, -1, 1 << 40]).unwrap();
    assert_eq!(ids.to_i64().unwrap(), vec![5, -1, 1 << 40]);
    assert_eq!((ids.len(), ids.is_empty()), (3, false));

    let err = ids.to_f32().unwrap_err();
    assert_eq!(
        err.to_string(),
        "expected a floating-point array, found element type '<i8'"
    );
    let err = wide.to_i64().unwrap_err();
    assert!(matches!(
        err.kind(),
        NpyErrorKind::DTypeMismatch {
            found: NpyDType::F64,
            ..
        }
    ));
}

#[test]
fn construction_checks_the_data_length() {
    let err = NpyArray::from_f32(vec![2, 2], &[1.0; 3]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "array data is 12 bytes but its shape and type call for 16"
    );
    let err = NpyArray::new(NpyDType::U8, vec![usize::MAX, 2], vec![]).unwrap_err();
    assert!(matches!(err.kind(), NpyErrorKind::ShapeOverflow(_)));
    let err = NpyArray::new(NpyDType::U8, vec![1; 65], vec![0]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "array has 65 dimensions, more than the 64 allowed"
    );
    assert!(NpyArray::new(NpyDType::U8, vec![1; 64], vec![0]).is_ok());
    let err = NpyView::new(NpyDType::F32, vec![2, 2], &[0u8; 12][..]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "array data is 12 bytes but its shape and type call for 16"
    );
}

/// A view over borrowed bytes is the array's file, header and data, and the array again.
#[test]
fn a_view_writes_what_its_array_writes() {
    let array = test_array(NpyDType::F16, &[3, 5]);
    let view = NpyView::new(array.dtype(), array.shape().to_vec(), array.data()).unwrap();
    assert_eq!(
        [view.header_bytes(), view.data().to_vec()].concat(),
        array.to_npy_bytes()
    );
    assert_eq!(view.into_array(), array);
    assert_eq!(NpyView::from(array.clone()).into_array(), array);
}

/// A file with the given version and header dict, padded like NumPy, followed by `data`.
fn file_with_header(major: u8, dict: &str, data: &[u8]) -> Vec<u8> {
    let len_bytes = if major == 1 { 2 } else { 4 };
    let unpadded = 8 + len_bytes + dict.len() + 1;
    let header = format!(
        "{dict}{}\n",
        " ".repeat(unpadded.next_multiple_of(64) - unpadded)
    );
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&[major, 0]);
    if major == 1 {
        bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    } else {
        bytes.extend_from_slice(&(header.len() as u32).to_le_bytes());
    }
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

fn parse_err(bytes: &[u8]) -> String {
    let from_bytes = NpyArray::from_npy_bytes(bytes).unwrap_err().to_string();
    // A stream of unknown length must fail too (the message may differ only in lengths known).
    assert!(NpyArray::read_from(bytes).is_err());
    from_bytes
}

#[test]
fn reads_versions_2_and_3() {
    let dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
    let data: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    for major in [2, 3] {
        let array = NpyArray::from_npy_bytes(&file_with_header(major, dict, &data)).unwrap();
        assert_eq!(array.to_f32().unwrap(), vec![1.0, 2.0]);
    }
    // Version 3 headers are UTF-8; version 1 and 2 headers Latin-1.
    let mut bytes = file_with_header(3, dict, &data);
    bytes[20] = 0xff;
    assert_eq!(parse_err(&bytes), "malformed .npy header: not UTF-8");
}

#[test]
fn malformed_files_give_clear_errors() {
    let f4 =
        |shape: &str| format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    let four_floats = [0u8; 16];
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            b"PK\x03\x04 not npy".to_vec(),
            "not a .npy file (bad magic string)",
        ),
        (
            b"\x93NUM".to_vec(),
            "truncated .npy file: it ends inside the magic string and version",
        ),
        (
            b"\x93NUMPY\x01\x00\x76".to_vec(),
            "truncated .npy file: it ends inside the header length",
        ),
        (
            b"\x93NUMPY\x01\x00\x76\x00{'descr'".to_vec(),
            "truncated .npy file: it ends inside the header",
        ),
        (
            b"\x93NUMPY\x04\x00\x76\x00".to_vec(),
            ".npy format version 4.0 is not supported (only 1.0, 2.0 and 3.0)",
        ),
        (
            b"\x93NUMPY\x02\x00\xff\xff\xff\xff".to_vec(),
            ".npy header claims 4294967295 bytes, more than the 1048576 allowed",
        ),
        (
            file_with_header(1, "{'descr': '<f4'}", &four_floats),
            "malformed .npy header: missing key 'fortran_order'",
        ),
        (
            file_with_header(
                1,
                "{'descr': '<U8', 'fortran_order': False, 'shape': (2,)}",
                &four_floats,
            ),
            "unsupported element type '<U8' (supported: <f4 <f8 <f2 <i4 <i8 |b1 |u1)",
        ),
        (
            file_with_header(
                1,
                "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2)}",
                &four_floats,
            ),
            "array is stored in Fortran (column-major) order; save it in C order \
             (numpy.ascontiguousarray) instead",
        ),
        (
            file_with_header(1, &f4("(3,)"), &four_floats),
            "array data is 16 bytes but its shape and type call for 12",
        ),
        (
            file_with_header(1, &f4("(5,)"), &four_floats),
            "array data is 16 bytes but its shape and type call for 20",
        ),
        (
            file_with_header(1, &f4("(4294967296, 4294967296)"), &four_floats),
            "shape [4294967296, 4294967296] holds more bytes than fit in memory",
        ),
    ];
    for (bytes, message) in cases {
        assert_eq!(parse_err(&bytes), message);
    }
    // Without a known length, too-long data is found after reading it.
    let long = file_with_header(1, &f4("(3,)"), &four_floats);
    assert_eq!(
        NpyArray::read_from(&long[..]).unwrap_err().to_string(),
        "array data is 16 bytes but its shape and type call for 12"
    );
}

#[test]
fn file_errors_name_the_file() {
    let dir = TestDir::new();
    let missing = dir.path().join("missing.npy");
    let err = read_npy(&missing).unwrap_err();
    assert!(matches!(err.kind(), NpyErrorKind::Io(e) if e.kind() == io::ErrorKind::NotFound));
    assert_eq!(err.path(), Some(missing.as_path()));
    assert!(err
        .to_string()
        .starts_with(&format!("{}: ", missing.display())));
    assert!(std::error::Error::source(&err).is_some());

    let garbage = dir.path().join("garbage.npy");
    std::fs::write(&garbage, b"hello").unwrap();
    assert_eq!(
        read_npy(&garbage).unwrap_err().to_string(),
        format!(
            "{}: truncated .npy file: it ends inside the magic string and version",
            garbage.display()
        )
    );

    let nowhere = dir.path().join("no/such/dir/x.npy");
    let err = write_npy(&nowhere, &test_array(NpyDType::U8, &[2])).unwrap_err();
    assert!(matches!(err.kind(), NpyErrorKind::Io(_)));
    assert_eq!(err.path(), Some(nowhere.as_path()));
}

#[test]
fn writes_replace_files_whole() {
    let dir = TestDir::new();
    let path = dir.path().join("a.npy");
    write_npy(&path, &test_array(NpyDType::I64, &[2, 2])).unwrap();
    write_npy(&path, &test_array(NpyDType::F16, &[3])).unwrap();
    assert_eq!(read_npy(&path).unwrap(), test_array(NpyDType::F16, &[3]));
    assert_eq!(dir.file_names(), vec!["a.npy"]);
}

fn arb_array() -> impl Strategy<Value = NpyArray> {
    (
        prop::sample::select(NpyDType::ALL.to_vec()),
        prop::collection::vec(0usize..5, 0..4),
    )
        .prop_flat_map(|(dtype, shape)| {
            let n = shape.iter().product::<usize>() * dtype.size();
            prop::collection::vec(any::<u8>(), n)
                .prop_map(move |data| NpyArray::new(dtype, shape.clone(), data).unwrap())
        })
}

proptest! {
    #[test]
    fn round_trips(array in arb_array()) {
        let bytes = array.to_npy_bytes();
        prop_assert_eq!(bytes.len() % 64, array.data().len() % 64);
        prop_assert_eq!(&NpyArray::from_npy_bytes(&bytes).unwrap(), &array);
        prop_assert_eq!(&NpyArray::read_from(&bytes[..]).unwrap(), &array);
        let mut written = Vec::new();
        array.write_to(&mut written).unwrap();
        prop_assert_eq!(written, bytes);
    }

    #[test]
    fn f32_values_round_trip(values in prop::collection::vec(any::<f32>(), 0..50)) {
        let array = NpyArray::from_f32(vec![values.len()], &values).unwrap();
        let back = NpyArray::from_npy_bytes(&array.to_npy_bytes()).unwrap().to_f32().unwrap();
        // Bit-exact, NaN payloads included.
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&back), bits(&values));
    }

    #[test]
    fn truncations_and_flips_never_panic(
        array in arb_array(),
        cut in any::<prop::sample::Index>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
    ) {
        let bytes = array.to_npy_bytes();
        let cut = cut.index(bytes.len());
        prop_assert!(NpyArray::from_npy_bytes(&bytes[..cut]).is_err());
        prop_assert!(NpyArray::read_from(&bytes[..cut]).is_err());
        let mut flipped = bytes.clone();
        for (at, value) in flips {
            let at = at.index(flipped.len());
            flipped[at] = value;
        }
        // Any outcome but a panic is fine; a success must still be self-consistent.
        if let Ok(a) = NpyArray::from_npy_bytes(&flipped) {
            prop_assert_eq!(a.data().len(), a.len() * a.dtype().size());
        }
        let _ = NpyArray::read_from(&flipped[..]);
    }
}
