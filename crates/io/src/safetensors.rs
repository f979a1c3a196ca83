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
use std::cell::RefCell;
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

/// How far around a page fault Linux maps a file's pages that are already in memory
/// (`fault_around_bytes`, 64 KiB unless changed): reading a tensor holds up to this much of
/// the file on either side of it.
pub const FAULT_AROUND_BYTES: usize = 64 << 10;

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

    /// Drops from this process's resident memory the pages of the file that hold `data`, the
    /// bytes of one of its tensors (any other slice is left alone): once a tensor has been
    /// copied to where it is used, its pages need not stay, so a load holds one tensor of the
    /// file at a time rather than all of it. The bytes stay readable: touched again, they are
    /// read again from the file.
    ///
    /// Reading a page maps its neighbours too (the kernel's fault-around, 64 KiB by default),
    /// which re-maps the end of the tensor read before; so the pages up to that much before
    /// `data` are dropped as well.
    pub fn release(&self, data: &[u8]) {
        let start = (data.as_ptr() as usize).wrapping_sub(self.map.as_ptr() as usize);
        if !data.is_empty() && start < self.map.len() && data.len() <= self.map.len() - start {
            let before = start.min(FAULT_AROUND_BYTES);
            self.drop_pages(start - before, data.len() + before);
        }
    }

    /// Drops every page of the file from this process's resident memory, as
    /// [`SafetensorsFile::release`] does one tensor's: after a pass over the tensors in another
    /// order than the file's, what fault-around mapped beyond each.
    pub fn release_all(&self) {
        self.drop_pages(0, self.map.len());
    }

    /// Drops the pages holding bytes `start..start + len` of the file.
    fn drop_pages(&self, start: usize, len: usize) {
        #[cfg(unix)]
        {
            // SAFETY: `sysconf` only reads a system constant.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
            let first = start - start % page;
            let end = (start + len).div_ceil(page).saturating_mul(page);
            let end = end.min(self.map.len());
            // SAFETY: the map is a read-only, shared mapping of a file: dropping its pages
            // changes no byte anyone reads (the kernel reads them again from the file), so the
            // slices borrowed from it stay valid. A failure only leaves the pages resident.
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    first,
                    end - first,
                )
            };
        }
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
    for t in tensors {
        let spec = t.spec();
        if spec.data_len() != Some(t.data.len()) {
            return Err(SafetensorsError {
                path: Some(path.to_path_buf()),
                kind: spec.wrong_size(t.data.len()),
            });
        }
    }
    let specs: Vec<TensorSpec> = tensors.iter().map(TensorRef::spec).collect();
    write_safetensors_streamed(path, &specs, &|i| Ok(Cow::Borrowed(tensors[i].data)))
}

/// A tensor to write whose bytes are asked for only when the writer reaches it
/// ([`write_safetensors_streamed`]): its name, element type and shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorSpec<'a> {
    /// Name, e.g. `model.layers.0.mlp.up_proj.weight`.
    pub name: &'a str,
    /// Element type.
    pub dtype: StDType,
    /// Dimensions; empty for a scalar.
    pub shape: &'a [usize],
}

impl TensorSpec<'_> {
    /// Bytes the tensor's type and shape take, unless that overflows.
    fn data_len(&self) -> Option<usize> {
        self.shape
            .iter()
            .try_fold(self.dtype.size(), |n, &d| n.checked_mul(d))
    }

    /// The error for `found` bytes that do not match the type and shape.
    fn wrong_size(&self, found: usize) -> SafetensorsErrorKind {
        SafetensorsErrorKind::DataSize {
            tensor: self.name.to_string(),
            dtype: self.dtype,
            shape: self.shape.to_vec(),
            found: found as u64,
        }
    }
}

impl<'a> TensorRef<'a> {
    /// The tensor's name, type and shape.
    pub fn spec(&self) -> TensorSpec<'a> {
        TensorSpec {
            name: self.name,
            dtype: self.dtype,
            shape: self.shape,
        }
    }
}

