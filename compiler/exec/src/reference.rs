//! The intrinsics on host tensors, as the interpreter defines them (the
//! CPU backend has its own attention and delta rule, and runs these cache
//! writes). The gated delta rule's reference semantics over a span
//! of tokens and for one token, in f64 with the state rounded to f32 after
//! every token, as the f32 state it models. Attention and cache writes are
//! kernels for standard library functions and compute exactly what their
//! Linnet bodies do, rounding for rounding: attention skips the keys its
//! mask excludes (their weights are exactly zero), and a cache write
//! changes the cache it is given.

use crate::tensor::{Data, Tensor};
use crate::NodeError;
use linnet_ir::numerics::{math, round};
use linnet_ir::Dtype;
use linnet_ir::Intrinsic;

fn floats(tensor: &Tensor) -> &[f32] {
    tensor.as_f32().expect("the intrinsics take float tensors")
}

fn ints(tensor: &Tensor) -> &[i64] {
    tensor.as_i64().expect("an integer tensor")
}

fn f32r(value: f64) -> f64 {
    value as f32 as f64
}

/// The operands of `grouped_attention`, `grouped_attention_rows` and
/// `grouped_attention_sinks`, unpacked from their arguments (`q`, `k`,
/// `v`, `scale`, `mask`, and the sinks where given): what every backend's
/// attention reads.
pub struct Attention<'t> {
    pub q: &'t [f32],
    pub k: &'t [f32],
    pub v: &'t [f32],
    pub scale: f32,
    pub mask: &'t [bool],
    /// Whether the mask has a row per batch row and query (`[B, Q, K]`)
    /// rather than one per query for every batch row (`[Q, K]`).
    pub rows_mask: bool,
    /// A logit per query head that each of its softmaxes counts and that
    /// weighs no value (`grouped_attention_sinks`).
    pub sinks: Option<&'t [f32]>,
    /// The query's type, which the output is rounded to.
    pub dtype: Dtype,
    pub batch: usize,
    pub heads: usize,
    pub queries: usize,
    pub width: usize,
    pub kv_heads: usize,
    pub keys: usize,
}

