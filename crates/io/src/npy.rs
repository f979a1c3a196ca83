//! NumPy `.npy` files: one dense, little-endian, row-major array per file.
//!
//! Reads format versions 1.0, 2.0 and 3.0 and writes 1.0 (what NumPy writes for every array this
//! module supports), atomically. The element types are the ones mslc feeds and checks models with:
//! `<f4 <f8 <f2 <i4 <i8 |b1 |u1`. Anything else — big-endian or structured types, Fortran order, a
//! header that is not the expected dict, data that does not match the shape — is an [`NpyError`].

mod header;

#[cfg(test)]
mod tests;

use super::atomic::write_atomic;
use super::floats::{self, FloatLayout};
use std::borrow::Cow;
use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// The bytes every `.npy` file starts with.
const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Most dimensions an array may have (NumPy's own limit since 2.0).
pub const MAX_DIMS: usize = 64;

/// Largest header accepted when reading. Headers of supported arrays take well under a kilobyte;
/// the limit keeps a corrupt length from causing a huge allocation.
const MAX_HEADER_BYTES: u64 = 1 << 20;

/// Most bytes reserved up front for the data of a stream of unknown length (it grows as data
/// arrives), so that a corrupt shape cannot cause a huge allocation.
const UNKNOWN_LENGTH_RESERVE: u64 = 1 << 24;

/// Element type of an array, with its NumPy type string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NpyDType {
    /// `<f4`: IEEE binary32.
    F32,
    /// `<f8`: IEEE binary64.
    F64,
    /// `<f2`: IEEE binary16.
    F16,
    /// `<i4`: 32-bit signed integer.
    I32,
    /// `<i8`: 64-bit signed integer.
    I64,
    /// `|b1`: boolean, one byte, 0 or 1.
    Bool,
    /// `|u1`: unsigned byte.
    U8,
}

impl NpyDType {
    /// Every supported type.
    pub const ALL: [NpyDType; 7] = [
        NpyDType::F32,
        NpyDType::F64,
        NpyDType::F16,
        NpyDType::I32,
        NpyDType::I64,
        NpyDType::Bool,
        NpyDType::U8,
    ];

    /// The NumPy type string (`descr`) of this type.
    pub fn descr(self) -> &'static str {
        match self {
            NpyDType::F32 => "<f4",
            NpyDType::F64 => "<f8",
            NpyDType::F16 => "<f2",
            NpyDType::I32 => "<i4",
            NpyDType::I64 => "<i8",
            NpyDType::Bool => "|b1",
            NpyDType::U8 => "|u1",
        }
    }

    /// The type with NumPy type string `descr`, if supported.
    pub fn from_descr(descr: &str) -> Option<NpyDType> {
        NpyDType::ALL.into_iter().find(|d| d.descr() == descr)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            NpyDType::Bool | NpyDType::U8 => 1,
            NpyDType::F16 => 2,
            NpyDType::F32 | NpyDType::I32 => 4,
            NpyDType::F64 | NpyDType::I64 => 8,
        }
    }

    /// How elements of this type decode to `f32`, if they are floating point.
    fn float_layout(self) -> Option<FloatLayout> {
        match self {
            NpyDType::F16 => Some(FloatLayout::F16),
            NpyDType::F32 => Some(FloatLayout::F32),
            NpyDType::F64 => Some(FloatLayout::F64),
            NpyDType::I32 | NpyDType::I64 | NpyDType::Bool | NpyDType::U8 => None,
        }
    }
}

impl fmt::Display for NpyDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.descr())
    }
}

