//! Build artifacts: the compiled module (`NAME.mir`), and how files are written safely.

pub mod binary;
pub mod module;
pub mod runtime;
pub mod training;
pub mod validate;
pub mod write;

pub use binary::{decode, encode, read_mir, MirError};
pub use module::{Guard, Module, SourceLoc, Step, Storage, ValueInfo};
