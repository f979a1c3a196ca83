//! Integration tests of the executor and `mslc run`.

mod common;
mod errors;
mod models;
mod ops;
