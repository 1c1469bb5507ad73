//! The CPU backend's kernels for the intrinsics, with the numerics a
//! compiled backend may use: f32 throughout, multiply-adds, the widest
//! vectors the CPU has (chosen at run time, as the matrix kernel's are),
//! and every head on the kernels' threads. The gated delta rule keeps each
//! head's state in f32 and walks the tokens in order, one pass over the
//! state per token; attention's scores are matrix products (the matrix
//! kernel's) and it reads each admitted value once per query, for all the
//! query's heads; both written over `simd::Lanes`. Cache writes copy rows
//! and are the interpreter's own (`linnet_exec::reference`).

use super::expf;
use super::isa::Isa;
use super::matmul;
use super::matrix::Rows;
use super::simd::{self, Lanes, OneLane};
use super::threads;
use linnet_exec::reference::{Attention, DeltaRule};
use linnet_exec::tensor::{Data, Tensor};
use linnet_ir::numerics::round;
use linnet_ir::Dtype;
use linnet_ir::Intrinsic;

/// An output written by many threads, each at its own elements.
struct Shared(*mut f32);

// SAFETY: the kernels below give every thread disjoint elements.
unsafe impl Sync for Shared {}

impl Shared {
    /// # Safety
    /// `at` is inside the output and no other thread writes it.
    unsafe fn write(&self, at: usize, value: f32) {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { *self.0.add(at) = value }
    }

    /// # Safety
    /// `at..at + len` is inside the output and no other thread reads or
    /// writes it while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, at: usize, len: usize) -> &mut [f32] {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { std::slice::from_raw_parts_mut(self.0.add(at), len) }
    }
}

/// Defines `$name`, which runs `$kernel::<L>` (an `#[inline(always)]`
/// function written over `simd::Lanes`) with the host's widest lanes: it
/// is inlined into a wrapper with each instruction set's target features
/// and that set's lanes, the wrapper chosen at run time (as the matrix
/// kernel's are). A closure would not do: its body is a function of its
/// own, compiled without the features of the wrapper that calls it.
macro_rules! on_host_vectors {
    ($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) => $kernel:ident in lanes) => {
        $(#[$doc])*
        fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                /// # Safety
                /// The CPU has AVX-512 F, BW and FMA (`Isa::host` chose them);
                /// the arguments are the task's, as its body wants them.
                #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
                unsafe fn avx512($($arg: $ty),*) {
                    $kernel::<simd::Avx512>($($arg),*)
                }
                /// # Safety
                /// The CPU has AVX2 and FMA (`Isa::host` chose them); the
                /// arguments are the task's, as its body wants them.
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) {
                    $kernel::<simd::Avx2>($($arg),*)
                }
                match Isa::host().lanes() {
                    // SAFETY: the CPU has these features.
                    Isa::Avx512 => return unsafe { avx512($($arg),*) },
                    Isa::Avx2 => return unsafe { avx2($($arg),*) },
                    _ => {}
                }
            }
            $kernel::<simd::OneLane>($($arg),*)
        }
    };
}

/// An intrinsic that makes a new value of `shape`, in `out` (a buffer of
/// that many floats whose contents are unspecified: every element is
/// written).
pub fn run(intrinsic: Intrinsic, args: &[&Tensor], shape: Vec<usize>, out: Vec<f32>) -> Tensor {
    assert_eq!(out.len(), shape.iter().product::<usize>(), "an output buffer of the value's size");
    match intrinsic {
        Intrinsic::GroupedAttention | Intrinsic::GroupedAttentionRows | Intrinsic::GroupedAttentionSinks => {
            attention(args, out)
        }
        Intrinsic::GatedDeltaRule | Intrinsic::GatedDeltaStep => delta_rule(intrinsic, args, shape, out),
        writer => unreachable!("{} writes a cache", writer.name()),
    }
}

