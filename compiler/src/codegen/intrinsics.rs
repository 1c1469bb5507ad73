//! The CPU backend's kernels for the intrinsics, with the numerics a
//! compiled backend may use: f32 throughout, loops written so that the
//! compiler vectorizes them for the widest vectors the CPU has (chosen at
//! run time, as the matrix kernel's are), and every head on the kernels'
//! threads. The gated delta rule keeps each head's state in f32 and walks
//! the tokens in order; attention's scores are matrix products (the
//! matrix kernel's) and it reads each admitted value once per query.
//! Cache writes copy rows and are the interpreter's own (`crate::intrinsics`).

use super::expf;
use super::threads;
use super::matmul::{self, Isa, Rows};
use crate::intrinsics::{Attention, DeltaRule};
use crate::ir::Intrinsic;
use crate::numerics::round;
use crate::sema::ty::Dtype;
use crate::tensor::{Data, Tensor};

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

/// Defines `$name`, which runs `$kernel` (an `#[inline(always)]` function)
/// compiled for the host's widest vectors: the same Rust, inlined into a
/// wrapper with each instruction set's target features and vectorized for
/// it, the wrapper chosen at run time (as the matrix kernel's are). A
/// closure would not do: its body is a function of its own, compiled
/// without the features of the wrapper that calls it.
macro_rules! on_host_vectors {
    ($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) => $kernel:path) => {
        $(#[$doc])*
        fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
                unsafe fn avx512($($arg: $ty),*) {
                    $kernel($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) {
                    $kernel($($arg),*)
                }
                match Isa::host() {
                    // SAFETY: the CPU has these features.
                    Isa::Avx512Bf16 | Isa::Avx512 => return unsafe { avx512($($arg),*) },
                    Isa::Avx2 => return unsafe { avx2($($arg),*) },
                    Isa::Portable => {}
                }
            }
            $kernel($($arg),*)
        }
    };
}

/// An intrinsic that makes a new value of `shape`, in `out` (a buffer of
/// that many floats whose contents are unspecified: every element is
/// written).
pub fn run(intrinsic: Intrinsic, args: &[&Tensor], shape: Vec<usize>, out: Vec<f32>) -> Tensor {
    assert_eq!(out.len(), shape.iter().product::<usize>(), "an output buffer of the value's size");
    match intrinsic {
        Intrinsic::GroupedAttention => attention(args, false, out),
        Intrinsic::GroupedAttentionRows => attention(args, true, out),
        Intrinsic::GatedDeltaRule | Intrinsic::GatedDeltaStep => delta_rule(intrinsic, args, shape, out),
        writer => unreachable!("{} writes a cache", writer.name()),
    }
}

/// The gated delta rule over a span of tokens (or one, with no S axis),
/// one task per (batch row, value head): the state decays, recalls,
/// learns and is read, token by token, in f32. One pass over the state
/// per token: each state row learns and is read for token `t`, then
/// decays and is recalled for token `t + 1`, while it is in L1 (the same
/// operations on each element, in the same order, as two passes).
fn delta_rule(intrinsic: Intrinsic, args: &[&Tensor], shape: Vec<usize>, mut out: Vec<f32>) -> Tensor {
    let operands = DeltaRule::of(intrinsic, args);
    let target = Shared(out.as_mut_ptr());
    threads::for_each(operands.batch * operands.value_heads, &|task| delta_head(&operands, task, &target));
    Tensor { dtype: Dtype::F32, shape, data: Data::F32(out.into()) }
}

on_host_vectors! {
    /// Task `task` of [`delta_rule`]: one batch row's value head.
    fn delta_head(operands: &DeltaRule, task: usize, target: &Shared) => delta_head_on_host
}

