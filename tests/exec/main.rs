//! Integration tests of the executor and `mslc run`.

mod common;
mod ops;
mod models;
mod errors;