/// The gated delta rule over a span of tokens (or one, with no S axis),
/// one task per (batch row, value head): the state decays, recalls,
/// learns and is read, token by token, in f32. One pass over the state
/// per token: each cell learns and is read for token `t`, then decays and
/// is recalled for token `t + 1` (the same operations on each cell, in the
/// same order, as two passes), a block of value columns at a time with
/// their sums in registers (`columns_pass`).
fn delta_rule(intrinsic: Intrinsic, args: &[&Tensor], shape: Vec<usize>, mut out: Vec<f32>) -> Tensor {
    let operands = DeltaRule::of(intrinsic, args);
    let target = Shared(out.as_mut_ptr());
    threads::for_each(operands.batch * operands.value_heads, &|task| {
        delta_head(&operands, task, &target, &FinalState::Rows)
    });
    Tensor { dtype: Dtype::F32, shape, data: Data::F32(out.into()) }
}

/// `gated_delta_step` carried in place (`Backend::delta_step_in_place`):
/// `args` without the state, whose heads each advance where they lie; the
/// step's value of `shape` in `out`, only its output row written. The
/// same operations in the same order as [`delta_rule`]'s, so the same
/// bits.
pub fn delta_step_in_place(args: &[&Tensor], state: &mut Tensor, shape: Vec<usize>, mut out: Vec<f32>) -> Tensor {
    assert_eq!(out.len(), shape.iter().product::<usize>(), "an output buffer of the value's size");
    let operands = DeltaRule::carried(args);
    let Data::F32(cells) = &mut state.data else { panic!("a delta rule's state is f32") };
    assert_eq!(cells.len(), operands.batch * operands.value_heads * operands.key_dim * operands.value_dim);
    let state = FinalState::InPlace(Shared(cells.as_mut_ptr()));
    let target = Shared(out.as_mut_ptr());
    threads::for_each(operands.batch * operands.value_heads, &|task| delta_head(&operands, task, &target, &state));
    Tensor { dtype: Dtype::F32, shape, data: Data::F32(out.into()) }
}

/// Where a head's state is read from and left.
enum FinalState {
    /// Read from the operands' state and written to the output's rows
    /// after the tokens' (the intrinsic's value).
    Rows,
    /// Read and advanced where it lies, in a state `[B, VH, KD, VD]` of
    /// which each task owns its head's cells.
    InPlace(Shared),
}

on_host_vectors! {
    /// Task `task` of [`delta_rule`]: one batch row's value head.
    fn delta_head(operands: &DeltaRule, task: usize, target: &Shared, state: &FinalState) => delta_head_in in lanes
}

/// Token `t`'s part of a pass: the state learns `update` along `key`, then
/// is read along `query`.
struct Learn<'p> {
    key: &'p [f32],
    update: &'p [f32],
    query: &'p [f32],
}

/// Token `t + 1`'s part of a pass: the state decays by `decay`, then is
/// recalled along `key`.
struct Next<'p> {
    decay: f32,
    key: &'p [f32],
}

