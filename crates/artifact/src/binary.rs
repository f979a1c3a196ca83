//! The `.mir` container: magic, format version, the module, optionally the weights (a
//! safetensors blob), and a SHA-256 over everything before it. `docs/mir-format.md` is the
//! specification. Reading checks every field before trusting it: a truncated, corrupted or
//! foreign file is a clear error, never a panic or a huge allocation.

use std::fmt;
use std::path::Path;

use bincode::Options;
use sha2::{Digest, Sha256};

use super::module::Module;

/// First eight bytes of every `.mir` file.
pub const MAGIC: &[u8; 8] = b"MSLCMIR\0";
/// The format version this build writes and reads.
pub const VERSION: u32 = 7;
const HEADER_BYTES: usize = 24;
const CHECKSUM_BYTES: usize = 32;
const FLAG_WEIGHTS: u32 = 1;

/// Why a `.mir` file could not be read.
#[derive(Debug, Clone, PartialEq)]
pub enum MirError {
    /// Shorter than the fixed header and checksum.
    Truncated { len: usize },
    /// Not a `.mir` file.
    BadMagic,
    /// Written by another format version.
    Version { found: u32 },
    /// The checksum does not match the contents.
    Checksum,
    /// A length field points past the end.
    BadLength,
    /// The module could not be decoded or is inconsistent.
    Malformed(String),
}

impl fmt::Display for MirError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MirError::Truncated { len } => write!(f, "file is truncated ({len} bytes, a .mir file has at least {})", HEADER_BYTES + CHECKSUM_BYTES),
            MirError::BadMagic => write!(f, "not a .mir file (wrong magic bytes)"),
            MirError::Version { found } => write!(f, "format version {found}, but this mslc reads version {VERSION}; rebuild it with `mslc build`"),
            MirError::Checksum => write!(f, "checksum mismatch: the file is corrupted or was truncated"),
            MirError::BadLength => write!(f, "a section length points past the end of the file"),
            MirError::Malformed(m) => write!(f, "malformed module: {m}"),
        }
    }
}

impl std::error::Error for MirError {}

/// Serialises a module (and optionally a safetensors weights blob) to bytes.
pub fn encode(module: &Module, weights: Option<&[u8]>) -> Vec<u8> {
    let payload = codec().serialize(module).unwrap_or_default();
    let mut out =
        Vec::with_capacity(HEADER_BYTES + payload.len() + weights.map_or(0, <[u8]>::len) + 128);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(if weights.is_some() { FLAG_WEIGHTS } else { 0 }).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&payload);
    if let Some(w) = weights {
        while out.len() % 64 != 56 {
            out.push(0);
        }
        out.extend_from_slice(&(w.len() as u64).to_le_bytes());
        out.extend_from_slice(w);
    }
    let digest = Sha256::digest(&out);
    out.extend_from_slice(&digest);
    out
}

/// A decoded `.mir` file: the module and, if embedded, the weights blob.
#[derive(Debug)]
pub struct Decoded<'a> {
    /// The module.
    pub module: Module,
    /// The embedded safetensors bytes.
    pub weights: Option<&'a [u8]>,
}

/// Parses and validates a `.mir` file.
pub fn decode(bytes: &[u8]) -> Result<Decoded<'_>, MirError> {
    if bytes.len() < HEADER_BYTES + CHECKSUM_BYTES {
        return Err(if bytes.len() >= 8 && &bytes[..8] != MAGIC {
            MirError::BadMagic
        } else {
            MirError::Truncated { len: bytes.len() }
        });
    }
    if &bytes[..8] != MAGIC {
        return Err(MirError::BadMagic);
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().unwrap_or_default());
    if version != VERSION {
        return Err(MirError::Version { found: version });
    }
    let (body, checksum) = bytes.split_at(bytes.len() - CHECKSUM_BYTES);
    if Sha256::digest(body).as_slice() != checksum {
        return Err(MirError::Checksum);
    }
    let flags = u32::from_le_bytes(body[12..16].try_into().unwrap_or_default());
    let payload_len = usize::try_from(u64::from_le_bytes(
        body[16..24].try_into().unwrap_or_default(),
    ))
    .map_err(|_| MirError::BadLength)?;
    let payload_end = HEADER_BYTES
        .checked_add(payload_len)
        .filter(|&e| e <= body.len())
        .ok_or(MirError::BadLength)?;
    let module: Module = codec()
        .with_limit(payload_len as u64)
        .deserialize(&body[HEADER_BYTES..payload_end])
        .map_err(|e| MirError::Malformed(e.to_string()))?;
    super::validate::validate(&module).map_err(MirError::Malformed)?;
    let weights = if flags & FLAG_WEIGHTS != 0 {
        let mut at = payload_end;
        while at % 64 != 56 {
            at += 1;
        }
        let len_end = at
            .checked_add(8)
            .filter(|&e| e <= body.len())
            .ok_or(MirError::BadLength)?;
        let len = usize::try_from(u64::from_le_bytes(
            body[at..len_end].try_into().unwrap_or_default(),
        ))
        .map_err(|_| MirError::BadLength)?;
        let end = len_end
            .checked_add(len)
            .filter(|&e| e <= body.len())
            .ok_or(MirError::BadLength)?;
        Some(&body[len_end..end])
    } else {
        None
    };
    Ok(Decoded { module, weights })
}

/// Reads a `.mir` file's bytes. Only a regular file is read: a device such as `/dev/zero`
/// would be read until memory runs out, and a FIFO could block forever.
pub fn read_mir(path: &Path) -> Result<Vec<u8>, String> {
    let cannot = |e: std::io::Error| format!("cannot read `{}`: {e}", path.display());
    let meta = std::fs::metadata(path).map_err(cannot)?;
    if !meta.is_file() {
        let what = if meta.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        return Err(format!(
            "cannot read `{}`: it is {what}; give the path of a .mir file",
            path.display()
        ));
    }
    std::fs::read(path).map_err(cannot)
}

fn codec() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian()
}
