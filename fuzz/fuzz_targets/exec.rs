//! libFuzzer target: see [`mslc_fuzz::harness::exec`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mslc_fuzz::harness::exec(data));
