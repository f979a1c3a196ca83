//! Integration tests of the executor and `mslc run`.

pub mod common;
mod errors;
mod guard;
mod kernel_table;
mod models;
mod numerics;
mod ops;
mod reference;
mod tune;
