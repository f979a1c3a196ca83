//! Checks and builds `models/net.msl` (and what it imports) into `OUT_DIR` with typed bindings.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    mslc_build::Config::new()
        .target("cpu")
        .compile(&["models/net.msl"])?;
    Ok(())
}
