//! Integration tests of the executor and `mslc run`.

mod common;
mod models;
mod ops;