/// A dense array: element type, shape, and the little-endian, row-major bytes of its elements.
/// Construction checks that the bytes match the shape, so every `NpyArray` can be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyArray {
    dtype: NpyDType,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl NpyArray {
    /// An array of `dtype` and `shape` holding `data`, which must be exactly
    /// `product(shape) * dtype.size()` bytes.
    pub fn new(dtype: NpyDType, shape: Vec<usize>, data: Vec<u8>) -> Result<Self, NpyError> {
        check_data_len(dtype, &shape, data.len())?;
        Ok(NpyArray { dtype, shape, data })
    }

    /// An `f32` array of `shape` holding `values`.
    pub fn from_f32(shape: Vec<usize>, values: &[f32]) -> Result<Self, NpyError> {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        NpyArray::new(NpyDType::F32, shape, data)
    }

    /// An `i64` array of `shape` holding `values`.
    pub fn from_i64(shape: Vec<usize>, values: &[i64]) -> Result<Self, NpyError> {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        NpyArray::new(NpyDType::I64, shape, data)
    }

    /// The element type.
    pub fn dtype(&self) -> NpyDType {
        self.dtype
    }

    /// The dimensions; empty for a scalar.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The elements' bytes, little-endian, row-major.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// The elements' bytes, giving up the array.
    pub fn into_data(self) -> Vec<u8> {
        self.data
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len() / self.dtype.size()
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The elements as `f32`, for floating-point arrays (`f64` rounds to nearest).
    pub fn to_f32(&self) -> Result<Vec<f32>, NpyError> {
        let layout = self
            .dtype
            .float_layout()
            .ok_or(NpyErrorKind::DTypeMismatch {
                wanted: "floating-point",
                found: self.dtype,
            })?;
        Ok(floats::to_f32(&self.data, layout))
    }

    /// The elements as `i64`, for integer and boolean arrays.
    pub fn to_i64(&self) -> Result<Vec<i64>, NpyError> {
        let d = &self.data;
        Ok(match self.dtype {
            NpyDType::I64 => d
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
            NpyDType::I32 => d
                .chunks_exact(4)
                .map(|c| i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
            NpyDType::U8 => d.iter().map(|&b| i64::from(b)).collect(),
            NpyDType::Bool => d.iter().map(|&b| i64::from(b != 0)).collect(),
            found @ (NpyDType::F16 | NpyDType::F32 | NpyDType::F64) => {
                return Err(NpyErrorKind::DTypeMismatch {
                    wanted: "integer or boolean",
                    found,
                }
                .into())
            }
        })
    }

    /// Parses a whole `.npy` file held in memory.
    pub fn from_npy_bytes(bytes: &[u8]) -> Result<Self, NpyError> {
        read(bytes, Some(bytes.len() as u64))
    }

    /// Reads one `.npy` file from `reader`, which must end where the array's data ends.
    pub fn read_from(reader: impl Read) -> Result<Self, NpyError> {
        read(reader, None)
    }

    /// The array as `.npy` file bytes (format 1.0).
    pub fn to_npy_bytes(&self) -> Vec<u8> {
        let mut bytes = self.header_bytes();
        bytes.extend_from_slice(&self.data);
        bytes
    }

    /// Writes the array as a `.npy` file (format 1.0) to `writer`.
    pub fn write_to(&self, mut writer: impl Write) -> Result<(), NpyError> {
        writer.write_all(&self.header_bytes())?;
        writer.write_all(&self.data)?;
        Ok(())
    }

    /// What a `.npy` file holds before [`NpyArray::data`] ([`header_bytes`]).
    pub fn header_bytes(&self) -> Vec<u8> {
        header_bytes(self.dtype, &self.shape)
    }
}

/// An array whose data stays where it lies (an executor's buffer) or is owned: what writing a
/// `.npy` file needs, so writing a value needs no copy of it. Construction checks that the
/// bytes match the shape, as [`NpyArray::new`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyView<'a> {
    dtype: NpyDType,
    shape: Vec<usize>,
    data: Cow<'a, [u8]>,
}

impl<'a> NpyView<'a> {
    /// A view of `dtype` and `shape` over `data`, which must be exactly
    /// `product(shape) * dtype.size()` bytes.
    pub fn new(
        dtype: NpyDType,
        shape: Vec<usize>,
        data: impl Into<Cow<'a, [u8]>>,
    ) -> Result<Self, NpyError> {
        let data = data.into();
        check_data_len(dtype, &shape, data.len())?;
        Ok(NpyView { dtype, shape, data })
    }

    /// The elements' bytes, little-endian, row-major.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// What a `.npy` file holds before [`NpyView::data`] ([`header_bytes`]).
    pub fn header_bytes(&self) -> Vec<u8> {
        header_bytes(self.dtype, &self.shape)
    }

    /// The array, its data copied where it was borrowed.
    pub fn into_array(self) -> NpyArray {
        NpyArray {
            dtype: self.dtype,
            shape: self.shape,
            data: self.data.into_owned(),
        }
    }
}

impl From<NpyArray> for NpyView<'static> {
    fn from(array: NpyArray) -> Self {
        NpyView {
            dtype: array.dtype,
            shape: array.shape,
            data: Cow::Owned(array.data),
        }
    }
}

/// Whether `len` bytes are exactly the data of a `dtype` array of `shape`.
fn check_data_len(dtype: NpyDType, shape: &[usize], len: usize) -> Result<(), NpyError> {
    let expected = data_bytes(dtype, shape)?;
    if len as u64 != expected {
        return Err(NpyErrorKind::DataLength {
            expected,
            found: len as u64,
        }
        .into());
    }
    Ok(())
}