impl<'t> Attention<'t> {
    pub fn of(args: &[&'t Tensor]) -> Attention<'t> {
        let [batch, heads, queries, width] = args[0].shape[..] else { panic!("q is [B, Heads, Q, D]") };
        let [_, kv_heads, keys, _] = args[1].shape[..] else { panic!("k is [B, KvHeads, K, D]") };
        let Data::Bool(mask) = &args[4].data else { panic!("the mask is bool") };
        Attention {
            q: floats(args[0]),
            k: floats(args[1]),
            v: floats(args[2]),
            scale: floats(args[3])[0],
            mask,
            rows_mask: args[4].shape.len() == 3,
            sinks: args.get(5).map(|sinks| floats(sinks)),
            dtype: args[0].dtype,
            batch,
            heads,
            queries,
            width,
            kv_heads,
            keys,
        }
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// The mask row of query `i` of batch row `b`.
    pub fn mask_row(&self, b: usize, i: usize) -> usize {
        if self.rows_mask {
            b * self.queries + i
        } else {
            i
        }
    }
}

/// The operands of `gated_delta_rule` (over a span of tokens) and
/// `gated_delta_step` (one token, no S axis: the span form with S = 1),
/// unpacked from their arguments (`q`, `k`, `v`, `decay`, `beta`, `state`,
/// `scale`): what every backend's delta rule reads. The output has `rows()`
/// rows per batch row: the tokens' outputs, then the final state.
pub struct DeltaRule<'t> {
    pub q: &'t [f32],
    pub k: &'t [f32],
    pub v: &'t [f32],
    pub decay: &'t [f32],
    pub beta: &'t [f32],
    pub state: &'t [f32],
    pub scale: f32,
    pub batch: usize,
    pub tokens: usize,
    pub key_heads: usize,
    pub key_dim: usize,
    pub value_heads: usize,
    pub value_dim: usize,
}

impl<'t> DeltaRule<'t> {
    pub fn of(intrinsic: Intrinsic, args: &[&'t Tensor]) -> DeltaRule<'t> {
        let tokens = if intrinsic == Intrinsic::GatedDeltaRule { args[0].shape[1] } else { 1 };
        DeltaRule::with(tokens, args, floats(args[5]), args[6])
    }

    /// A `gated_delta_step` whose state is carried in place
    /// (`Backend::delta_step_in_place`): `args` are its arguments without
    /// the state, which the caller holds (`state` is empty).
    pub fn carried(args: &[&'t Tensor]) -> DeltaRule<'t> {
        DeltaRule::with(1, args, &[], args[5])
    }

    fn with(tokens: usize, args: &[&'t Tensor], state: &'t [f32], scale: &Tensor) -> DeltaRule<'t> {
        let last = |t: &Tensor, back: usize| t.shape[t.shape.len() - back];
        DeltaRule {
            q: floats(args[0]),
            k: floats(args[1]),
            v: floats(args[2]),
            decay: floats(args[3]),
            beta: floats(args[4]),
            state,
            scale: floats(scale)[0],
            batch: args[0].shape[0],
            tokens,
            key_heads: last(args[0], 2),
            key_dim: last(args[0], 1),
            value_heads: last(args[2], 2),
            value_dim: last(args[2], 1),
        }
    }

    /// Value heads per key head.
    pub fn group(&self) -> usize {
        self.value_heads / self.key_heads
    }

    /// Output rows per batch row: one per token, then the state's.
    pub fn rows(&self) -> usize {
        self.tokens + self.key_dim
    }
}

/// `grouped_attention` (mask `[Q, K]`), `grouped_attention_rows` (mask
/// `[B, Q, K]`) and `grouped_attention_sinks` (that mask and a logit per
/// head), as their Linnet bodies compute them: the first two weigh the
/// values by the softmax's weights, the last by the unnormalized weights
/// and divides by their total (the sink's share included) once per output.
pub fn attention(args: &[&Tensor]) -> Tensor {
    let operands = Attention::of(args);
    let Attention { q: qf, k: kf, v: vf, sinks, dtype, batch, heads, queries, width, kv_heads, keys, .. } = operands;
    let (scale, group) = (f64::from(operands.scale), operands.group());
    let mut out = vec![0f32; batch * heads * queries * width];
    let mut weights = Vec::with_capacity(keys);
    let mut admitted = Vec::with_capacity(keys);
    for b in 0..batch {
        for i in 0..queries {
            // One pass over the mask row; the heads then visit only the
            // admitted keys. When none is, every key holds -1e30, as the
            // body computes.
            let any = admitted_keys(operands.mask, operands.mask_row(b, i), keys, &mut admitted);
            for h in 0..heads {
                let kv = h / group;
                let q_at = ((b * heads + h) * queries + i) * width;
                let masked = -1e30f32 as f64;
                weights.clear();
                weights.extend(admitted.iter().map(|&j| {
                    if any {
                        let k_at = ((b * kv_heads + kv) * keys + j) * width;
                        let score: f64 = (0..width).map(|d| f32r(qf[q_at + d] as f64 * kf[k_at + d] as f64)).sum();
                        f32r(f32r(score) * scale)
                    } else {
                        masked
                    }
                }));
                let sink = sinks.map(|sinks| f64::from(sinks[h]));
                let top = weights.iter().fold(f64::NEG_INFINITY, |top, w| top.max(*w));
                let top = sink.map_or(top, |sink| top.max(sink));
                let mut total = 0.0;
                for weight in weights.iter_mut() {
                    *weight = f32r(math::exp(f32r(*weight - top)));
                    total += *weight;
                }
                let total = f32r(total);
                // Normalized weights, or the divisor of the weighted sums.
                let divisor = match sink {
                    None => {
                        weights.iter_mut().for_each(|weight| *weight = f32r(*weight / total));
                        None
                    }
                    Some(sink) => Some(f32r(total + f32r(math::exp(f32r(sink - top))))),
                };
                for d in 0..width {
                    let mut sum = 0.0;
                    for (weight, &j) in weights.iter().zip(&admitted) {
                        let v_at = ((b * kv_heads + kv) * keys + j) * width + d;
                        sum += f32r(weight * vf[v_at] as f64);
                    }
                    let mixed = divisor.map_or(f32r(sum), |divisor| f32r(f32r(sum) / divisor));
                    out[q_at + d] = round(mixed, dtype) as f32;
                }
            }
        }
    }
    Tensor { dtype, shape: args[0].shape.clone(), data: Data::F32(out.into()) }
}

/// The keys mask row `row` admits, into `admitted`; when it admits none,
/// every key (the body then weighs them all alike), and `false`.
pub fn admitted_keys(mask: &[bool], row: usize, keys: usize, admitted: &mut Vec<usize>) -> bool {
    // Runs of refused keys are passed over a chunk at a time: a causal
    // row of a long cache refuses all but its first keys.
    const CHUNK: usize = 64;
    let row = &mask[row * keys..(row + 1) * keys];
    admitted.clear();
    for (number, chunk) in row.chunks(CHUNK).enumerate() {
        if chunk.iter().fold(false, |any, &admits| any | admits) {
            let first = number * CHUNK;
            admitted.extend(chunk.iter().enumerate().filter(|(_, &admits)| admits).map(|(j, _)| first + j));
        }
    }
    let any = !admitted.is_empty();
    if !any {
        admitted.extend(0..keys);
    }
    any
}

/// Host tensors as the intrinsics take them: floats held as f32.
pub fn widened<'t>(args: &[&'t Tensor]) -> Vec<std::borrow::Cow<'t, Tensor>> {
    args.iter().map(|arg| arg.widened()).collect()
}

/// An intrinsic on host tensors, its arguments widened first.
pub fn run_widened(intrinsic: Intrinsic, args: &[&Tensor], shape: Vec<usize>) -> Tensor {
    let args = widened(args);
    let args: Vec<&Tensor> = args.iter().map(|arg| arg.as_ref()).collect();
    run(intrinsic, &args, shape)
}

/// A cache write on host tensors, its arguments widened first.
pub fn write_cache_widened(intrinsic: Intrinsic, cache: &mut Tensor, args: &[&Tensor]) -> Result<(), NodeError> {
    let args = widened(args);
    let args: Vec<&Tensor> = args.iter().map(|arg| arg.as_ref()).collect();
    write_cache(intrinsic, cache, &args)
}

/// Writes `x` into `cache` in place, as `std.nn.cache` says; an error
/// names what is out of range.
pub fn write_cache(intrinsic: Intrinsic, cache: &mut Tensor, args: &[&Tensor]) -> Result<(), NodeError> {
    let [rows, axis_a, length, width] = cache.shape[..] else { panic!("a cache is rank 4") };
    let x = args[0];
    let xs = floats(x);
    let Data::F32(cells) = &mut cache.data else { panic!("a float cache") };
    let copy = |cells: &mut [f32], row: usize, source: usize, from: usize, count: usize| {
        for a in 0..axis_a {
            for l in 0..count {
                let to = ((row * axis_a + a) * length + from + l) * width;
                let at = ((source * axis_a + a) * x.shape[2] + l) * width;
                cells[to..to + width].copy_from_slice(&xs[at..at + width]);
            }
        }
    };
    match intrinsic {
        Intrinsic::WriteAt | Intrinsic::WriteSpan => {
            let pos = ints(args[1])[0];
            let count = x.shape[2];
            if pos < 0 || pos as usize + count > length {
                let name = intrinsic.name();
                let what = if intrinsic == Intrinsic::WriteAt { "position" } else { "span" };
                return Err(NodeError::Check(format!("{name}: {what} outside the cache")));
            }
            for row in 0..rows {
                copy(cells, row, row, pos as usize, count);
            }
        }
        Intrinsic::WriteRows => {
            let positions = ints(args[1]);
            if positions.iter().any(|&pos| pos < 0 || pos as usize >= length) {
                return Err(NodeError::Check("write_rows: a position outside the cache".into()));
            }
            for (row, &pos) in positions.iter().enumerate() {
                copy(cells, row, row, pos as usize, 1);
            }
        }
        Intrinsic::WriteSlots => {
            let (slots, starts) = (ints(args[1]), ints(args[2]));
            if starts.iter().any(|&start| start < 0 || start as usize > length) {
                return Err(NodeError::Check("write_slots: a start outside the cache".into()));
            }
            for row in 0..rows {
                // As the Linnet body: 1 + the request for this row and its
                // start, each summed over the slots that name the row.
                let named = || slots.iter().enumerate().filter(|(_, &s)| s == row as i64).map(|(m, _)| m);
                let owner: i64 = named().map(|m| m as i64 + 1).sum();
                if owner > 0 {
                    if owner as usize > x.shape[0] {
                        return Err(NodeError::Check(format!(
                            "write_slots: position {} is outside 0..{}",
                            owner - 1,
                            x.shape[0]
                        )));
                    }
                    let start: i64 = named().map(|m| starts[m]).sum();
                    // The positions past the cache's end are not written.
                    let count = x.shape[2].min(length.saturating_sub(start as usize));
                    copy(cells, row, owner as usize - 1, start as usize, count);
                }
            }
        }
        other => unreachable!("{} writes no cache", other.name()),
    }
    Ok(())
}

pub fn run(intrinsic: Intrinsic, args: &[&Tensor], shape: Vec<usize>) -> Tensor {
    match intrinsic {
        Intrinsic::GroupedAttention | Intrinsic::GroupedAttentionRows | Intrinsic::GroupedAttentionSinks => {
            return attention(args)
        }
        Intrinsic::GatedDeltaRule | Intrinsic::GatedDeltaStep => {}
        writer => unreachable!("{} runs through write_cache", writer.name()),
    }
    let operands = DeltaRule::of(intrinsic, args);
    let DeltaRule { q, k, v, decay, beta, state, batch, tokens, key_heads, key_dim, value_heads, value_dim, .. } =
        operands;
    let (scale, group) = (f64::from(operands.scale), operands.group());
    let mut out = vec![0f32; shape.iter().product()];
    let rows = operands.rows();
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
                let forget = math::exp(decay[gate_at] as f64);
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
                    let read: f64 =
                        (0..key_dim).map(|i| memory[i * value_dim + j] * q[key_at + i] as f64 * scale).sum();
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

#[cfg(test)]
mod tests {
    use super::admitted_keys;

    /// The keys a row admits, in order, wherever they fall against the
    /// chunks passed over; a row that admits none gives every key.
    #[test]
    fn admitted_keys_are_the_rows_trues_in_order() {
        let keys = 200;
        let admits = [0, 63, 64, 130, 199];
        let mut mask = vec![false; 2 * keys];
        admits.iter().for_each(|&j| mask[keys + j] = true);
        let mut admitted = Vec::new();
        assert!(admitted_keys(&mask, 1, keys, &mut admitted));
        assert_eq!(admitted, admits);
        assert!(!admitted_keys(&mask, 0, keys, &mut admitted));
        assert_eq!(admitted, (0..keys).collect::<Vec<_>>());
        let causal: Vec<bool> = (0..keys).map(|j| j <= 70).collect();
        assert!(admitted_keys(&causal, 0, keys, &mut admitted));
        assert_eq!(admitted, (0..=70).collect::<Vec<_>>());
    }
}
