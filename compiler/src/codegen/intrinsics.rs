//! The CPU backend's kernels for the intrinsics, with the numerics a
//! compiled backend may use: f32 throughout, loops written so that the
//! compiler vectorizes them for the widest vectors the CPU has (chosen at
//! run time, as the matrix kernel's are), and every head on rayon's
//! threads. The gated delta rule keeps each head's state in f32 and walks
//! the tokens in order; attention reads each admitted key once per query.
//! Cache writes copy rows and are the interpreter's own (`crate::intrinsics`).

use super::matmul::Isa;
use crate::intrinsics::{Attention, DeltaRule};
use crate::ir::Intrinsic;
use crate::numerics::round;
use crate::sema::ty::Dtype;
use crate::tensor::{Data, Tensor};
use rayon::prelude::*;

/// An output written by many threads, each at its own elements.
struct Shared(*mut f32);

// SAFETY: the kernels below give every thread disjoint elements.
unsafe impl Sync for Shared {}

impl Shared {
    /// # Safety
    /// `at` is inside the output and no other thread writes it.
    unsafe fn write(&self, at: usize, value: f32) {
        unsafe { *self.0.add(at) = value }
    }
}

/// Runs `body` compiled for the host's vectors: the same Rust, vectorized
/// by the compiler for each instruction set.
macro_rules! on_host_vectors {
    ($body:expr) => {{
        let body = $body;
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
            unsafe fn avx512<R>(body: impl FnOnce() -> R) -> R {
                body()
            }
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2<R>(body: impl FnOnce() -> R) -> R {
                body()
            }
            match Isa::host() {
                // SAFETY: the CPU has these features.
                Isa::Avx512Bf16 | Isa::Avx512 => unsafe { avx512(body) },
                Isa::Avx2 => unsafe { avx2(body) },
                Isa::Portable => body(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            body()
        }
    }};
}

/// An intrinsic that makes a new value.
pub fn run(intrinsic: Intrinsic, args: &[&Tensor], shape: Vec<usize>) -> Tensor {
    match intrinsic {
        Intrinsic::GroupedAttention => attention(args, false),
        Intrinsic::GroupedAttentionRows => attention(args, true),
        Intrinsic::GatedDeltaRule | Intrinsic::GatedDeltaStep => delta_rule(intrinsic, args, shape),
        writer => unreachable!("{} writes a cache", writer.name()),
    }
}

/// The gated delta rule over a span of tokens (or one, with no S axis),
/// one task per (batch row, value head): the state decays, recalls,
/// learns and is read, token by token, in f32.
fn delta_rule(intrinsic: Intrinsic, args: &[&Tensor], shape: Vec<usize>) -> Tensor {
    let operands = DeltaRule::of(intrinsic, args);
    let DeltaRule { q, k, v, decay, beta, state, scale, batch, tokens, key_heads, key_dim, value_heads, value_dim } = operands;
    let (group, rows) = (operands.group(), operands.rows());
    let mut out = vec![0f32; shape.iter().product()];
    let target = Shared(out.as_mut_ptr());
    (0..batch * value_heads).into_par_iter().for_each(|task| {
        let (b, h) = (task / value_heads, task % value_heads);
        let kh = h / group;
        on_host_vectors!(|| {
            let first = (b * value_heads + h) * key_dim * value_dim;
            let mut memory = state[first..first + key_dim * value_dim].to_vec();
            let (mut recalled, mut update, mut read) = (vec![0f32; value_dim], vec![0f32; value_dim], vec![0f32; value_dim]);
            for t in 0..tokens {
                let key_at = ((b * tokens + t) * key_heads + kh) * key_dim;
                let value_at = ((b * tokens + t) * value_heads + h) * value_dim;
                let gate_at = (b * tokens + t) * value_heads + h;
                let forget = (decay[gate_at] as f64).exp() as f32;
                let (key, query) = (&k[key_at..key_at + key_dim], &q[key_at..key_at + key_dim]);
                recalled.fill(0.0);
                for (row, &ki) in memory.chunks_exact_mut(value_dim).zip(key) {
                    for (cell, sum) in row.iter_mut().zip(recalled.iter_mut()) {
                        *cell *= forget;
                        *sum += *cell * ki;
                    }
                }
                let rate = beta[gate_at];
                for ((slot, &value), &sum) in update.iter_mut().zip(&v[value_at..value_at + value_dim]).zip(&recalled) {
                    *slot = (value - sum) * rate;
                }
                read.fill(0.0);
                for ((row, &ki), &qi) in memory.chunks_exact_mut(value_dim).zip(key).zip(query) {
                    for ((cell, &delta), sum) in row.iter_mut().zip(&update).zip(read.iter_mut()) {
                        *cell += ki * delta;
                        *sum += *cell * qi;
                    }
                }
                let at = ((b * rows + t) * value_heads + h) * value_dim;
                for (j, &sum) in read.iter().enumerate() {
                    // SAFETY: token `t` of head `h` of row `b`: this task's.
                    unsafe { target.write(at + j, sum * scale) };
                }
            }
            for (i, row) in memory.chunks_exact(value_dim).enumerate() {
                let at = ((b * rows + tokens + i) * value_heads + h) * value_dim;
                for (j, &cell) in row.iter().enumerate() {
                    // SAFETY: state row `i` of head `h` of row `b`: this task's.
                    unsafe { target.write(at + j, cell) };
                }
            }
        })
    });
    Tensor { dtype: Dtype::F32, shape, data: Data::F32(out.into()) }
}

/// `grouped_attention` (mask `[Q, K]`) and `grouped_attention_rows` (mask
/// `[B, 1, K]`), one task per (batch row, query head): each query's scores
/// over the keys its mask admits (all keys, uniformly weighted, when it
/// admits none, as the Linnet body computes), a softmax, and the weighted
/// values, rounded to the query's type.
fn attention(args: &[&Tensor], rows_mask: bool) -> Tensor {
    let operands = Attention::of(args);
    let Attention { q: qf, k: kf, v: vf, scale, mask, dtype, batch, heads, queries, width, kv_heads, keys } = operands;
    let group = operands.group();
    let mut out = vec![0f32; batch * heads * queries * width];
    let target = Shared(out.as_mut_ptr());
    (0..batch * heads).into_par_iter().for_each(|task| {
        let (b, h) = (task / heads, task % heads);
        let kv = h / group;
        on_host_vectors!(|| {
            let (mut admitted, mut weights, mut sum) = (Vec::with_capacity(keys), Vec::with_capacity(keys), vec![0f32; width]);
            for i in 0..queries {
                let any = crate::intrinsics::admitted_keys(mask, if rows_mask { b } else { i }, keys, &mut admitted);
                let q_at = ((b * heads + h) * queries + i) * width;
                let query = &qf[q_at..q_at + width];
                weights.clear();
                weights.extend(admitted.iter().map(|&j| {
                    let k_at = ((b * kv_heads + kv) * keys + j) * width;
                    if any { dot(query, &kf[k_at..k_at + width]) * scale } else { 0.0 }
                }));
                let top = weights.iter().fold(f32::NEG_INFINITY, |top, w| top.max(*w));
                let mut total = 0f32;
                for weight in weights.iter_mut() {
                    *weight = ((*weight - top) as f64).exp() as f32;
                    total += *weight;
                }
                sum.fill(0.0);
                for (weight, &j) in weights.iter().zip(&admitted) {
                    let v_at = ((b * kv_heads + kv) * keys + j) * width;
                    let share = weight / total;
                    for (s, &value) in sum.iter_mut().zip(&vf[v_at..v_at + width]) {
                        *s += share * value;
                    }
                }
                for (d, &s) in sum.iter().enumerate() {
                    // SAFETY: query `i` of head `h` of row `b`: this task's.
                    unsafe { target.write(q_at + d, round(f64::from(s), dtype) as f32) };
                }
            }
        })
    });
    Tensor { dtype, shape: args[0].shape.clone(), data: Data::F32(out.into()) }
}

/// A dot product in sixteen partial sums (so that it vectorizes).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut partial = [0f32; 16];
    let (chunks_a, chunks_b) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = chunks_a.remainder().iter().zip(chunks_b.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in chunks_a.zip(chunks_b) {
        for lane in 0..16 {
            partial[lane] += x[lane] * y[lane];
        }
    }
    partial.iter().sum::<f32>() + tail
}
