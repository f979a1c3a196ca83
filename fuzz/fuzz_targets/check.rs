//! libFuzzer target: the parser and checker (and the diagnostic renderers) on source text,
//! with a grammar-aware mutator that splices lines and tokens of the examples and the standard
//! library into the input, besides libFuzzer's own byte mutations.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mslc_fuzz::harness::check(data));

libfuzzer_sys::fuzz_mutator!(|data: &mut [u8], size: usize, max_size: usize, seed: u32| {
    if seed % 3 == 0 {
        return libfuzzer_sys::fuzzer_mutate(data, size, max_size);
    }
    let out = mslc_fuzz::splice::mutate(&data[..size], seed);
    let n = out.len().min(max_size);
    data[..n].copy_from_slice(&out[..n]);
    n
});
