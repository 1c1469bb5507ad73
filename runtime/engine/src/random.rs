//! Random parameters, for running and measuring a model without a
//! checkpoint (`--random-weights SEED`) and for writing one
//! (`linnet init-weights`): uniform values scaled by each matrix's fan-in,
//! so that activations stay near unit size; vectors (norm scales, biases)
//! near zero.

use crate::sampling::Rng;
use crate::Error;
use linnet_exec::tensor::{Data, Tensor};
use linnet_ir::numerics::bf16_bits;
use linnet_ir::Dtype;
use linnet_ir::{Model, Param};
use rayon::prelude::*;

/// A parameter's values, drawn from its own stream of the seed, in order.
pub struct Draw {
    rng: Rng,
    scale: f64,
    left: usize,
}

impl Draw {
    pub fn new(param: &Param, seed: u64, index: usize) -> Draw {
        let rng = Rng::new(seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let scale = match param.shape.as_slice() {
            [] | [_] => 0.1,
            [.., fan_in] => (3.0 / (*fan_in).max(1) as f64).sqrt(),
        };
        Draw { rng, scale, left: param.shape.iter().product() }
    }

    /// The next values, at most `most` of them; empty when all are drawn.
    pub fn next_chunk(&mut self, most: usize, out: &mut Vec<f32>) {
        out.clear();
        let count = most.min(self.left);
        out.extend((0..count).map(|_| ((self.rng.next_f64() * 2.0 - 1.0) * self.scale) as f32));
        self.left -= count;
    }
}

/// One parameter's draw: bf16 ones as their bits.
enum Drawn {
    Floats(Vec<f32>),
    Bits(Vec<u16>),
}

fn refused(param: &Param) -> Error {
    let count: usize = param.shape.iter().product();
    Error::Weights(format!("cannot hold `{}` ({count} values of {}) in memory", param.path, param.dtype.name()))
}

/// One parameter's values in memory, or why they cannot be held.
fn draw(param: &Param, seed: u64, index: usize) -> Result<Drawn, Error> {
    if param.dtype != Dtype::Bf16 {
        return values(param, seed, index).map(Drawn::Floats);
    }
    let mut draw = Draw::new(param, seed, index);
    let (mut bits, mut chunk) = (Vec::new(), Vec::new());
    bits.try_reserve_exact(draw.left).map_err(|_| refused(param))?;
    while draw.left > 0 {
        draw.next_chunk(1 << 20, &mut chunk);
        bits.extend(chunk.iter().map(|v| bf16_bits(*v)));
    }
    Ok(Drawn::Bits(bits))
}

/// Parameter number `index`'s values as drawn (not rounded to its dtype),
/// or why they cannot be held in memory.
pub fn values(param: &Param, seed: u64, index: usize) -> Result<Vec<f32>, Error> {
    let mut draw = Draw::new(param, seed, index);
    let (mut values, mut chunk) = (Vec::new(), Vec::new());
    values.try_reserve_exact(draw.left).map_err(|_| refused(param))?;
    while draw.left > 0 {
        draw.next_chunk(1 << 20, &mut chunk);
        values.extend_from_slice(&chunk);
    }
    Ok(values)
}

/// Every parameter of `model`, drawn in parallel, bf16 ones held as their
/// bits (as a checkpoint's are: a full-size model's draw fits in memory);
/// a parameter too large to hold is an error that names it. Each is drawn
/// as a checkpoint stores it (the values `init-weights` writes), then laid
/// out as the model keeps it.
pub fn params(model: &Model, seed: u64) -> Result<Vec<Tensor>, Error> {
    let stored = model.as_stored();
    let drawn: Vec<Drawn> = stored
        .params
        .par_iter()
        .enumerate()
        .map(|(index, param)| draw(param, seed, index))
        .collect::<Result<_, _>>()?;
    Ok(stored
        .params
        .iter()
        .zip(&model.params)
        .zip(drawn)
        .map(|((param, kept), drawn)| {
            let tensor = match drawn {
                Drawn::Floats(values) => Tensor::from_f32(param.dtype, param.shape.clone(), values),
                Drawn::Bits(bits) => {
                    Tensor { dtype: param.dtype, shape: param.shape.clone(), data: Data::Bf16(bits.into()) }
                }
            };
            tensor.laid_out(kept)
        })
        .collect())
}
