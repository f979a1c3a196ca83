//! `.safetensors` weight files: opened memory-mapped (tensor data is never copied until asked
//! for), listed and converted to `f32`; and written atomically.
//!
//! Parsing is done by the `safetensors` crate, after a bounds check of every tensor's byte range
//! against the file so that no header, however corrupt, can make it index out of range. Every
//! failure is a [`SafetensorsError`] naming the file.

#[cfg(test)]
mod tests;

use super::atomic::write_atomic;
use super::floats::{self, FloatLayout};
use ::safetensors::tensor::{Dtype, SafeTensorError, SafeTensors, View};
use memmap2::Mmap;
use std::borrow::Cow;
use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// Element types of the tensors mslc reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StDType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE binary64.
    F64,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// Boolean, one byte.
    Bool,
}

impl StDType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        self.to_crate().size()
    }

    /// The name the format uses, e.g. `BF16`.
    pub fn name(self) -> &'static str {
        match self {
            StDType::F32 => "F32",
            StDType::F16 => "F16",
            StDType::BF16 => "BF16",
            StDType::F64 => "F64",
            StDType::I32 => "I32",
            StDType::I64 => "I64",
            StDType::Bool => "BOOL",
        }
    }

    fn to_crate(self) -> Dtype {
        match self {
            StDType::F32 => Dtype::F32,
            StDType::F16 => Dtype::F16,
            StDType::BF16 => Dtype::BF16,
            StDType::F64 => Dtype::F64,
            StDType::I32 => Dtype::I32,
            StDType::I64 => Dtype::I64,
            StDType::Bool => Dtype::BOOL,
        }
    }

    fn from_crate(dtype: Dtype) -> Option<Self> {
        Some(match dtype {
            Dtype::F32 => StDType::F32,
            Dtype::F16 => StDType::F16,
            Dtype::BF16 => StDType::BF16,
            Dtype::F64 => StDType::F64,
            Dtype::I32 => StDType::I32,
            Dtype::I64 => StDType::I64,
            Dtype::BOOL => StDType::Bool,
            _ => return None,
        })
    }

    fn float_layout(self) -> Option<FloatLayout> {
        match self {
            StDType::F32 => Some(FloatLayout::F32),
            StDType::F16 => Some(FloatLayout::F16),
            StDType::BF16 => Some(FloatLayout::BF16),
            StDType::F64 => Some(FloatLayout::F64),
            StDType::I32 | StDType::I64 | StDType::Bool => None,
        }
    }
}

impl fmt::Display for StDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One tensor: its name, element type, shape and little-endian, row-major bytes. Borrowed from
/// an open file when listing, or from the caller when writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorRef<'a> {
    /// Name, e.g. `model.layers.0.mlp.up_proj.weight`.
    pub name: &'a str,
    /// Element type.
    pub dtype: StDType,
    /// Dimensions; empty for a scalar.
    pub shape: &'a [usize],
    /// The elements' bytes.
    pub data: &'a [u8],
}

impl TensorRef<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len() / self.dtype.size()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The elements as `f32`, for floating-point tensors (`F64` rounds to nearest).
    pub fn to_f32(&self) -> Result<Vec<f32>, SafetensorsError> {
        let layout = self
            .dtype
            .float_layout()
            .ok_or_else(|| SafetensorsErrorKind::NotFloat {
                tensor: self.name.to_string(),
                dtype: self.dtype,
            })?;
        Ok(floats::to_f32(self.data, layout))
    }
}

impl View for TensorRef<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype.to_crate()
    }

    fn shape(&self) -> &[usize] {
        self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.data)
    }

    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Where one tensor lives in the mapped file.
#[derive(Debug)]
struct Entry {
    name: String,
    dtype: StDType,
    shape: Vec<usize>,
    /// Byte range in the whole file.
    start: usize,
    end: usize,
}

/// An open, memory-mapped `.safetensors` file whose header has been checked.
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    map: Mmap,
    /// Sorted by name.
    entries: Vec<Entry>,
}

