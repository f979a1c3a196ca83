use super::*;
use crate::test_dir::TestDir;
use half::{bf16, f16};
use proptest::prelude::*;
use std::fs;
use std::process::Command;

/// A file made of an 8-byte header length, the header text and the data, as the format lays it
/// out, for crafting damaged files.
fn raw_file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

fn le<T: Copy, const N: usize>(values: &[T], to_bytes: fn(T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(|&v| to_bytes(v)).collect()
}

/// Owned tensors of every supported type.
fn sample() -> Vec<(String, StDType, Vec<usize>, Vec<u8>)> {
    vec![
        (
            "w.f32".into(),
            StDType::F32,
            vec![2, 3],
            le(&[1.0f32, -2.0, 0.5, 3.25, 0.0, -0.125], f32::to_le_bytes),
        ),
        (
            "w.f16".into(),
            StDType::F16,
            vec![4],
            le(&[1.5, -2.0, 0.25, 8.0].map(f16::from_f32), f16::to_le_bytes),
        ),
        (
            "w.bf16".into(),
            StDType::BF16,
            vec![2, 1],
            le(&[0.5, -3.0].map(bf16::from_f32), bf16::to_le_bytes),
        ),
        (
            "scalar.f64".into(),
            StDType::F64,
            vec![],
            le(&[0.1f64], f64::to_le_bytes),
        ),
        (
            "ids.i32".into(),
            StDType::I32,
            vec![3],
            le(&[7i32, -1, 65536], i32::to_le_bytes),
        ),
        ("empty.i64".into(), StDType::I64, vec![0, 4], vec![]),
        ("mask".into(), StDType::Bool, vec![5], vec![1, 0, 0, 1, 1]),
    ]
}

fn refs(owned: &[(String, StDType, Vec<usize>, Vec<u8>)]) -> Vec<TensorRef<'_>> {
    owned
        .iter()
        .map(|(name, dtype, shape, data)| TensorRef {
            name,
            dtype: *dtype,
            shape,
            data,
        })
        .collect()
}

fn open_bytes(dir: &TestDir, bytes: &[u8]) -> Result<SafetensorsFile, SafetensorsError> {
    let path = dir.path().join("t.safetensors");
    fs::write(&path, bytes).unwrap();
    SafetensorsFile::open(&path)
}

/// The message of the error opening `bytes`, without the path prefix.
fn open_err(bytes: &[u8]) -> String {
    let dir = TestDir::new();
    let err = open_bytes(&dir, bytes).unwrap_err();
    let path = format!("{}: ", dir.path().join("t.safetensors").display());
    err.to_string().strip_prefix(&path).unwrap().to_string()
}

#[test]
fn writes_and_reads_back_every_type() {
    let dir = TestDir::new();
    let path = dir.path().join("model.safetensors");
    let owned = sample();
    write_safetensors(&path, &refs(&owned)).unwrap();
    assert_eq!(dir.file_names(), vec!["model.safetensors"]);

    let file = SafetensorsFile::open(&path).unwrap();
    assert_eq!(
        (file.len(), file.is_empty(), file.path()),
        (7, false, path.as_path())
    );
    let mut expected = refs(&owned);
    expected.sort_by_key(|t| t.name);
    assert_eq!(file.tensors().collect::<Vec<_>>(), expected);
    for t in &expected {
        assert_eq!(file.tensor(t.name).unwrap(), *t);
    }

    let f32s = |name: &str| file.tensor(name).unwrap().to_f32().unwrap();
    assert_eq!(f32s("w.f32"), vec![1.0, -2.0, 0.5, 3.25, 0.0, -0.125]);
    assert_eq!(f32s("w.f16"), vec![1.5, -2.0, 0.25, 8.0]);
    assert_eq!(f32s("w.bf16"), vec![0.5, -3.0]);
    assert_eq!(f32s("scalar.f64"), vec![0.1f32]);
    let ids = file.tensor("ids.i32").unwrap();
    assert_eq!((ids.len(), ids.is_empty()), (3, false));
    assert!(file.tensor("empty.i64").unwrap().is_empty());
    assert_eq!(
        ids.to_f32().unwrap_err().to_string(),
        "tensor 'ids.i32' has element type I32, not a floating-point type"
    );
    let err = file.tensor("nope").unwrap_err();
    assert!(matches!(err.kind(), SafetensorsErrorKind::NotFound(n) if n == "nope"));
    assert_eq!(
        err.to_string(),
        format!("{}: no tensor named 'nope'", path.display())
    );

    let empty = dir.path().join("empty.safetensors");
    write_safetensors(&empty, &[]).unwrap();
    assert!(SafetensorsFile::open(&empty).unwrap().is_empty());
}