#[inline(always)]
fn delta_head_in<L: Lanes>(operands: &DeltaRule, task: usize, target: &Shared, final_state: &FinalState) {
    let &DeltaRule { q, k, v, decay, beta, state, scale, batch: _, tokens, key_heads, key_dim, value_heads, value_dim } =
        operands;
    let (group, rows) = (operands.group(), operands.rows());
    let (b, h) = (task / value_heads, task % value_heads);
    let kh = h / group;
    let key_at = |t: usize| ((b * tokens + t) * key_heads + kh) * key_dim;
    let gate_at = |t: usize| (b * tokens + t) * value_heads + h;
    let next =
        |t: usize| Next { decay: (decay[gate_at(t)] as f64).exp() as f32, key: &k[key_at(t)..key_at(t) + key_dim] };
    let first = (b * value_heads + h) * key_dim * value_dim;
    let mut copied;
    let memory: &mut [f32] = match final_state {
        FinalState::Rows => {
            copied = state[first..first + key_dim * value_dim].to_vec();
            &mut copied
        }
        // SAFETY: the head's cells: this task's alone.
        FinalState::InPlace(cells) => unsafe { cells.slice(first, key_dim * value_dim) },
    };
    let (mut recalled, mut update, mut read) = (vec![0f32; value_dim], vec![0f32; value_dim], vec![0f32; value_dim]);
    if tokens > 0 {
        state_pass::<L>(memory, value_dim, None, Some(&next(0)), &mut read, &mut recalled);
    }
    for t in 0..tokens {
        let value_at = ((b * tokens + t) * value_heads + h) * value_dim;
        let rate = beta[gate_at(t)];
        for ((slot, &value), &sum) in update.iter_mut().zip(&v[value_at..value_at + value_dim]).zip(&recalled) {
            *slot = (value - sum) * rate;
        }
        let learn = Learn {
            key: &k[key_at(t)..key_at(t) + key_dim],
            update: &update,
            query: &q[key_at(t)..key_at(t) + key_dim],
        };
        let following = (t + 1 < tokens).then(|| next(t + 1));
        state_pass::<L>(memory, value_dim, Some(&learn), following.as_ref(), &mut read, &mut recalled);
        let at = ((b * rows + t) * value_heads + h) * value_dim;
        for (j, &sum) in read.iter().enumerate() {
            // SAFETY: token `t` of head `h` of row `b`: this task's.
            unsafe { target.write(at + j, sum * scale) };
        }
    }
    if let FinalState::InPlace(_) = final_state {
        return;
    }
    for (i, row) in memory.chunks_exact(value_dim).enumerate() {
        let at = ((b * rows + tokens + i) * value_heads + h) * value_dim;
        for (j, &cell) in row.iter().enumerate() {
            // SAFETY: state row `i` of head `h` of row `b`: this task's.
            unsafe { target.write(at + j, cell) };
        }
    }
}

/// Vectors of value columns a pass over the state takes at once: their
/// update and their two running sums (the read and the next recall) stay
/// in registers (twelve of them) while the pass walks every state row, so
/// that each cell is loaded and stored once, and nothing else is.
const COLUMN_VECTORS: usize = 4;

/// One pass over a head's state (`value_dim` columns a row),
/// [`COLUMN_VECTORS`] vectors of columns at a time (the rest one column at
/// a time): the sums of `learn`'s read go to `read` and those of `next`'s
/// recall to `recalled`, each column's over the state rows in order.
#[inline(always)]
fn state_pass<L: Lanes>(
    memory: &mut [f32],
    value_dim: usize,
    learn: Option<&Learn>,
    next: Option<&Next>,
    read: &mut [f32],
    recalled: &mut [f32],
) {
    let block = COLUMN_VECTORS * L::WIDTH;
    let mut at = 0;
    while at < value_dim {
        let whole = at + block <= value_dim;
        // SAFETY: columns `at..at + block` (or the one column `at`) are
        // inside every state row, `read` and `recalled`; `learn`'s and
        // `next`'s keys have a value per state row and its update one per
        // column.
        unsafe {
            match (learn, next, whole) {
                (Some(learn), Some(next), true) => {
                    columns_pass::<L, COLUMN_VECTORS, true, true>(memory, value_dim, at, learn, next, read, recalled)
                }
                (Some(learn), Some(next), false) => {
                    columns_pass::<OneLane, 1, true, true>(memory, value_dim, at, learn, next, read, recalled)
                }
                (Some(learn), None, true) => columns_pass::<L, COLUMN_VECTORS, true, false>(
                    memory, value_dim, at, learn, &NO_NEXT, read, recalled,
                ),
                (Some(learn), None, false) => {
                    columns_pass::<OneLane, 1, true, false>(memory, value_dim, at, learn, &NO_NEXT, read, recalled)
                }
                (None, Some(next), true) => columns_pass::<L, COLUMN_VECTORS, false, true>(
                    memory,
                    value_dim,
                    at,
                    &NO_LEARNING,
                    next,
                    read,
                    recalled,
                ),
                (None, Some(next), false) => {
                    columns_pass::<OneLane, 1, false, true>(memory, value_dim, at, &NO_LEARNING, next, read, recalled)
                }
                (None, None, _) => {}
            }
        }
        at += if whole { block } else { 1 };
    }
}

