//! Tensor files: NumPy `.npy` arrays and `.safetensors` weight files, read without surprises
//! (every malformed input is a typed error) and written atomically; and where mslc caches what
//! it learns about the machine.

pub mod atomic;
pub mod cache;
mod floats;
pub mod npy;
pub mod safetensors;

#[cfg(test)]
mod test_dir;