#[inline(always)]
fn delta_head_on_host(operands: &DeltaRule, task: usize, target: &Shared) {
    let &DeltaRule { q, k, v, decay, beta, state, scale, batch: _, tokens, key_heads, key_dim, value_heads, value_dim } = operands;
    let (group, rows) = (operands.group(), operands.rows());
    let (b, h) = (task / value_heads, task % value_heads);
    let kh = h / group;
    let key_at = |t: usize| ((b * tokens + t) * key_heads + kh) * key_dim;
    let gate_at = |t: usize| (b * tokens + t) * value_heads + h;
    let forget = |t: usize| (decay[gate_at(t)] as f64).exp() as f32;
    let first = (b * value_heads + h) * key_dim * value_dim;
    let mut memory = state[first..first + key_dim * value_dim].to_vec();
    let (mut recalled, mut update, mut read) = (vec![0f32; value_dim], vec![0f32; value_dim], vec![0f32; value_dim]);
    if tokens > 0 {
        let (decayed, key) = (forget(0), &k[key_at(0)..key_at(0) + key_dim]);
        let recalled = &mut recalled[..value_dim];
        for (row, &ki) in memory.chunks_exact_mut(value_dim).zip(key) {
            let row = &mut row[..value_dim];
            for d in 0..value_dim {
                row[d] *= decayed;
                recalled[d] += row[d] * ki;
            }
        }
    }
    for t in 0..tokens {
        let value_at = ((b * tokens + t) * value_heads + h) * value_dim;
        let (key, query) = (&k[key_at(t)..key_at(t) + key_dim], &q[key_at(t)..key_at(t) + key_dim]);
        let rate = beta[gate_at(t)];
        for ((slot, &value), &sum) in update.iter_mut().zip(&v[value_at..value_at + value_dim]).zip(&recalled) {
            *slot = (value - sum) * rate;
        }
        read.fill(0.0);
        recalled.fill(0.0);
        if t + 1 < tokens {
            let (decayed, next_key) = (forget(t + 1), &k[key_at(t + 1)..key_at(t + 1) + key_dim]);
            let (update, read, recalled) = (&update[..value_dim], &mut read[..value_dim], &mut recalled[..value_dim]);
            for (((row, &ki), &qi), &next_ki) in memory.chunks_exact_mut(value_dim).zip(key).zip(query).zip(next_key) {
                let row = &mut row[..value_dim];
                for d in 0..value_dim {
                    let learned = row[d] + ki * update[d];
                    read[d] += learned * qi;
                    let decayed_cell = learned * decayed;
                    row[d] = decayed_cell;
                    recalled[d] += decayed_cell * next_ki;
                }
            }
        } else {
            let (update, read) = (&update[..value_dim], &mut read[..value_dim]);
            for ((row, &ki), &qi) in memory.chunks_exact_mut(value_dim).zip(key).zip(query) {
                let row = &mut row[..value_dim];
                for d in 0..value_dim {
                    row[d] += ki * update[d];
                    read[d] += row[d] * qi;
                }
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
}

/// Queries a task takes: enough tasks for every thread on a prefill, and
/// scores for all of them that stay in L2.
const QUERY_BLOCK: usize = 16;

/// `grouped_attention` (mask `[Q, K]`) and `grouped_attention_rows` (mask
/// `[B, 1, K]`), one task per (batch row, key/value head, block of
/// queries): the scores of every query head that shares the key/value
/// head, for the block's queries, are one matrix product against the keys
/// up to the last any of them admits (the matrix kernel's). Then per query
/// and head: a softmax over the keys its mask admits (all keys, uniformly
/// weighted, when it admits none, as the Linnet body computes), and the
/// admitted values weighted, rounded to the query's type.
fn attention(args: &[&Tensor], rows_mask: bool, mut out: Vec<f32>) -> Tensor {
    let operands = Attention::of(args);
    let target = Shared(out.as_mut_ptr());
    let blocks = operands.queries.div_ceil(QUERY_BLOCK);
    threads::for_each(operands.batch * operands.kv_heads * blocks, &|task| attention_block(&operands, rows_mask, task, &target));
    Tensor { dtype: operands.dtype, shape: args[0].shape.clone(), data: Data::F32(out.into()) }
}

on_host_vectors! {
    /// Task `task` of [`attention`]: one batch row's key/value head, for
    /// one block of queries.
    fn attention_block(operands: &Attention, rows_mask: bool, task: usize, target: &Shared) => attention_block_on_host
}

#[inline(always)]
fn attention_block_on_host(operands: &Attention, rows_mask: bool, task: usize, target: &Shared) {
    let &Attention { q: qf, k: kf, v: vf, scale, mask, dtype, batch: _, heads, queries, width, kv_heads, keys } = operands;
    let group = operands.group();
    let blocks = queries.div_ceil(QUERY_BLOCK);
    let (b, kv, block) = (task / (kv_heads * blocks), task / blocks % kv_heads, task % blocks);
    let block = block * QUERY_BLOCK..((block + 1) * QUERY_BLOCK).min(queries);
    let query_at = |i: usize, g: usize| ((b * heads + kv * group + g) * queries + i) * width;
    let admitted: Vec<(bool, Vec<usize>)> = block
        .clone()
        .map(|i| {
            let mut keys_of = Vec::new();
            let any = crate::intrinsics::admitted_keys(mask, if rows_mask { b } else { i }, keys, &mut keys_of);
            (any, keys_of)
        })
        .collect();
    let span = admitted.iter().filter(|(any, _)| *any).filter_map(|(_, keys_of)| keys_of.last()).max().map_or(0, |last| last + 1);
    let first_key = (b * kv_heads + kv) * keys * width;
    let mut scores = vec![0f32; block.len() * group * span];
    let slots: Vec<(usize, usize)> = block.clone().flat_map(|i| (0..group).map(move |g| (i, g))).collect();
    if span > 0 {
        let rows = Rows {
            inputs: slots.iter().map(|&(i, g)| qf[query_at(i, g)..].as_ptr()).collect(),
            outs: scores.chunks_exact_mut(span).map(|row| row.as_mut_ptr()).collect(),
        };
        // SAFETY: each query row has `width` values, each scores row
        // room for `span`, and the keys up to `span` are in `kf`.
        unsafe { matmul::products(&rows, &kf[first_key..first_key + span * width], span, width) };
    }
    let (mut weights, mut sum) = (Vec::with_capacity(keys), vec![0f32; width]);
    for (slot, &(i, g)) in slots.iter().enumerate() {
        let (any, keys_of) = &admitted[i - block.start];
        let row = &scores[slot * span..(slot + 1) * span];
        weights.clear();
        weights.extend(keys_of.iter().map(|&j| if *any { row[j] * scale } else { 0.0 }));
        let top = weights.iter().fold(f32::NEG_INFINITY, |top, w| top.max(*w));
        let mut total = 0f32;
        for weight in weights.iter_mut() {
            *weight = expf::exp(*weight - top);
            total += *weight;
        }
        sum.fill(0.0);
        for (weight, &j) in weights.iter().zip(keys_of) {
            let v_at = ((b * kv_heads + kv) * keys + j) * width;
            let share = weight / total;
            for (s, &value) in sum.iter_mut().zip(&vf[v_at..v_at + width]) {
                *s += share * value;
            }
        }
        for (d, &s) in sum.iter().enumerate() {
            // SAFETY: query `i` of head `kv · group + g` of row `b`:
            // this task's.
            unsafe { target.write(query_at(i, g) + d, round(f64::from(s), dtype) as f32) };
        }
    }
}