/// What a pass that does not learn (or does not go on to a next token)
/// is given in its place: never read.
const NO_LEARNING: Learn<'static> = Learn { key: &[], update: &[], query: &[] };
const NO_NEXT: Next<'static> = Next { decay: 1.0, key: &[] };

/// [`state_pass`] over the `N · L::WIDTH` columns from `at`, learning when
/// `LEARN` and decaying and recalling when `NEXT`: per cell, `cell += k_i ·
/// update`, `read += cell · q_i`, `cell *= decay`, `recalled += cell · k'_i`
/// (multiply-adds), the sums in registers.
///
/// # Safety
/// As `state_pass` says of its columns.
#[inline(always)]
unsafe fn columns_pass<L: Lanes, const N: usize, const LEARN: bool, const NEXT: bool>(
    memory: &mut [f32],
    value_dim: usize,
    at: usize,
    learn: &Learn,
    next: &Next,
    read: &mut [f32],
    recalled: &mut [f32],
) {
    // SAFETY: as the caller promises (the function's `# Safety`).
    unsafe {
        let column = |j: usize| at + j * L::WIDTH;
        let mut update = [L::zero(); N];
        if LEARN {
            for (j, lanes) in update.iter_mut().enumerate() {
                *lanes = L::load(learn.update.as_ptr().add(column(j)));
            }
        }
        let (mut reads, mut recalls) = ([L::zero(); N], [L::zero(); N]);
        let rows = memory.len() / value_dim;
        let cells = memory.as_mut_ptr();
        for i in 0..rows {
            let row = cells.add(i * value_dim);
            let (key, query) = if LEARN {
                (L::splat(*learn.key.get_unchecked(i)), L::splat(*learn.query.get_unchecked(i)))
            } else {
                (L::zero(), L::zero())
            };
            let (decay, next_key) = if NEXT {
                (L::splat(next.decay), L::splat(*next.key.get_unchecked(i)))
            } else {
                (L::zero(), L::zero())
            };
            for j in 0..N {
                let mut cell = L::load(row.add(column(j)));
                if LEARN {
                    cell = L::fma(key, update[j], cell);
                    reads[j] = L::fma(cell, query, reads[j]);
                }
                if NEXT {
                    cell = L::mul(cell, decay);
                    recalls[j] = L::fma(cell, next_key, recalls[j]);
                }
                L::store(row.add(column(j)), cell);
            }
        }
        for j in 0..N {
            if LEARN {
                L::store(read.as_mut_ptr().add(column(j)), reads[j]);
            }
            if NEXT {
                L::store(recalled.as_mut_ptr().add(column(j)), recalls[j]);
            }
        }
    }
}

/// Queries a task takes: enough tasks for every thread on a prefill, and
/// scores for all of them that stay in L2.
const QUERY_BLOCK: usize = 16;

/// `grouped_attention` (mask `[Q, K]`), `grouped_attention_rows` (mask
/// `[B, Q, K]`) and `grouped_attention_sinks` (that mask and a logit per
/// head), one task per (batch row, key/value head, block of queries): the
/// scores of every query head that shares the key/value head, for the
/// block's queries, are one matrix product against the keys up to the last
/// any of them admits (the matrix kernel's). Then per query and head: a
/// softmax over the keys its mask admits (all keys at -1e30 when it admits
/// none, as the Linnet bodies compute), and the admitted values weighted
/// for all the query's heads in one pass over them (`weighted_values`),
/// divided by the total where there are sinks, rounded to the query's
/// type. A query's sums follow its admitted keys in order, whatever else
/// the call holds: its result is the same alone or batched.
fn attention(args: &[&Tensor], mut out: Vec<f32>) -> Tensor {
    let operands = Attention::of(args);
    let target = Shared(out.as_mut_ptr());
    let blocks = operands.queries.div_ceil(QUERY_BLOCK);
    threads::for_each(operands.batch * operands.kv_heads * blocks, &|task| attention_block(&operands, task, &target));
    Tensor { dtype: operands.dtype, shape: args[0].shape.clone(), data: Data::F32(out.into()) }
}