impl SafetensorsFile {
    /// Maps and checks the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, SafetensorsError> {
        let path = path.as_ref();
        let open = || -> Result<Self, SafetensorsErrorKind> {
            let file = File::open(path)?;
            let meta = file.metadata()?;
            if !meta.is_file() {
                let what = if meta.is_dir() {
                    "a directory"
                } else {
                    "not a regular file"
                };
                return Err(SafetensorsErrorKind::Io(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("it is {what}; give the path of a .safetensors file"),
                )));
            }
            if meta.len() < 8 {
                // Also spares mapping an empty file, which some systems refuse.
                return Err(SafetensorsErrorKind::Truncated(
                    "the file is shorter than the 8-byte header length".to_string(),
                ));
            }
            // SAFETY: the map is read-only. As with any mapped file, another process truncating
            // or rewriting the file while it is open is outside what this program can guard
            // against; mslc's own writes replace files by renaming, which leaves this map intact.
            let map = unsafe { Mmap::map(&file)? };
            let entries = index(&map)?;
            Ok(SafetensorsFile {
                path: path.to_path_buf(),
                map,
                entries,
            })
        };
        open().map_err(|kind| SafetensorsError {
            path: Some(path.to_path_buf()),
            kind,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the file holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every tensor, sorted by name.
    pub fn tensors(&self) -> impl Iterator<Item = TensorRef<'_>> {
        self.entries.iter().map(|e| self.view(e))
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Result<TensorRef<'_>, SafetensorsError> {
        self.entries
            .binary_search_by(|e| e.name.as_str().cmp(name))
            .map(|i| self.view(&self.entries[i]))
            .map_err(|_| SafetensorsError {
                path: Some(self.path.clone()),
                kind: SafetensorsErrorKind::NotFound(name.to_string()),
            })
    }

    fn view<'a>(&'a self, e: &'a Entry) -> TensorRef<'a> {
        view_in(&self.map, e)
    }
}

/// A checked safetensors blob already in memory (the weights a `.mir` embeds): the same checks
/// and views as [`SafetensorsFile`], without a file.
#[derive(Debug)]
pub struct SafetensorsBytes<'a> {
    bytes: &'a [u8],
    /// Sorted by name.
    entries: Vec<Entry>,
}

impl<'a> SafetensorsBytes<'a> {
    /// Checks `bytes` as a whole safetensors file.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, SafetensorsError> {
        let entries = index(bytes)?;
        Ok(SafetensorsBytes { bytes, entries })
    }

    /// Every tensor, sorted by name.
    pub fn tensors(&self) -> impl Iterator<Item = TensorRef<'_>> {
        self.entries.iter().map(|e| view_in(self.bytes, e))
    }
}

/// The tensor `e` describes, in the whole file's `bytes`.
fn view_in<'a>(bytes: &'a [u8], e: &'a Entry) -> TensorRef<'a> {
    TensorRef {
        name: &e.name,
        dtype: e.dtype,
        shape: &e.shape,
        data: &bytes[e.start..e.end],
    }
}

/// Checks a whole file's bytes and lists its tensors, sorted by name.
fn index(bytes: &[u8]) -> Result<Vec<Entry>, SafetensorsErrorKind> {
    let header_end = check_bounds(bytes)?;
    let (_, metadata) = SafeTensors::read_metadata(bytes).map_err(crate_error)?;
    let mut entries = metadata
        .tensors()
        .into_iter()
        .map(|(name, info)| {
            let dtype = StDType::from_crate(info.dtype).ok_or_else(|| {
                SafetensorsErrorKind::UnsupportedDType {
                    tensor: name.clone(),
                    dtype: format!("{:?}", info.dtype),
                }
            })?;
            let (start, end) = info.data_offsets;
            Ok(Entry {
                dtype,
                shape: info.shape.clone(),
                start: header_end + start,
                end: header_end + end,
                name,
            })
        })
        .collect::<Result<Vec<_>, SafetensorsErrorKind>>()?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

/// Largest header accepted (the `safetensors` crate's own limit).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Checks the header length and that every tensor's byte range lies inside the data section
/// (which the `safetensors` crate assumes when it adds offsets); returns where the data starts.
fn check_bounds(bytes: &[u8]) -> Result<usize, SafetensorsErrorKind> {
    let len_bytes: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| {
            SafetensorsErrorKind::Truncated(
                "the file is shorter than the 8-byte header length".to_string(),
            )
        })?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > MAX_HEADER_BYTES {
        return Err(SafetensorsErrorKind::HeaderTooLarge(header_len));
    }
    let available = bytes.len() as u64 - 8;
    if header_len > available {
        return Err(SafetensorsErrorKind::Truncated(format!(
            "the header should be {header_len} bytes but only {available} follow its length"
        )));
    }
    let header_end = 8 + header_len as usize;
    let data_len = (bytes.len() - header_end) as u64;
    // Only the offsets are looked at here; everything else is left to the crate.
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..header_end])
        .map_err(|e| SafetensorsErrorKind::CorruptHeader(e.to_string()))?;
    let tensors = header.as_object().ok_or_else(|| {
        SafetensorsErrorKind::CorruptHeader("the header is not a JSON object".to_string())
    })?;
    // A JSON object keeps the last of two equal keys; a weights file must not name one tensor
    // twice and have the second silently win.
    if let Err(e) = serde_json::from_slice::<UniqueKeys>(&bytes[8..header_end]) {
        let message = e.to_string();
        return Err(match message.strip_prefix(DUPLICATE_KEY) {
            Some(rest) => {
                let name = rest.split(" at line").next().unwrap_or(rest);
                SafetensorsErrorKind::DuplicateName(name.to_string())
            }
            None => SafetensorsErrorKind::CorruptHeader(message),
        });
    }
    for (name, info) in tensors.iter().filter(|(name, _)| *name != "__metadata__") {
        let offsets = info.get("data_offsets").and_then(|o| o.as_array());
        if let Some([start, end]) = offsets.map(Vec::as_slice) {
            if let (Some(start), Some(end)) = (start.as_u64(), end.as_u64()) {
                if start > end || end > data_len {
                    return Err(SafetensorsErrorKind::DataOutOfRange {
                        tensor: name.clone(),
                        start,
                        end,
                        data_len,
                    });
                }
            }
        }
    }
    Ok(header_end)
}

