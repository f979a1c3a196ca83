//! The fuzz targets' bodies, shared with `tests/it/fuzz_replay.rs` (which includes
//! [`harness`] by path), so every corpus entry and every crash found replays on stable.

pub mod harness;
pub mod splice;