on_host_vectors! {
    /// Task `task` of [`attention`]: one batch row's key/value head, for
    /// one block of queries.
    fn attention_block(operands: &Attention, task: usize, target: &Shared) => attention_block_in in lanes
}

#[inline(always)]
fn attention_block_in<L: Lanes>(operands: &Attention, task: usize, target: &Shared) {
    let &Attention { q: qf, k: kf, v: vf, scale, mask, sinks, dtype, heads, queries, width, kv_heads, keys, .. } =
        operands;
    let group = operands.group();
    let blocks = queries.div_ceil(QUERY_BLOCK);
    let (b, kv, block) = (task / (kv_heads * blocks), task / blocks % kv_heads, task % blocks);
    let block = block * QUERY_BLOCK..((block + 1) * QUERY_BLOCK).min(queries);
    let query_at = |i: usize, g: usize| ((b * heads + kv * group + g) * queries + i) * width;
    let admitted: Vec<(bool, Vec<usize>)> = block
        .clone()
        .map(|i| {
            let mut keys_of = Vec::new();
            let any = linnet_exec::reference::admitted_keys(mask, operands.mask_row(b, i), keys, &mut keys_of);
            (any, keys_of)
        })
        .collect();
    let span = admitted
        .iter()
        .filter(|(any, _)| *any)
        .filter_map(|(_, keys_of)| keys_of.last())
        .max()
        .map_or(0, |last| last + 1);
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
    // Per query: the softmax of each of its heads' scores over the keys it
    // admits, then the admitted values weighted, for all the query's heads
    // at once (`weighted_values`).
    let first_value = (b * kv_heads + kv) * keys * width;
    // Room for the most keys a query of the block weighs (a cache's
    // length can be far past the keys in it).
    let most_weighed = admitted.iter().map(|(_, keys_of)| keys_of.len()).max().unwrap_or(0);
    let mut weights = vec![0f32; group * most_weighed];
    let mut sums = vec![0f32; group * width];
    let mut divisors = vec![1f32; group];
    for i in block.clone() {
        let (any, keys_of) = &admitted[i - block.start];
        for (g, head_weights) in weights.chunks_exact_mut(keys_of.len().max(1)).take(group).enumerate() {
            let slot = (i - block.start) * group + g;
            let scores = any.then(|| &scores[slot * span..(slot + 1) * span]);
            let sink = sinks.map(|sinks| sinks[kv * group + g]);
            divisors[g] = softmax(Scores { of: scores, keys_of, scale }, sink, head_weights);
        }
        let values = Values { all: &vf[first_value..first_value + keys * width], width, keys_of };
        weighted_values::<L>(&values, &weights[..group * keys_of.len()], group, &mut sums);
        for (g, divisor) in divisors.iter().enumerate() {
            for (d, &s) in sums[g * width..(g + 1) * width].iter().enumerate() {
                // SAFETY: query `i` of head `kv · group + g` of row `b`:
                // this task's.
                unsafe { target.write(query_at(i, g) + d, round(f64::from(s / divisor), dtype) as f32) };
            }
        }
    }
}

/// One key/value head's values (`all`, `width` a key) and the keys a query
/// admits.
struct Values<'v> {
    all: &'v [f32],
    width: usize,
    keys_of: &'v [usize],
}

/// Query heads of a group whose weighted sums one pass over the values
/// keeps in registers.
const HEADS_AT_ONCE: usize = 8;