/// Where a tensor's bytes come from as [`write_safetensors_streamed`] reaches it: tensor `i` of
/// the specs, borrowed or made for the moment, or why they cannot be had.
pub type TensorBytes<'d> = dyn Fn(usize) -> Result<Cow<'d, [u8]>, String> + 'd;

/// Writes the tensors `specs` to `path` as [`write_safetensors`] does, asking `bytes(i)` for
/// tensor `i`'s bytes only when the file reaches it and dropping them before the next: the
/// data is never all in memory at once, so writing a checkpoint costs its largest tensor, not
/// a copy of the model. Bytes that do not match their spec's type and shape, or a `bytes`
/// failure, fail the write and leave any earlier file at `path` as it was.
pub fn write_safetensors_streamed<'d>(
    path: impl AsRef<Path>,
    specs: &[TensorSpec<'_>],
    bytes: &TensorBytes<'d>,
) -> Result<(), SafetensorsError> {
    let path = path.as_ref();
    let at_path = |kind| SafetensorsError {
        path: Some(path.to_path_buf()),
        kind,
    };
    check_names(specs).map_err(at_path)?;
    let failure = RefCell::new(None);
    let mut views = Vec::with_capacity(specs.len());
    for (index, &spec) in specs.iter().enumerate() {
        let len = spec
            .data_len()
            .ok_or_else(|| at_path(spec.wrong_size(usize::MAX)))?;
        views.push(Streamed {
            spec,
            index,
            len,
            bytes,
            failure: &failure,
        });
    }
    write_atomic(path, |tmp| {
        let views = views.iter().map(|v| (v.spec.name, v));
        ::safetensors::tensor::serialize_to_file(views, &None, tmp).map_err(|e| match e {
            SafeTensorError::IoError(e) => SafetensorsErrorKind::Io(e),
            other => SafetensorsErrorKind::CorruptHeader(format!("{other:?}")),
        })?;
        match failure.borrow_mut().take() {
            Some(kind) => Err(kind),
            None => Ok(()),
        }
    })
    .map_err(at_path)
}

/// One tensor of [`write_safetensors_streamed`], as the `safetensors` crate's writer sees it:
/// its bytes are fetched when the writer asks for them. After a failure (kept in `failure`)
/// every tensor gives no bytes, and the write is then refused.
struct Streamed<'s, 'd> {
    spec: TensorSpec<'s>,
    index: usize,
    len: usize,
    bytes: &'s TensorBytes<'d>,
    failure: &'s RefCell<Option<SafetensorsErrorKind>>,
}

impl View for &Streamed<'_, '_> {
    fn dtype(&self) -> Dtype {
        self.spec.dtype.to_crate()
    }

    fn shape(&self) -> &[usize] {
        self.spec.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        if self.failure.borrow().is_some() {
            return Cow::Borrowed(&[]);
        }
        let failed = match (self.bytes)(self.index) {
            Ok(bytes) if bytes.len() == self.len => return bytes,
            Ok(bytes) => self.spec.wrong_size(bytes.len()),
            Err(why) => SafetensorsErrorKind::Source {
                tensor: self.spec.name.to_string(),
                why,
            },
        };
        *self.failure.borrow_mut() = Some(failed);
        Cow::Borrowed(&[])
    }

    fn data_len(&self) -> usize {
        self.len
    }
}

/// The checks of names the `safetensors` crate leaves to its callers: distinct, none reserved.
fn check_names(specs: &[TensorSpec<'_>]) -> Result<(), SafetensorsErrorKind> {
    let mut names: Vec<&str> = specs.iter().map(|t| t.name).collect();
    names.sort_unstable();
    if let Some(pair) = names.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(SafetensorsErrorKind::DuplicateName(pair[0].to_string()));
    }
    if names.contains(&"__metadata__") {
        return Err(SafetensorsErrorKind::ReservedName);
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
    /// The bytes of a tensor being written could not be had; says why.
    Source {
        /// The tensor.
        tensor: String,
        /// Why.
        why: String,
    },
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
            K::Source { tensor, why } => write!(f, "cannot write tensor '{tensor}': {why}"),
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
