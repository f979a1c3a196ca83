//! Deterministic parameter initialisation for `--init-seed N`: each parameter draws from its
//! own stream, keyed by the seed and its path, so values do not depend on the order of
//! parameters, the thread count or the rest of the model.

use rayon::prelude::*;
use sha2::{Digest, Sha256};

use mslc_core::program::Init;

use crate::storage::in_a_pool_of_several_threads;

/// SplitMix64's increment: the state after `n` draws is the key plus `n` times it.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64: small, fast, and good enough to fill weights. Its state advances by a constant,
/// so the stream can start at any draw: a shard draws its own values and nothing else.
struct SplitMix64(u64);

impl SplitMix64 {
    /// The stream keyed by `key`, positioned before its draw number `draw`.
    fn at(key: u64, draw: usize) -> Self {
        SplitMix64(key.wrapping_add((draw as u64).wrapping_mul(GAMMA)))
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform on `[0, 1)` with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Fills `out` with the values `init` gives the parameter at `path` under `seed`.
pub fn fill(init: &Init, seed: u64, path: &str, out: &mut [f32]) {
    fill_at(init, seed, path, 0, out)
}

/// Elements one task of a parallel fill draws: even, so that a task's first element starts a
/// Box–Muller pair when the block does, and large enough that a task outweighs its dispatch.
const INIT_TASK: usize = 1 << 15;

/// Fills `out` with elements `offset..offset + out.len()` of the values [`fill`] gives the
/// whole parameter at `path` (row-major), the same bits, without drawing the others: what a
/// rank holding a block of the parameter draws. Called in a pool of several threads (an
/// executor's), it draws blocks of the parameter in parallel: every element's stream position
/// is known, so the bits do not depend on the split.
pub fn fill_at(init: &Init, seed: u64, path: &str, offset: usize, out: &mut [f32]) {
    let digest = Sha256::new()
        .chain_update(seed.to_le_bytes())
        .chain_update(path.as_bytes())
        .finalize();
    let mut key = [0u8; 8];
    key.copy_from_slice(&digest[..8]);
    let key = u64::from_le_bytes(key);
    if out.len() < 2 * INIT_TASK || !in_a_pool_of_several_threads() || is_constant(init) {
        return draw(init, key, offset, out);
    }
    out.par_chunks_mut(INIT_TASK)
        .enumerate()
        .for_each(|(task, block)| draw(init, key, offset + task * INIT_TASK, block));
}

/// Whether `init` draws nothing (a fill with one value is memory-bound, not worth a split).
fn is_constant(init: &Init) -> bool {
    matches!(init, Init::Zeros | Init::Ones | Init::Constant { .. })
}

/// [`fill_at`] on the calling thread, from the parameter's stream `key`.
fn draw(init: &Init, key: u64, offset: usize, out: &mut [f32]) {
    match *init {
        Init::Zeros => out.fill(0.0),
        Init::Ones => out.fill(1.0),
        Init::Constant { value } => out.fill(value as f32),
        Init::Uniform { low, high } => {
            let mut rng = SplitMix64::at(key, offset);
            for x in out.iter_mut() {
                *x = (low + (high - low) * rng.next_f64()) as f32;
            }
        }
        Init::Normal { mean, std } => {
            // Box–Muller, two values per pair of uniforms: elements 2j and 2j + 1 are the
            // cosine and sine of pair j, drawn from draws 2j and 2j + 1.
            let first = offset / 2;
            let mut rng = SplitMix64::at(key, 2 * first);
            for pair in first..(offset + out.len()).div_ceil(2) {
                let u1 = 1.0 - rng.next_f64(); // (0, 1], so ln is finite
                let u2 = rng.next_f64();
                let r = (-2.0 * u1.ln()).sqrt();
                let t = std::f64::consts::TAU * u2;
                for (element, value) in [(2 * pair, t.cos()), (2 * pair + 1, t.sin())] {
                    if let Some(x) = element.checked_sub(offset).and_then(|i| out.get_mut(i)) {
                        *x = (mean + std * r * value) as f32;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_per_path_and_seed() {
        let init = Init::Normal {
            mean: 0.0,
            std: 0.02,
        };
        let mut a = vec![0.0; 1001];
        let mut b = vec![0.0; 1001];
        fill(&init, 1, "w", &mut a);
        fill(&init, 1, "w", &mut b);
        assert_eq!(a, b);
        fill(&init, 2, "w", &mut b);
        assert_ne!(a, b);
        fill(&init, 1, "v", &mut b);
        assert_ne!(a, b);
        let mean = a.iter().map(|&x| f64::from(x)).sum::<f64>() / a.len() as f64;
        let var = a
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / a.len() as f64;
        // 1001 samples: the mean is within ~5 standard errors, the std within 15 %.
        assert!(mean.abs() < 5.0 * 0.02 / 1001f64.sqrt(), "{mean}");
        assert!((var.sqrt() - 0.02).abs() < 0.003, "{}", var.sqrt());
    }

    #[test]
    fn uniform_and_constants() {
        let mut a = vec![0.0; 500];
        fill(
            &Init::Uniform {
                low: -1.0,
                high: 3.0,
            },
            7,
            "u",
            &mut a,
        );
        assert!(a.iter().all(|&x| (-1.0..3.0).contains(&x)));
        fill(&Init::Constant { value: 2.5 }, 7, "c", &mut a);
        assert!(a.iter().all(|&x| x == 2.5));
        fill(&Init::Ones, 7, "o", &mut a);
        assert!(a.iter().all(|&x| x == 1.0));
        fill(&Init::Zeros, 7, "z", &mut a);
        assert!(a.iter().all(|&x| x == 0.0));
    }

    /// The initialisers that draw from the stream (the others fill one value).
    fn drawn() -> [Init; 2] {
        [
            Init::Normal {
                mean: 0.5,
                std: 0.02,
            },
            Init::Uniform {
                low: -1.0,
                high: 3.0,
            },
        ]
    }

    /// Drawn in a pool of threads, in blocks of [`INIT_TASK`], a parameter and any block of
    /// it (at an odd offset too, where each task's first pair straddles its start) get the
    /// bits one thread draws.
    #[test]
    fn a_pool_draws_the_bits_one_thread_draws() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let len = 5 * INIT_TASK + 3;
        for init in drawn() {
            let mut serial = vec![0.0; len];
            fill(&init, 3, "w", &mut serial);
            for offset in [0, 1, INIT_TASK - 1] {
                let mut parallel = vec![f32::NAN; len - offset];
                pool.install(|| fill_at(&init, 3, "w", offset, &mut parallel));
                assert!(
                    parallel
                        .iter()
                        .zip(&serial[offset..])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{init:?} at {offset}"
                );
            }
        }
    }

    /// Any block of a parameter, at an even or odd offset, gets the same bits as the block of
    /// the whole parameter drawn at once.
    #[test]
    fn a_block_draws_what_the_whole_draws_there() {
        for init in drawn() {
            let mut whole = vec![0.0; 101];
            fill(&init, 3, "w", &mut whole);
            for (offset, len) in [
                (0, 101),
                (0, 1),
                (1, 1),
                (1, 50),
                (7, 10),
                (50, 51),
                (100, 1),
            ] {
                let mut block = vec![f32::NAN; len];
                fill_at(&init, 3, "w", offset, &mut block);
                assert_eq!(block, &whole[offset..offset + len], "{init:?} at {offset}");
            }
        }
    }
}