/// What a `.npy` file of `dtype` and `shape` holds before its data: magic, version 1.0, header
/// length and header, padded with spaces and a newline so that the data starts at a multiple
/// of 64 bytes, as NumPy does.
fn header_bytes(dtype: NpyDType, shape: &[usize]) -> Vec<u8> {
    let dict = header::format(dtype.descr(), shape);
    let unpadded = MAGIC.len() + 4 + dict.len() + 1;
    let padding = unpadded.next_multiple_of(64) - unpadded;
    // With at most MAX_DIMS dimensions the header stays far below 65,535 bytes.
    let header_len = (dict.len() + padding + 1) as u16;
    let mut bytes = Vec::with_capacity(unpadded + padding);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&[1, 0]);
    bytes.extend_from_slice(&header_len.to_le_bytes());
    bytes.extend_from_slice(dict.as_bytes());
    bytes.resize(bytes.len() + padding, b' ');
    bytes.push(b'\n');
    bytes
}

/// Reads the `.npy` file at `path`.
pub fn read_npy(path: impl AsRef<Path>) -> Result<NpyArray, NpyError> {
    let path = path.as_ref();
    let read_file = || -> Result<NpyArray, NpyError> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        read(BufReader::new(file), Some(len))
    };
    read_file().map_err(|e| e.at(path))
}

/// Writes `array` to `path` as a `.npy` file, atomically: a reader sees the old file or the
/// complete new one.
pub fn write_npy(path: impl AsRef<Path>, array: &NpyArray) -> Result<(), NpyError> {
    let path = path.as_ref();
    write_atomic(path, |tmp| {
        // `create`, not `create_new`: `tmp` is the target itself when that is a device or FIFO.
        let mut writer = BufWriter::new(File::create(tmp)?);
        array.write_to(&mut writer)?;
        writer.flush()?;
        Ok(())
    })
    .map_err(|e: NpyError| e.at(path))
}

/// Bytes of data an array of `dtype` and `shape` holds, checking the shape.
fn data_bytes(dtype: NpyDType, shape: &[usize]) -> Result<u64, NpyError> {
    if shape.len() > MAX_DIMS {
        return Err(NpyErrorKind::TooManyDims(shape.len()).into());
    }
    shape
        .iter()
        .try_fold(dtype.size() as u64, |n, &d| n.checked_mul(d as u64))
        .filter(|&n| usize::try_from(n).is_ok())
        .ok_or_else(|| NpyErrorKind::ShapeOverflow(shape.to_vec()).into())
}

/// Reads one `.npy` file from `reader`; `total`, when known, is the reader's length, which lets
/// a data-length mismatch be reported before reading the data.
fn read(mut reader: impl Read, total: Option<u64>) -> Result<NpyArray, NpyError> {
    let mut lead = [0u8; 8];
    read_section(&mut reader, &mut lead, "magic string and version")?;
    if lead[..6] != MAGIC[..] {
        return Err(NpyErrorKind::BadMagic.into());
    }
    let (major, minor) = (lead[6], lead[7]);
    let header_len = match (major, minor) {
        (1, 0) => {
            let mut len = [0u8; 2];
            read_section(&mut reader, &mut len, "header length")?;
            u64::from(u16::from_le_bytes(len))
        }
        (2, 0) | (3, 0) => {
            let mut len = [0u8; 4];
            read_section(&mut reader, &mut len, "header length")?;
            u64::from(u32::from_le_bytes(len))
        }
        _ => return Err(NpyErrorKind::UnsupportedVersion { major, minor }.into()),
    };
    if header_len > MAX_HEADER_BYTES {
        return Err(NpyErrorKind::HeaderTooLarge(header_len).into());
    }
    let preamble = header_len + if major == 1 { 10 } else { 12 };
    let mut raw = vec![0u8; header_len as usize];
    read_section(&mut reader, &mut raw, "header")?;
    // Versions 1 and 2 store the header in Latin-1, version 3 in UTF-8.
    let text = if major == 3 {
        String::from_utf8(raw).map_err(|_| NpyErrorKind::BadHeader("not UTF-8".to_string()))?
    } else {
        raw.iter().map(|&b| char::from(b)).collect()
    };
    let header = header::parse(&text).map_err(NpyErrorKind::BadHeader)?;
    let dtype = NpyDType::from_descr(&header.descr)
        .ok_or_else(|| NpyErrorKind::UnsupportedDType(header.descr.clone()))?;
    if header.fortran_order {
        return Err(NpyErrorKind::FortranOrder.into());
    }
    let expected = data_bytes(dtype, &header.shape)?;
    if let Some(found) = total.map(|t| t.saturating_sub(preamble)) {
        if found != expected {
            return Err(NpyErrorKind::DataLength { expected, found }.into());
        }
    }
    let reserve = if total.is_some() {
        expected
    } else {
        expected.min(UNKNOWN_LENGTH_RESERVE)
    };
    let mut data = Vec::with_capacity(reserve as usize);
    reader.by_ref().take(expected).read_to_end(&mut data)?;
    let found = data.len() as u64;
    let extra = io::copy(&mut reader, &mut io::sink())?;
    if found != expected || extra > 0 {
        return Err(NpyErrorKind::DataLength {
            expected,
            found: found + extra,
        }
        .into());
    }
    Ok(NpyArray {
        dtype,
        shape: header.shape,
        data,
    })
}

