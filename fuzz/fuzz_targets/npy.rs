//! libFuzzer target: see [`mslc_fuzz::harness::npy`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mslc_fuzz::harness::npy(data));
