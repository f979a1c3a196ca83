//! The cost model the search learns as it measures: ridge regression of log(time) on a
//! candidate's features, refitted after every measurement and used to rank proposals so that
//! only the most promising are measured.

/// A linear predictor of log(seconds).
#[derive(Clone, Debug, Default)]
pub struct CostModel {
    weights: Vec<f64>,
}

/// How strongly the weights are pulled towards 0 (keeps the fit stable with few samples).
const RIDGE: f64 = 1e-2;

impl CostModel {
    /// Fits the model to `(features, seconds)` samples; with none it predicts nothing.
    pub fn fit(samples: &[(Vec<f64>, f64)]) -> CostModel {
        let Some(n) = samples.first().map(|(f, _)| f.len()) else {
            return CostModel::default();
        };
        // Normal equations (XᵀX + λI) w = Xᵀy.
        let mut a = vec![vec![0.0; n + 1]; n];
        for (x, t) in samples {
            let y = t.max(1e-12).ln();
            for i in 0..n {
                for j in 0..n {
                    a[i][j] += x[i] * x[j];
                }
                a[i][n] += x[i] * y;
            }
        }
        for (i, row) in a.iter_mut().enumerate() {
            row[i] += RIDGE;
        }
        CostModel {
            weights: solve(a).unwrap_or_default(),
        }
    }

    /// Predicted log(seconds) of a candidate with `features`; 0 before any fit.
    pub fn predict(&self, features: &[f64]) -> f64 {
        self.weights.iter().zip(features).map(|(w, x)| w * x).sum()
    }
}

/// Solves the augmented system `a` (n rows of n + 1) by Gaussian elimination with partial
/// pivoting; `None` when it is singular.
fn solve(mut a: Vec<Vec<f64>>) -> Option<Vec<f64>> {
    let n = a.len();
    for col in 0..n {
        let pivot = (col..n).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, pivot);
        let pivot_row = a[col].clone();
        for row in a.iter_mut().skip(col + 1) {
            let f = row[col] / pivot_row[col];
            for (x, p) in row.iter_mut().zip(&pivot_row).skip(col) {
                *x -= f * p;
            }
        }
    }
    let mut w = vec![0.0; n];
    for row in (0..n).rev() {
        let s: f64 = (row + 1..n).map(|k| a[row][k] * w[k]).sum();
        w[row] = (a[row][n] - s) / a[row][row];
    }
    Some(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_learns_which_candidates_are_faster() {
        // time = exp(0.5 + 2·x1 - x2) for a few points: the fit ranks unseen points right.
        let samples: Vec<(Vec<f64>, f64)> = [(0.0f64, 0.0f64), (1.0, 0.0), (0.0, 1.0), (1.0, 1.0)]
            .iter()
            .map(|&(a, b)| (vec![1.0, a, b], (0.5 + 2.0 * a - b).exp()))
            .collect();
        let m = CostModel::fit(&samples);
        assert!(m.predict(&[1.0, 0.0, 2.0]) < m.predict(&[1.0, 2.0, 0.0]));
        assert!((m.predict(&[1.0, 1.0, 0.0]) - 2.5).abs() < 0.05);
        assert_eq!(CostModel::fit(&[]).predict(&[1.0]), 0.0);
    }
}