#[test]
fn python_reads_what_we_write() {
    let have_numpy = Command::new("python3")
        .args(["-c", "import numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_numpy {
        eprintln!("skipping: python3 with numpy is not installed");
        return;
    }
    let dir = TestDir::new();
    let path = dir.path().join("model.safetensors");
    write_safetensors(&path, &refs(&sample())).unwrap();
    // An independent reading of the format: JSON header after a little-endian length, offsets
    // relative to the data section, which the last tensor ends exactly.
    let script = format!(
        "import json, struct, numpy as np\n\
         raw = open({path:?}, 'rb').read()\n\
         (n,) = struct.unpack('<Q', raw[:8])\n\
         header = json.loads(raw[8:8 + n])\n\
         data = raw[8 + n:]\n\
         assert max(t['data_offsets'][1] for k, t in header.items() if k != '__metadata__') == len(data)\n\
         def get(name, dt):\n    \
             t = header[name]; s, e = t['data_offsets']\n    \
             return np.frombuffer(data[s:e], dt).reshape(t['shape'])\n\
         assert header['w.bf16']['dtype'] == 'BF16' and header['mask']['dtype'] == 'BOOL'\n\
         assert (get('w.f32', '<f4') == np.array([[1, -2, 0.5], [3.25, 0, -0.125]])).all()\n\
         assert (get('w.f16', '<f2') == np.array([1.5, -2, 0.25, 8])).all()\n\
         assert get('scalar.f64', '<f8').shape == () and get('scalar.f64', '<f8') == 0.1\n\
         assert (get('ids.i32', '<i4') == [7, -1, 65536]).all()\n\
         assert get('empty.i64', '<i8').shape == (0, 4)\n\
         assert (get('mask', '|b1') == [True, False, False, True, True]).all()\n"
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn missing_and_short_files() {
    let dir = TestDir::new();
    let missing = dir.path().join("missing.safetensors");
    let err = SafetensorsFile::open(&missing).unwrap_err();
    assert!(
        matches!(err.kind(), SafetensorsErrorKind::Io(e) if e.kind() == io::ErrorKind::NotFound)
    );
    assert_eq!(err.path(), Some(missing.as_path()));
    assert!(std::error::Error::source(&err).is_some());

    let short = "truncated .safetensors file: the file is shorter than the 8-byte header length";
    assert_eq!(open_err(b""), short);
    assert_eq!(open_err(b"\x10\0\0"), short);
    assert_eq!(
        open_err(&raw_file("{}", b"")[..9]),
        "truncated .safetensors file: the header should be 2 bytes but only 1 follow its length"
    );
    assert_eq!(
        open_err(&(1u64 << 40).to_le_bytes()),
        ".safetensors header claims 1099511627776 bytes, more than the 100000000 allowed"
    );
}

#[test]
fn corrupt_headers_and_layouts_are_errors() {
    let f32_pair = le(&[1.0f32, 2.0], f32::to_le_bytes);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            raw_file("{not json", b""),
            "corrupt .safetensors header: key must be a string at line 1 column 2",
        ),
        (
            raw_file("[1, 2]", b""),
            "corrupt .safetensors header: the header is not a JSON object",
        ),
        (
            raw_file(r#"{"a": {"dtype": "F32", "shape": [2]}}"#, &f32_pair),
            "corrupt .safetensors header: the header is not a valid tensor table",
        ),
        (
            // The crate alone would overflow adding these offsets.
            raw_file(
                r#"{"a": {"dtype": "BOOL", "shape": [18446744073709551615],
                          "data_offsets": [0, 18446744073709551615]}}"#,
                b"",
            ),
            "tensor 'a' claims bytes 0..18446744073709551615 of a 0-byte data section",
        ),
        (
            raw_file(r#"{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}"#, &f32_pair),
            "tensor 'a' claims bytes 0..16 of a 8-byte data section",
        ),
        (
            raw_file(r#"{"a": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}}"#, &f32_pair),
            "tensor 'a' claims bytes 8..4 of a 8-byte data section",
        ),
        (
            raw_file(
                r#"{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                    "b": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]}}"#,
                &f32_pair,
            ),
            "corrupt .safetensors file: tensor 'b' does not start where the previous one ends",
        ),
        (
            raw_file(r#"{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}}"#, &f32_pair),
            "corrupt .safetensors file: a tensor's byte range does not match its element type and shape",
        ),
        (
            raw_file(r#"{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}"#, &f32_pair),
            "corrupt .safetensors file: the tensors' data does not end where the file ends",
        ),
        (
            raw_file(r#"{"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}"#, &f32_pair),
            "tensor 'a' has element type U8, which mslc does not support \
             (supported: F32 F16 BF16 F64 I32 I64 BOOL)",
        ),
        (
            raw_file(r#"{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}"#, &[0xff; 8])
                .into_iter()
                .enumerate()
                .map(|(i, b)| if i == 10 { 0xff } else { b })
                .collect(),
            "corrupt .safetensors header: invalid unicode code point at line 1 column 3",
        ),
    ];
    for (bytes, message) in cases {
        assert_eq!(open_err(&bytes), message);
    }
    // Metadata is allowed and ignored.
    let dir = TestDir::new();
    let with_metadata = raw_file(
        r#"{"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}"#,
        &f32_pair,
    );
    let file = open_bytes(&dir, &with_metadata).unwrap();
    assert_eq!(file.tensor("a").unwrap().to_f32().unwrap(), vec![1.0, 2.0]);
}

#[test]
fn bad_tensors_are_not_written() {
    let dir = TestDir::new();
    let path = dir.path().join("out.safetensors");
    fs::write(&path, b"previous").unwrap();
    let four = [0u8; 4];
    let t = |name, shape| TensorRef {
        name,
        dtype: StDType::F32,
        shape,
        data: &four,
    };
    let cases = [
        (
            vec![t("a", &[1]), t("a", &[1])],
            "two tensors are named 'a'",
        ),
        (
            vec![t("__metadata__", &[1])],
            "'__metadata__' is reserved and cannot name a tensor",
        ),
        (
            vec![t("a", &[2])],
            "tensor 'a' has 4 bytes, which does not match F32 [2]",
        ),
        (
            vec![t("a", &[usize::MAX, 2])],
            "tensor 'a' has 4 bytes, which does not match F32 [18446744073709551615, 2]",
        ),
    ];
    for (tensors, message) in cases {
        let err = write_safetensors(&path, &tensors).unwrap_err();
        assert_eq!(err.to_string(), format!("{}: {message}", path.display()));
    }
    assert_eq!(fs::read(&path).unwrap(), b"previous");
    assert_eq!(dir.file_names(), vec!["out.safetensors"]);

    let err =
        write_safetensors(dir.path().join("no/dir/x.safetensors"), &[t("a", &[1])]).unwrap_err();
    assert!(matches!(err.kind(), SafetensorsErrorKind::Io(_)));
}

#[test]
fn a_streamed_write_asks_for_each_tensor_once_and_equals_a_whole_write() {
    let dir = TestDir::new();
    let owned = sample();
    let whole = dir.path().join("whole.safetensors");
    write_safetensors(&whole, &refs(&owned)).unwrap();
    let streamed = dir.path().join("streamed.safetensors");
    let specs: Vec<TensorSpec> = refs(&owned).iter().map(TensorRef::spec).collect();
    let asked = RefCell::new(Vec::new());
    // Each tensor's bytes are made when asked for (owned), as a checkpoint converts them.
    let bytes = |i: usize| {
        asked.borrow_mut().push(i);
        Ok(Cow::Owned(owned[i].3.clone()))
    };
    write_safetensors_streamed(&streamed, &specs, &bytes).unwrap();
    assert_eq!(fs::read(&streamed).unwrap(), fs::read(&whole).unwrap());
    let mut asked = asked.into_inner();
    asked.sort_unstable();
    assert_eq!(asked, (0..owned.len()).collect::<Vec<_>>());
}

#[test]
fn a_streamed_write_that_cannot_have_a_tensor_leaves_the_file_as_it_was() {
    let dir = TestDir::new();
    let path = dir.path().join("out.safetensors");
    fs::write(&path, b"previous").unwrap();
    let owned = sample();
    let specs: Vec<TensorSpec> = refs(&owned).iter().map(TensorRef::spec).collect();
    let failing = |i: usize| match owned[i].0.as_str() {
        "w.f16" => Err("its rank stopped answering".to_string()),
        _ => Ok(Cow::Borrowed(owned[i].3.as_slice())),
    };
    let short = |i: usize| Ok(Cow::Borrowed(&owned[i].3[..owned[i].3.len() / 2]));
    let cases: [(&TensorBytes, &str); 2] = [
        (
            &failing,
            "cannot write tensor 'w.f16': its rank stopped answering",
        ),
        // The first tensor the file reaches (the format puts the widest type first).
        (
            &short,
            "tensor 'scalar.f64' has 4 bytes, which does not match F64 []",
        ),
    ];
    for (bytes, message) in cases {
        let err = write_safetensors_streamed(&path, &specs, bytes).unwrap_err();
        assert_eq!(err.to_string(), format!("{}: {message}", path.display()));
        assert_eq!(fs::read(&path).unwrap(), b"previous");
        assert_eq!(dir.file_names(), vec!["out.safetensors"]);
    }
}

proptest! {
    #[test]
    fn damaged_files_never_panic(
        cut in any::<prop::sample::Index>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let owned = sample();
        let bytes = ::safetensors::tensor::serialize(
            refs(&owned).into_iter().map(|t| (t.name, t)),
            &None,
        )
        .unwrap();
        prop_assert_eq!(index(&bytes).unwrap().len(), 7);
        let cut = cut.index(bytes.len());
        prop_assert!(index(&bytes[..cut]).is_err());
        let mut flipped = bytes.clone();
        for (at, value) in flips {
            let at = at.index(flipped.len());
            flipped[at] = value;
        }
        if let Ok(entries) = index(&flipped) {
            for e in entries {
                prop_assert!(e.start <= e.end && e.end <= flipped.len());
                prop_assert_eq!((e.end - e.start) % e.dtype.size(), 0);
            }
        }
    }
}

#[test]
fn a_tensor_named_twice_and_a_directory_are_refused_with_what_is_wrong() {
    let dir = TestDir::new();
    let header = r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
    let path = dir.path().join("dup.safetensors");
    fs::write(&path, raw_file(header, &[0u8; 8])).unwrap();
    let err = SafetensorsFile::open(&path)
        .expect_err("refused")
        .to_string();
    assert!(err.contains("two tensors are named 'w'"), "{err}");
    let err = SafetensorsFile::open(dir.path())
        .expect_err("refused")
        .to_string();
    assert!(err.contains("a directory"), "{err}");
}