/// `sums[g][d] = Σₙ weights[g][n] · values[keys_of[n]][d]` for the `heads`
/// heads of a query (`weights` holds `keys_of.len()` per head), in key
/// order: up to [`HEADS_AT_ONCE`] heads' sums of one vector of columns in
/// registers while the keys stream past, so that each value is loaded once
/// for all of them.
#[inline(always)]
fn weighted_values<L: Lanes>(values: &Values, weights: &[f32], heads: usize, sums: &mut [f32]) {
    let mut head = 0;
    while head < heads {
        let at_once = match heads - head {
            n if n >= HEADS_AT_ONCE => HEADS_AT_ONCE,
            n if n >= 4 => 4,
            n if n >= 2 => 2,
            _ => 1,
        };
        let (weights, sums) = (&weights[head * values.keys_of.len()..], &mut sums[head * values.width..]);
        let mut column = 0;
        while column < values.width {
            let whole = column + L::WIDTH <= values.width;
            // SAFETY: columns `column..column + L::WIDTH` (or the one
            // column) are inside every value row and every head's sums;
            // `weights` has `keys_of.len()` per head for `at_once` heads.
            unsafe {
                match (at_once, whole) {
                    (HEADS_AT_ONCE, true) => heads_pass::<L, HEADS_AT_ONCE>(values, weights, column, sums),
                    (4, true) => heads_pass::<L, 4>(values, weights, column, sums),
                    (2, true) => heads_pass::<L, 2>(values, weights, column, sums),
                    (_, true) => heads_pass::<L, 1>(values, weights, column, sums),
                    (HEADS_AT_ONCE, false) => heads_pass::<OneLane, HEADS_AT_ONCE>(values, weights, column, sums),
                    (4, false) => heads_pass::<OneLane, 4>(values, weights, column, sums),
                    (2, false) => heads_pass::<OneLane, 2>(values, weights, column, sums),
                    (_, false) => heads_pass::<OneLane, 1>(values, weights, column, sums),
                }
            }
            column += if whole { L::WIDTH } else { 1 };
        }
        head += at_once;
    }
}

/// [`weighted_values`] for `H` heads and the `L::WIDTH` columns from
/// `column`: `H` sums in registers, one multiply-add each per key.
///
/// # Safety
/// As `weighted_values` says of its columns and weights.
#[inline(always)]
unsafe fn heads_pass<L: Lanes, const H: usize>(values: &Values, weights: &[f32], column: usize, sums: &mut [f32]) {
    let (keys, width) = (values.keys_of.len(), values.width);
    // SAFETY: as the caller promises (the function's `# Safety`).
    unsafe {
        let mut totals = [L::zero(); H];
        for (n, &j) in values.keys_of.iter().enumerate() {
            let value = L::load(values.all.as_ptr().add(j * width + column));
            for (h, total) in totals.iter_mut().enumerate() {
                *total = L::fma(L::splat(*weights.get_unchecked(h * keys + n)), value, *total);
            }
        }
        for (h, total) in totals.iter().enumerate() {
            L::store(sums.as_mut_ptr().add(h * width + column), *total);
        }
    }
}

/// One query head's scores: `of[j]` for key `j` of `keys_of`, scaled by
/// `scale`; -1e30 for every key where `of` is `None` (the query admits
/// none, as the Linnet bodies' mask leaves them).
struct Scores<'s> {
    of: Option<&'s [f32]>,
    keys_of: &'s [usize],
    scale: f32,
}

