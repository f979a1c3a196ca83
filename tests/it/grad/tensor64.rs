//! A float64 tensor (shape + row-major data) and the index arithmetic the f64 evaluator needs.

/// A dense row-major f64 tensor; integer tensors (labels, ids) hold whole numbers.
#[derive(Clone, Debug, PartialEq)]
pub struct T64 {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl T64 {
    /// A tensor of `shape` holding `data` (lengths must agree).
    pub fn new(shape: &[usize], data: Vec<f64>) -> T64 {
        assert_eq!(shape.iter().product::<usize>(), data.len(), "{shape:?}");
        T64 {
            shape: shape.to_vec(),
            data,
        }
    }

    /// A rank-0 tensor.
    pub fn scalar(v: f64) -> T64 {
        T64::new(&[], vec![v])
    }

    /// Number of dims.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Row-major strides of `shape`.
    pub fn strides(shape: &[usize]) -> Vec<usize> {
        let mut s = vec![1; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            s[i] = s[i + 1] * shape[i + 1];
        }
        s
    }

    /// The multi-index of flat position `flat` in `shape`.
    pub fn unravel(flat: usize, shape: &[usize]) -> Vec<usize> {
        let mut idx = vec![0; shape.len()];
        let mut r = flat;
        for i in (0..shape.len()).rev() {
            if shape[i] > 0 {
                idx[i] = r % shape[i];
                r /= shape[i];
            }
        }
        idx
    }

    /// The element at `idx` of this tensor broadcast (NumPy rules) to a shape of `idx.len()`
    /// dims.
    pub fn at_broadcast(&self, idx: &[usize]) -> f64 {
        let lead = idx.len() - self.rank();
        let strides = T64::strides(&self.shape);
        let flat: usize = (0..self.rank())
            .map(|i| {
                let j = if self.shape[i] == 1 { 0 } else { idx[i + lead] };
                j * strides[i]
            })
            .sum();
        self.data[flat]
    }

    /// This tensor broadcast to `shape`.
    pub fn broadcast_to(&self, shape: &[usize]) -> T64 {
        let n = shape.iter().product();
        let data = (0..n)
            .map(|f| self.at_broadcast(&T64::unravel(f, shape)))
            .collect();
        T64::new(shape, data)
    }

    /// `f` of the elements along `axes` for each position of the other dims, the reduced dims
    /// kept as 1.
    pub fn reduce_keep(&self, axes: &[usize], f: impl Fn(&[f64]) -> f64) -> T64 {
        let kept: Vec<usize> = (0..self.rank())
            .map(|i| if axes.contains(&i) { 1 } else { self.shape[i] })
            .collect();
        let mut groups: Vec<Vec<f64>> = vec![Vec::new(); kept.iter().product()];
        let ks = T64::strides(&kept);
        for (f_, &v) in self.data.iter().enumerate() {
            let idx = T64::unravel(f_, &self.shape);
            let g: usize = (0..self.rank())
                .map(|i| if axes.contains(&i) { 0 } else { idx[i] * ks[i] })
                .sum();
            groups[g].push(v);
        }
        T64::new(&kept, groups.iter().map(|g| f(g)).collect())
    }
}
