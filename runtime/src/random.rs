//! Random parameters, for running and measuring a model without a
//! checkpoint (`--random-weights SEED`) and for writing one
//! (`linnet init-weights`): uniform values scaled by each matrix's fan-in,
//! so that activations stay near unit size; vectors (norm scales, biases)
//! near zero.

use crate::sampling::Rng;
use linnet_compiler::tensor::Tensor;
use linnet_compiler::ir::{Model, Param};

/// One parameter's values, from its own stream of the seed.
pub fn values(param: &Param, seed: u64, index: usize) -> Vec<f32> {
    let mut rng = Rng::new(seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let count: usize = param.shape.iter().product();
    let scale = match param.shape.as_slice() {
        [] | [_] => 0.1,
        [.., fan_in] => (3.0 / (*fan_in).max(1) as f64).sqrt(),
    };
    (0..count).map(|_| ((rng.next_f64() * 2.0 - 1.0) * scale) as f32).collect()
}

pub fn params(model: &Model, seed: u64) -> Vec<Tensor> {
    model
        .params
        .iter()
        .enumerate()
        .map(|(index, param)| Tensor::from_f32(param.dtype, param.shape.clone(), values(param, seed, index)))
        .collect()
}