/// The prefix of the error [`UniqueKeys`] reports; the key follows it.
const DUPLICATE_KEY: &str = "duplicate key: ";

/// A JSON object read only to check that no key appears twice.
struct UniqueKeys;

impl<'de> serde::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = UniqueKeys;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<UniqueKeys, A::Error> {
                let mut seen = std::collections::HashSet::new();
                while let Some(key) = map.next_key::<String>()? {
                    map.next_value::<serde::de::IgnoredAny>()?;
                    if !seen.insert(key.clone()) {
                        return Err(serde::de::Error::custom(format!("{DUPLICATE_KEY}{key}")));
                    }
                }
                Ok(UniqueKeys)
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

/// Turns a `safetensors` crate error into a kind saying what is wrong with the file. Header
/// length errors cannot reach here: [`check_bounds`] reports them first.
fn crate_error(e: SafeTensorError) -> SafetensorsErrorKind {
    use SafetensorsErrorKind as K;
    let corrupt = |why: &str| K::CorruptHeader(why.to_string());
    match e {
        SafeTensorError::InvalidHeader => corrupt("the header is not UTF-8"),
        SafeTensorError::InvalidHeaderStart => corrupt("the header does not start with '{'"),
        SafeTensorError::InvalidHeaderDeserialization | SafeTensorError::JsonError(_) => {
            corrupt("the header is not a valid tensor table")
        }
        SafeTensorError::InvalidOffset(tensor) => K::BadLayout(format!(
            "tensor '{tensor}' does not start where the previous one ends"
        )),
        SafeTensorError::TensorInvalidInfo => K::BadLayout(
            "a tensor's byte range does not match its element type and shape".to_string(),
        ),
        SafeTensorError::MetadataIncompleteBuffer => {
            K::BadLayout("the tensors' data does not end where the file ends".to_string())
        }
        SafeTensorError::ValidationOverflow => {
            K::BadLayout("a tensor's shape holds more bytes than fit in memory".to_string())
        }
        SafeTensorError::IoError(e) => K::Io(e),
        other => corrupt(&format!("{other:?}")),
    }
}