/// The softmax of `scores` into `weights` (one per key of `keys_of`),
/// counting `sink` where there is one. Returns what the weighted values
/// are divided by: 1 without a sink (each weight is divided by the total
/// already), else the total, the sink's share included (the weights are
/// left unnormalized), as the Linnet bodies compute.
#[inline(always)]
fn softmax(scores: Scores, sink: Option<f32>, weights: &mut [f32]) -> f32 {
    for (weight, &j) in weights.iter_mut().zip(scores.keys_of) {
        *weight = scores.of.map_or(-1e30, |of| of[j] * scores.scale);
    }
    let top = weights.iter().fold(sink.unwrap_or(f32::NEG_INFINITY), |top, w| top.max(*w));
    let mut total = 0f32;
    for weight in weights.iter_mut() {
        *weight = expf::exp(*weight - top);
        total += *weight;
    }
    match sink {
        None => {
            weights.iter_mut().for_each(|weight| *weight /= total);
            1.0
        }
        Some(sink) => total + expf::exp(sink - top),
    }
}

#[cfg(test)]
mod tests {
    use super::{attention_block_in, delta_head_in, FinalState, Shared};
    use linnet_exec::reference::{Attention, DeltaRule};
    use linnet_exec::tensor::Tensor;
    use linnet_ir::Dtype;
    use linnet_ir::Intrinsic;