/// Fills `buf` from `reader`; running out of input is a truncated `section`.
fn read_section(
    reader: &mut impl Read,
    buf: &mut [u8],
    section: &'static str,
) -> Result<(), NpyError> {
    reader.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => NpyErrorKind::Truncated(section).into(),
        _ => NpyError::from(e),
    })
}

/// Why a `.npy` file could not be read or written, and which file, when there is one.
#[derive(Debug)]
pub struct NpyError {
    path: Option<PathBuf>,
    kind: NpyErrorKind,
}

/// What went wrong with a `.npy` file.
#[derive(Debug)]
#[non_exhaustive]
pub enum NpyErrorKind {
    /// Reading or writing failed.
    Io(io::Error),
    /// The file does not start with the `.npy` magic string.
    BadMagic,
    /// The file ends inside the named part of its preamble.
    Truncated(&'static str),
    /// A format version other than 1.0, 2.0 and 3.0.
    UnsupportedVersion {
        /// Major version.
        major: u8,
        /// Minor version.
        minor: u8,
    },
    /// The header length is implausibly large.
    HeaderTooLarge(u64),
    /// The header is not the expected dict; says why.
    BadHeader(String),
    /// An element type this module does not handle (the NumPy type string).
    UnsupportedDType(String),
    /// The data is stored column-major.
    FortranOrder,
    /// More than [`MAX_DIMS`] dimensions.
    TooManyDims(usize),
    /// The shape's element count, in bytes, does not fit in memory.
    ShapeOverflow(Vec<usize>),
    /// The data is not as long as the shape says.
    DataLength {
        /// Bytes the shape and type call for.
        expected: u64,
        /// Bytes present.
        found: u64,
    },
    /// A conversion that does not apply to this element type.
    DTypeMismatch {
        /// The kind of type the conversion needs.
        wanted: &'static str,
        /// The array's type.
        found: NpyDType,
    },
}

impl NpyError {
    /// What went wrong.
    pub fn kind(&self) -> &NpyErrorKind {
        &self.kind
    }

    /// The file concerned, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The same error, about the file at `path`.
    fn at(mut self, path: &Path) -> Self {
        self.path = Some(path.to_path_buf());
        self
    }
}

impl From<NpyErrorKind> for NpyError {
    fn from(kind: NpyErrorKind) -> Self {
        NpyError { path: None, kind }
    }
}

impl From<io::Error> for NpyError {
    fn from(e: io::Error) -> Self {
        NpyErrorKind::Io(e).into()
    }
}

impl fmt::Display for NpyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(path) = &self.path {
            write!(f, "{}: ", path.display())?;
        }
        match &self.kind {
            NpyErrorKind::Io(e) => write!(f, "{e}"),
            NpyErrorKind::BadMagic => write!(f, "not a .npy file (bad magic string)"),
            NpyErrorKind::Truncated(section) => {
                write!(f, "truncated .npy file: it ends inside the {section}")
            }
            NpyErrorKind::UnsupportedVersion { major, minor } => write!(
                f,
                ".npy format version {major}.{minor} is not supported (only 1.0, 2.0 and 3.0)"
            ),
            NpyErrorKind::HeaderTooLarge(len) => write!(
                f,
                ".npy header claims {len} bytes, more than the {MAX_HEADER_BYTES} allowed"
            ),
            NpyErrorKind::BadHeader(why) => write!(f, "malformed .npy header: {why}"),
            NpyErrorKind::UnsupportedDType(descr) => {
                let supported: Vec<&str> = NpyDType::ALL.iter().map(|d| d.descr()).collect();
                write!(
                    f,
                    "unsupported element type '{descr}' (supported: {})",
                    supported.join(" ")
                )
            }
            NpyErrorKind::FortranOrder => write!(
                f,
                "array is stored in Fortran (column-major) order; save it in C order \
                 (numpy.ascontiguousarray) instead"
            ),
            NpyErrorKind::TooManyDims(n) => {
                write!(
                    f,
                    "array has {n} dimensions, more than the {MAX_DIMS} allowed"
                )
            }
            NpyErrorKind::ShapeOverflow(shape) => {
                write!(f, "shape {shape:?} holds more bytes than fit in memory")
            }
            NpyErrorKind::DataLength { expected, found } => write!(
                f,
                "array data is {found} bytes but its shape and type call for {expected}"
            ),
            NpyErrorKind::DTypeMismatch { wanted, found } => {
                write!(f, "expected a {wanted} array, found element type '{found}'")
            }
        }
    }
}

impl std::error::Error for NpyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            NpyErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}