/// Writes `tensors` to `path` as a `.safetensors` file, atomically: a reader sees the old file
/// or the complete new one. Names must be distinct and each tensor's bytes must match its type
/// and shape.
pub fn write_safetensors(
    path: impl AsRef<Path>,
    tensors: &[TensorRef<'_>],
) -> Result<(), SafetensorsError> {
    let path = path.as_ref();
    let at_path = |kind| SafetensorsError {
        path: Some(path.to_path_buf()),
        kind,
    };
    check_for_writing(tensors).map_err(at_path)?;
    write_atomic(path, |tmp| {
        ::safetensors::tensor::serialize_to_file(tensors.iter().map(|t| (t.name, *t)), &None, tmp)
            .map_err(|e| match e {
                SafeTensorError::IoError(e) => SafetensorsErrorKind::Io(e),
                other => SafetensorsErrorKind::CorruptHeader(format!("{other:?}")),
            })
    })
    .map_err(at_path)
}

/// The checks the `safetensors` crate leaves to its callers: distinct names, none reserved, and
/// bytes matching type and shape.
fn check_for_writing(tensors: &[TensorRef<'_>]) -> Result<(), SafetensorsErrorKind> {
    let mut names: Vec<&str> = tensors.iter().map(|t| t.name).collect();
    names.sort_unstable();
    if let Some(pair) = names.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(SafetensorsErrorKind::DuplicateName(pair[0].to_string()));
    }
    for t in tensors {
        if t.name == "__metadata__" {
            return Err(SafetensorsErrorKind::ReservedName);
        }
        let expected = t
            .shape
            .iter()
            .try_fold(t.dtype.size() as u64, |n, &d| n.checked_mul(d as u64));
        if expected != Some(t.data.len() as u64) {
            return Err(SafetensorsErrorKind::DataSize {
                tensor: t.name.to_string(),
                dtype: t.dtype,
                shape: t.shape.to_vec(),
                found: t.data.len() as u64,
            });
        }
    }
    Ok(())
}

/// Why a `.safetensors` file could not be read or written, and which file.
#[derive(Debug)]
pub struct SafetensorsError {
    path: Option<PathBuf>,
    kind: SafetensorsErrorKind,
}

/// What went wrong with a `.safetensors` file or tensor.
#[derive(Debug)]
#[non_exhaustive]
pub enum SafetensorsErrorKind {
    /// Reading or writing failed (a missing file, for one).
    Io(io::Error),
    /// The file ends too early; says where.
    Truncated(String),
    /// The header length is larger than any real header.
    HeaderTooLarge(u64),
    /// The header is not a valid tensor table; says why.
    CorruptHeader(String),
    /// A tensor's byte range reaches outside the data section.
    DataOutOfRange {
        /// The tensor.
        tensor: String,
        /// Start of its range, relative to the data section.
        start: u64,
        /// End of its range.
        end: u64,
        /// Length of the data section.
        data_len: u64,
    },
    /// The tensors' byte ranges do not tile the data section as the format requires; says how.
    BadLayout(String),
    /// A tensor of an element type mslc does not handle.
    UnsupportedDType {
        /// The tensor.
        tensor: String,
        /// The type's name in the file.
        dtype: String,
    },
    /// No tensor has the requested name.
    NotFound(String),
    /// `to_f32` on a tensor that is not floating point.
    NotFloat {
        /// The tensor.
        tensor: String,
        /// Its type.
        dtype: StDType,
    },
    /// Two tensors to write have the same name.
    DuplicateName(String),
    /// A tensor to write is named `__metadata__`, which the format reserves.
    ReservedName,
    /// A tensor to write has bytes that do not match its type and shape.
    DataSize {
        /// The tensor.
        tensor: String,
        /// Its type.
        dtype: StDType,
        /// Its shape.
        shape: Vec<usize>,
        /// Bytes given.
        found: u64,
    },
}

impl SafetensorsError {
    /// What went wrong.
    pub fn kind(&self) -> &SafetensorsErrorKind {
        &self.kind
    }

    /// The file concerned, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
}

impl From<SafetensorsErrorKind> for SafetensorsError {
    fn from(kind: SafetensorsErrorKind) -> Self {
        SafetensorsError { path: None, kind }
    }
}

impl From<io::Error> for SafetensorsErrorKind {
    fn from(e: io::Error) -> Self {
        SafetensorsErrorKind::Io(e)
    }
}

impl fmt::Display for SafetensorsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use SafetensorsErrorKind as K;
        if let Some(path) = &self.path {
            write!(f, "{}: ", path.display())?;
        }
        match &self.kind {
            K::Io(e) => write!(f, "{e}"),
            K::Truncated(why) => write!(f, "truncated .safetensors file: {why}"),
            K::HeaderTooLarge(len) => write!(
                f,
                ".safetensors header claims {len} bytes, more than the {MAX_HEADER_BYTES} allowed"
            ),
            K::CorruptHeader(why) => write!(f, "corrupt .safetensors header: {why}"),
            K::DataOutOfRange {
                tensor,
                start,
                end,
                data_len,
            } => write!(
                f,
                "tensor '{tensor}' claims bytes {start}..{end} of a {data_len}-byte data section"
            ),
            K::BadLayout(why) => write!(f, "corrupt .safetensors file: {why}"),
            K::UnsupportedDType { tensor, dtype } => write!(
                f,
                "tensor '{tensor}' has element type {dtype}, which mslc does not support \
                 (supported: F32 F16 BF16 F64 I32 I64 BOOL)"
            ),
            K::NotFound(name) => write!(f, "no tensor named '{name}'"),
            K::NotFloat { tensor, dtype } => write!(
                f,
                "tensor '{tensor}' has element type {dtype}, not a floating-point type"
            ),
            K::DuplicateName(name) => write!(f, "two tensors are named '{name}'"),
            K::ReservedName => write!(f, "'__metadata__' is reserved and cannot name a tensor"),
            K::DataSize {
                tensor,
                dtype,
                shape,
                found,
            } => write!(
                f,
                "tensor '{tensor}' has {found} bytes, which does not match {dtype} {shape:?}"
            ),
        }
    }
}

impl std::error::Error for SafetensorsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            SafetensorsErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}