    /// Values in `low..high` from a fixed sequence.
    fn values(count: usize, seed: u64, low: f32, high: f32) -> Vec<f32> {
        let mut state = seed;
        (0..count)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                low + (high - low) * ((state >> 40) as f32 / (1u64 << 24) as f32)
            })
            .collect()
    }

    /// Runs `kernel` on every instruction set this CPU has and in one
    /// lane, each through a function with that set's target features.
    macro_rules! on_every_set {
        ($kernel:ident($($arg:ident: $ty:ty),*) => $run:expr) => {{
            let mut outputs = vec![("one lane", $run(&|$($arg: $ty),*| $kernel::<super::OneLane>($($arg),*)))];
            #[cfg(target_arch = "x86_64")]
            {
                use crate::isa::Isa;
                use crate::simd::{Avx2, Avx512};
                /// # Safety
                /// The CPU has AVX-512 F and BW and FMA.
                #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
                unsafe fn avx512($($arg: $ty),*) {
                    $kernel::<Avx512>($($arg),*)
                }
                /// # Safety
                /// The CPU has AVX2 and FMA.
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) {
                    $kernel::<Avx2>($($arg),*)
                }
                let available = Isa::available();
                if available.contains(&Isa::Avx512) {
                    // SAFETY: the CPU has AVX-512.
                    outputs.push(("avx512", $run(&|$($arg: $ty),*| unsafe { avx512($($arg),*) })));
                }
                if available.contains(&Isa::Avx2) {
                    // SAFETY: the CPU has AVX2 and FMA.
                    outputs.push(("avx2", $run(&|$($arg: $ty),*| unsafe { avx2($($arg),*) })));
                }
            }
            outputs
        }};
    }

    /// Attention on every instruction set this CPU has, and in one lane:
    /// three query heads a key/value head (a pass of two heads and one of
    /// one), 20 columns (vectors and a remainder), two blocks of queries,
    /// a causal mask with one query that admits no key, against the
    /// interpreter's: within the contract. Once with a mask for every
    /// batch row, once with a mask per batch row and sinks (their values
    /// around the scores', so that a sink is sometimes the largest).
    #[test]
    fn attention_meets_the_contract_on_every_instruction_set() {
        let (batch, heads, kv_heads, queries, width) = (2, 6, 2, 20, 20);
        let tensor = |shape: Vec<usize>, seed| {
            let count = shape.iter().product();
            Tensor::from_f32(Dtype::F32, shape, values(count, seed, -1.0, 1.0))
        };
        let causal = |at: usize| at % queries <= at / queries % queries;
        let shared_mask: Vec<bool> = (0..queries * queries).map(|at| at / queries != 3 && causal(at)).collect();
        // Batch row 1's query 5 admits no key.
        let row_masks: Vec<bool> =
            (0..batch * queries * queries).map(|at| at / queries != queries + 5 && causal(at)).collect();
        let mask =
            |shape: Vec<usize>, mask| Tensor { dtype: Dtype::Bool, shape, data: linnet_exec::tensor::Data::Bool(mask) };
        let qkv = [
            tensor(vec![batch, heads, queries, width], 11),
            tensor(vec![batch, kv_heads, queries, width], 12),
            tensor(vec![batch, kv_heads, queries, width], 13),
            tensor(Vec::new(), 14),
        ];
        let sinks = Tensor::from_f32(Dtype::F32, vec![heads], values(heads, 15, -0.5, 0.5));
        let shared = [mask(vec![queries, queries], shared_mask)];
        let with_sinks = [mask(vec![batch, queries, queries], row_masks), sinks];
        for rest in [&shared[..], &with_sinks[..]] {
            let args: Vec<&Tensor> = qkv.iter().chain(rest).collect();
            let reference = linnet_exec::reference::attention(&args);
            let operands = Attention::of(&args);
            let blocks = queries.div_ceil(super::QUERY_BLOCK);
            let run = |block: &dyn Fn(&Attention, usize, &Shared)| {
                let mut out = vec![f32::NAN; reference.len()];
                let target = Shared(out.as_mut_ptr());
                (0..batch * kv_heads * blocks).for_each(|task| block(&operands, task, &target));
                Tensor::from_f32(Dtype::F32, reference.shape.clone(), out)
            };
            let outputs = on_every_set!(attention_block_in(operands: &Attention, task: usize, target: &Shared) => run);
            for (lanes, output) in outputs {
                if let Err(mismatch) = linnet_exec::tolerance::compare(&reference, &output) {
                    panic!("{lanes}, {} arguments: {mismatch}", args.len());
                }
            }
        }
    }

    /// The delta rule's passes on every instruction set this CPU has, and
    /// in one lane, over value columns that leave a remainder after the
    /// vector blocks (72: a block of 64 and 8, or two of 32 and 8), against
    /// the interpreter's: within the contract.
    #[test]
    fn the_delta_rule_meets_the_contract_on_every_instruction_set() {
        let (batch, tokens, key_heads, key_dim, value_heads, value_dim) = (2, 5, 2, 8, 4, 72);
        let tensor = |shape: Vec<usize>, seed, low, high| {
            let count = shape.iter().product();
            Tensor::from_f32(Dtype::F32, shape, values(count, seed, low, high))
        };
        let args = [
            tensor(vec![batch, tokens, key_heads, key_dim], 1, -0.5, 0.5),
            tensor(vec![batch, tokens, key_heads, key_dim], 2, -0.5, 0.5),
            tensor(vec![batch, tokens, value_heads, value_dim], 3, -1.0, 1.0),
            tensor(vec![batch, tokens, value_heads], 4, -2.0, 0.0),
            tensor(vec![batch, tokens, value_heads], 5, 0.0, 1.0),
            tensor(vec![batch, value_heads, key_dim, value_dim], 6, -1.0, 1.0),
            tensor(Vec::new(), 7, 0.3, 0.4),
        ];
        let args: Vec<&Tensor> = args.iter().collect();
        let shape = vec![batch, tokens + key_dim, value_heads, value_dim];
        let reference = linnet_exec::reference::run(Intrinsic::GatedDeltaRule, &args, shape.clone());
        let operands = DeltaRule::of(Intrinsic::GatedDeltaRule, &args);
        let run = |head: &dyn Fn(&DeltaRule, usize, &Shared, &FinalState)| {
            let mut out = vec![f32::NAN; shape.iter().product()];
            let target = Shared(out.as_mut_ptr());
            (0..batch * value_heads).for_each(|task| head(&operands, task, &target, &FinalState::Rows));
            Tensor::from_f32(Dtype::F32, shape.clone(), out)
        };
        let outputs = on_every_set!(
            delta_head_in(operands: &DeltaRule, task: usize, target: &Shared, state: &FinalState) => run
        );
        for (lanes, output) in outputs {
            if let Err(mismatch) = linnet_exec::tolerance::compare(&reference, &output) {
                panic!("{lanes}: {mismatch}");
            }
        }
    }
}
