//! Random parameters, for running and measuring a model without a
//! checkpoint (`--random-weights SEED`) and for writing one
//! (`linnet init-weights`): uniform values scaled by each matrix's fan-in,
//! so that activations stay near unit size; vectors (norm scales, biases)
//! near zero.

use crate::sampling::Rng;
use linnet_exec::tensor::{Data, Tensor};
use linnet_ir::numerics::bf16_bits;
use linnet_ir::Dtype;
use linnet_ir::{Model, Param};
use rayon::prelude::*;

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

/// One parameter's draw: bf16 ones as their bits.
enum Drawn {
    Floats(Vec<f32>),
    Bits(Vec<u16>),
}

/// Every parameter of `model`, drawn in parallel, bf16 ones held as their
/// bits (as a checkpoint's are: a full-size model's draw fits in memory).
pub fn params(model: &Model, seed: u64) -> Vec<Tensor> {
    let drawn: Vec<Drawn> = model
        .params
        .par_iter()
        .enumerate()
        .map(|(index, param)| {
            let values = values(param, seed, index);
            if param.dtype == Dtype::Bf16 {
                Drawn::Bits(values.iter().map(|v| bf16_bits(*v)).collect())
            } else {
                Drawn::Floats(values)
            }
        })
        .collect();
    model
        .params
        .iter()
        .zip(drawn)
        .map(|(param, drawn)| match drawn {
            Drawn::Floats(values) => Tensor::from_f32(param.dtype, param.shape.clone(), values),
            Drawn::Bits(bits) => {
                Tensor { dtype: param.dtype, shape: param.shape.clone(), data: Data::Bf16(bits.into()) }
            }
        })
        .collect()
}
