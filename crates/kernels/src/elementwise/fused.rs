//! Fast evaluation of a fused elementwise [`Program`]: the output is cut into blocks; for each
//! block every instruction fills its register (a block-long buffer, hot in L1) with one
//! vectorised loop reading its operands where they are (registers, or inputs that need no
//! broadcast, in place), and the last writes the output block, so memory is touched once per
//! input and once for the output.

use serde::{Deserialize, Serialize};

use super::program::{Instr, Program};
use super::slice::{binary_into, cast_into, unary_into};
use crate::error::{KernelError, KernelResult};
use crate::par;
use crate::scratch::with_scratch;
use crate::shape::{broadcast_strides, check_len};
use crate::tensor::TensorRef;

/// Tunable parameters of [`fused_elementwise`]; results never depend on them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ElementwiseParams {
    /// Elements per register block (one parallel task each).
    pub block: usize,
    /// Outputs with fewer elements than this run on the calling thread.
    pub min_parallel_elems: usize,
}

impl Default for ElementwiseParams {
    fn default() -> Self {
        Self {
            block: 2048,
            min_parallel_elems: 1 << 15,
        }
    }
}

/// Output dims with every input's strides, after dropping size-1 dims and merging dims that
/// every input walks contiguously; never empty.
struct Layout {
    shape: Vec<usize>,
    strides: Vec<Vec<usize>>,
}

impl Layout {
    fn new(out_shape: &[usize], input_shapes: &[&[usize]]) -> Self {
        let full: Vec<Vec<usize>> = input_shapes
            .iter()
            .map(|s| broadcast_strides(s, out_shape))
            .collect();
        let mut shape: Vec<usize> = Vec::new();
        let mut strides: Vec<Vec<usize>> = vec![Vec::new(); input_shapes.len()];
        for (d, &len) in out_shape.iter().enumerate() {
            if len == 1 {
                continue;
            }
            let merge = !shape.is_empty()
                && full
                    .iter()
                    .zip(&strides)
                    .all(|(f, s)| s.last() == Some(&(f[d] * len)));
            if merge {
                *shape.last_mut().expect("non-empty") *= len;
                for (f, s) in full.iter().zip(strides.iter_mut()) {
                    *s.last_mut().expect("non-empty") = f[d];
                }
            } else {
                shape.push(len);
                for (f, s) in full.iter().zip(strides.iter_mut()) {
                    s.push(f[d]);
                }
            }
        }
        if shape.is_empty() {
            shape.push(1);
            strides.iter_mut().for_each(|s| s.push(0));
        }
        Self { shape, strides }
    }

    /// Writes elements `start..start + dst.len()` of input `i` (broadcast) into `dst`, run by
    /// run along the last dim. From one run to the next the offset steps along the dim before
    /// the last, and is worked out anew only when that dim wraps: a short last dim (a
    /// `[C, 1, 1]` scale over 2×2 images) makes a run of every few elements.
    fn gather(&self, i: usize, data: &[f32], start: usize, dst: &mut [f32]) {
        let strides = &self.strides[i];
        let last = self.shape.len() - 1;
        let (columns, step) = (self.shape[last], strides[last]);
        // The dim before the last, and its stride (a one-row stand-in for a 1-D layout).
        let (rows, row_step) = match last {
            0 => (1, 0),
            _ => (self.shape[last - 1], strides[last - 1]),
        };
        let mut column = start % columns;
        let mut row = start / columns % rows;
        let mut offset = self.offset(i, start);
        let mut done = 0;
        while done < dst.len() {
            let run = (columns - column).min(dst.len() - done);
            let out = &mut dst[done..done + run];
            match step {
                0 => out.fill(data[offset]),
                1 => out.copy_from_slice(&data[offset..offset + run]),
                s => out
                    .iter_mut()
                    .enumerate()
                    .for_each(|(j, o)| *o = data[offset + j * s]),
            }
            done += run;
            row += 1;
            offset = if row < rows {
                offset - column * step + row_step
            } else {
                row = 0;
                self.offset(i, start + done)
            };
            column = 0;
        }
    }

    /// Where output element `pos` reads input `i`.
    fn offset(&self, i: usize, pos: usize) -> usize {
        let mut rest = pos;
        let mut offset = 0;
        for (&len, &stride) in self.shape.iter().zip(&self.strides[i]).rev() {
            offset += (rest % len) * stride;
            rest /= len;
        }
        offset
    }
}

/// Evaluates `program` over `inputs` (broadcast together) into `out`, which must hold the
/// broadcast shape's element count.
pub fn fused_elementwise(
    program: &Program,
    inputs: &[TensorRef<'_>],
    params: &ElementwiseParams,
    out: &mut [f32],
) -> KernelResult<()> {
    const OP: &str = "fused_elementwise";
    program.validate(inputs.len())?;
    if params.block == 0 {
        return Err(KernelError::new(OP, "block must be at least 1"));
    }
    for x in inputs {
        check_len(OP, "input", x.data.len(), x.shape)?;
    }
    let shapes: Vec<&[usize]> = inputs.iter().map(|x| x.shape).collect();
    let out_shape = program.output_shape(&shapes)?;
    check_len(OP, "out", out.len(), &out_shape)?;
    let layout = Layout::new(&out_shape, &shapes);
    let block = params.block;
    let regs = program.instrs.len();
    let last = regs - 1;
    // Inputs with the output's element count are not broadcast: instructions read them in
    // place instead of through a register.
    let direct: Vec<Option<usize>> = program
        .instrs
        .iter()
        .enumerate()
        .map(|(i, instr)| match *instr {
            Instr::Input(n) if i != last && inputs[n].data.len() == out.len() => Some(n),
            _ => None,
        })
        .collect();
    let parallel = out.len() >= params.min_parallel_elems;
    par::for_each_chunk_mut(parallel, out, block, |ci, chunk| {
        let (start, len) = (ci * block, chunk.len());
        with_scratch(regs * block, |reg| {
            for (i, instr) in program.instrs.iter().enumerate() {
                if direct[i].is_some() {
                    continue;
                }
                let (done, rest) = reg.split_at_mut(i * block);
                // The last instruction writes the output itself.
                let cur: &mut [f32] = if i == last {
                    &mut *chunk
                } else {
                    &mut rest[..len]
                };
                let get = |r: usize| match direct[r] {
                    Some(n) => &inputs[n].data[start..start + len],
                    None => &done[r * block..r * block + len],
                };
                match *instr {
                    Instr::Input(n) => layout.gather(n, inputs[n].data, start, cur),
                    Instr::Const(c) => cur.fill(c),
                    Instr::Unary { op, x } => unary_into(op, get(x), cur),
                    Instr::Cast { to, x } => cast_into(to, get(x), cur),
                    Instr::Binary { op, a, b } => binary_into(op, get(a), get(b), cur),
                }
            }
        });
    });
    Ok(())
}
