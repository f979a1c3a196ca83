//! Integration tests of the executor and `mslc run`.

pub mod common;
mod errors;
mod kernel_table;
mod models;
mod ops;
mod reference;
