//! The build-script API of mslc, in the manner of `prost-build`: one call in `build.rs` checks
//! and builds `.msl` models at `cargo build` time, writes their artifacts into `OUT_DIR`, tells
//! cargo which files to watch, and generates typed Rust bindings over `mslc_exec::runner`.
//!
//! ```no_run
//! // build.rs
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     mslc_build::Config::new().target("cpu").compile(&["models/net.msl"])?;
//!     Ok(())
//! }
//! ```
//!
//! and in the crate (which depends on `mslc-exec`):
//!
//! ```ignore
//! include!(concat!(env!("OUT_DIR"), "/mslc_models.rs"));
//! let out = net::Model::load()?.init_seed(0).run(net::Inputs { tokens: &ids })?;
//! println!("{:?}", out.logits.shape);
//! ```

mod bindings;
mod config;
mod write;

pub use config::{Built, BuiltModel, Config, Error, BINDINGS_FILE};
