//! The intrinsics' reference semantics: the gated delta rule over a span
//! of tokens and for one token, in f64 with the state rounded to f32 after
//! every token, as the f32 state it models.

use super::tensor::Tensor;
use crate::ir::Intrinsic;
use crate::sema::ty::Dtype;

fn floats(tensor: &Tensor) -> &[f32] {
    tensor.as_f32().expect("the intrinsics take float tensors")
}

pub fn run(intrinsic: Intrinsic, args: &[&Tensor], shape: Vec<usize>) -> Tensor {
    // The one-token form is the span form with S = 1 and no S axis.
    let (batch, tokens) = match intrinsic {
        Intrinsic::GatedDeltaRule => (args[0].shape[0], args[0].shape[1]),
        Intrinsic::GatedDeltaStep => (args[0].shape[0], 1),
    };
    let key_heads = args[0].shape[args[0].shape.len() - 2];
    let key_dim = args[0].shape[args[0].shape.len() - 1];
    let value_heads = args[2].shape[args[2].shape.len() - 2];
    let value_dim = args[2].shape[args[2].shape.len() - 1];
    let (q, k, v) = (floats(args[0]), floats(args[1]), floats(args[2]));
    let (decay, beta, state) = (floats(args[3]), floats(args[4]), floats(args[5]));
    let scale = floats(args[6])[0] as f64;
    let group = value_heads / key_heads;
    let mut out = vec![0f32; shape.iter().product()];
    let rows = tokens + key_dim;
    for b in 0..batch {
        for h in 0..value_heads {
            let kh = h / group;
            let mut memory: Vec<f64> = (0..key_dim * value_dim)
                .map(|at| state[((b * value_heads + h) * key_dim) * value_dim + at] as f64)
                .collect();
            for t in 0..tokens {
                let key_at = ((b * tokens + t) * key_heads + kh) * key_dim;
                let value_at = ((b * tokens + t) * value_heads + h) * value_dim;
                let gate_at = (b * tokens + t) * value_heads + h;
                let forget = (decay[gate_at] as f64).exp();
                memory.iter_mut().for_each(|m| *m = (*m * forget) as f32 as f64);
                let rate = beta[gate_at] as f64;
                let mut update = vec![0f64; value_dim];
                for (j, slot) in update.iter_mut().enumerate() {
                    let recalled: f64 = (0..key_dim).map(|i| memory[i * value_dim + j] * k[key_at + i] as f64).sum();
                    *slot = (v[value_at + j] as f64 - recalled) * rate;
                }
                for i in 0..key_dim {
                    let key = k[key_at + i] as f64;
                    for j in 0..value_dim {
                        let cell = &mut memory[i * value_dim + j];
                        *cell = (*cell + key * update[j]) as f32 as f64;
                    }
                }
                for j in 0..value_dim {
                    let read: f64 = (0..key_dim).map(|i| memory[i * value_dim + j] * q[key_at + i] as f64 * scale).sum();
                    out[((b * rows + t) * value_heads + h) * value_dim + j] = read as f32;
                }
            }
            for i in 0..key_dim {
                for j in 0..value_dim {
                    out[((b * rows + tokens + i) * value_heads + h) * value_dim + j] = memory[i * value_dim + j] as f32;
                }
            }
        }
    }
    Tensor::from_f32(Dtype::F32, shape, out)
}
