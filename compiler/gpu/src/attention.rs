//! Attention as kernels in `emit`'s convention, computing what
//! `linnet_exec::reference` defines in f32: `grouped_attention` (mask `[Q, K]`,
//! row `i`), `grouped_attention_rows` (mask `[B, Q, K]`, row `b · Q + i`)
//! and `grouped_attention_sinks` (that mask, and a logit per head), q
//! `[B, H, Q, D]`, k and v `[B, KvH, K, D]`, the scale, the mask, the
//! sinks; the output is q's shape and type. A row its mask admits no key
//! of weighs every key alike (at -1e30: against a sink, not at all).
//!
//! A decode step's keys are its whole cache (the seed's 262,144
//! positions), of which its mask admits the few written so far, so no warp
//! walks the mask key by key. The node is several kernels:
//! 1. `spans`: a warp per mask row and chunk of [`MASK_CHUNK`] keys finds
//!    the chunk's last admitted key, its lanes reading the chunk's mask
//!    together, and leaves it in the node's scratch. A warp that attends
//!    takes the largest over its mask row's chunks ([`walk_end`]): it
//!    walks the keys up to there, or all of them (weighted alike) where
//!    the row admits none.
//! 2. A warp per query row and head walks its keys in one pass with an
//!    online softmax, as flash attention does ([`walk`]): lane `l` holds
//!    the row's elements `l`, `l + 32`, … of the query and of the weighted
//!    sum, so each key's row is read by the warp together; a key's score
//!    is the lanes' shares of the dot product summed across the warp; the
//!    running maximum rescales the sums so far. The keys go
//!    [`KEYS_PER_STEP`] at a time, so that their sums across the warp
//!    overlap; a step none of whose keys the mask admits is skipped by the
//!    whole warp, and a key it does not admit weighs 0.
//!    - Where a row has one query (a decode step), its keys are split
//!      into parts of [`PART_KEYS`]: a warp per (row, head, part) walks
//!      its part and leaves its maximum, total and weighted sums in the
//!      scratch (`parts`), so that a long cache is walked by many warps at
//!      once; a warp per row and head combines the parts (the last
//!      kernel).
//!    - Elsewhere (a prefill's rows, each a query) one warp walks all of
//!      its row's keys (the last kernel).
//!    - A head's sink is counted once: a warp that walks a whole row starts
//!      its online softmax from it (the largest so far the sink, the total
//!      one), and the parts are combined with it.
//!
//! The head's width must be known when the model is built.

use super::emit::{Combine, Emitter, Form, Kernel, ModelEntry, Scratch, Unsupported, Warp, WARP_LANES};
use super::intrinsic::{load_name, Operands, Spread};
use linnet_ir::dim::Dim;
use linnet_ir::Dtype;
use linnet_ir::Value;

/// The keys of a mask row one item of `spans` checks: each lane every
/// 32nd, one load each.
const MASK_CHUNK: i64 = 1024;

/// The keys one warp walks where a row's keys are split.
const PART_KEYS: i64 = 64;

/// The keys a walk takes at a time.
const KEYS_PER_STEP: usize = 4;

/// What the node's kernels share: its sizes as dims and its scratch's
/// layout (each mask row's chunks' ends, then each part's maximum, total
/// and sums).
struct Plan<'a> {
    entry: ModelEntry<'a>,
    at: usize,
    form: Form,
    args: &'a [Value],
    operands: Operands<'a>,
    rows_mask: bool,
    /// Whether the node's last argument is a logit per head
    /// (`grouped_attention_sinks`).
    sinks: bool,
    width: i64,
    dtype: Dtype,
    mask_rows: Dim,
    chunks: Dim,
    /// The parts of a row's keys, where they are split.
    parts: Option<Dim>,
}

/// The kernels of attention node `at` of `entry`, in launch order.
pub fn attention_kernels(
    entry: ModelEntry<'_>,
    at: usize,
    form: Form,
    args: &[Value],
) -> Result<Vec<Kernel>, Unsupported> {
    let operands = Operands { entry, args };
    let width = operands.shape(0)[3]
        .as_constant()
        .ok_or_else(|| Unsupported("attention whose head width is known only when the model runs".into()))?;
    let keys = operands.shape(1)[2].clone();
    // A mask row per query row of each batch row (`[B, Q, K]`), or one for
    // all batch rows (`[Q, K]`).
    let rows_mask = operands.shape(4).len() == 3;
    let within = |size: i64| keys.add(&Dim::constant(size - 1)).div(&Dim::constant(size));
    let plan = Plan {
        entry,
        at,
        form,
        args,
        rows_mask,
        sinks: args.len() == 6,
        width,
        dtype: entry.nodes[at].dtype,
        mask_rows: if rows_mask {
            operands.shape(0)[0].mul(&operands.shape(0)[2])
        } else {
            operands.shape(0)[2].clone()
        },
        chunks: within(MASK_CHUNK),
        parts: (operands.shape(0)[2].as_constant() == Some(1)).then(|| within(PART_KEYS)),
        operands,
    };
    let mut kernels = vec![spans(&plan, 0).finish_stage(plan.dtype, "spans")];
    match &plan.parts {
        Some(parts) => {
            kernels.push(walk_parts(&plan, 1, parts).finish_stage(plan.dtype, "parts"));
            kernels.push(combine_parts(&plan, 2, parts).finish(plan.dtype));
        }
        None => kernels.push(walk_rows(&plan, 1).finish(plan.dtype)),
    }
    Ok(kernels)
}

impl Plan<'_> {
    fn scratch(&self) -> Scratch {
        let spans = self.mask_rows.mul(&self.chunks);
        let elements = match &self.parts {
            Some(parts) => spans.add(&self.query_rows().mul(parts).mul(&Dim::constant(self.part_size()))),
            None => spans,
        };
        Scratch { dtype: Dtype::F32, elements }
    }

    /// A part's f32s in the scratch: its maximum, its total, its sums.
    fn part_size(&self) -> i64 {
        self.width + 2
    }

    /// The query rows and heads: `B * H * Q`.
    fn query_rows(&self) -> Dim {
        self.operands.shape(0)[..3].iter().fold(Dim::constant(1), |rows, dim| rows.mul(dim))
    }

    /// An emitter for the node's kernel `stage` (they take the same
    /// arguments) and its sizes.
    fn emitter(&self, stage: usize) -> (Emitter<'_>, Sizes) {
        let mut e = Emitter::new(self.entry, self.at, stage, self.form);
        e.loads = self.args.to_vec();
        let scratch = e.scratch(self.scratch());
        let [batch, heads, queries] = [0, 1, 2].map(|axis| self.operands.size(&mut e, 0, axis));
        let (kv_heads, keys) = (self.operands.size(&mut e, 1, 1), self.operands.size(&mut e, 1, 2));
        let (mask_rows, chunks, spread) =
            (e.dim_index(&self.mask_rows), e.dim_index(&self.chunks), Spread::new(&mut e, self.width));
        let spans = e.mul(&mask_rows, &chunks);
        let zero = e.index_constant(0);
        (e, Sizes { batch, heads, queries, kv_heads, keys, chunks, spans, spread, zero, scratch })
    }
}

/// A kernel's sizes (indices) and the scratch's name.
struct Sizes {
    batch: String,
    heads: String,
    queries: String,
    kv_heads: String,
    keys: String,
    chunks: String,
    /// The chunks' ends in the scratch, before the parts.
    spans: String,
    spread: Spread,
    zero: String,
    scratch: &'static str,
}

/// Kernel 1: each mask chunk's end, one past its last admitted key (0
/// where it admits none), as an f32 (exact below 2^24 keys).
fn spans<'a>(plan: &'a Plan<'a>, stage: usize) -> Emitter<'a> {
    let (mut e, s) = plan.emitter(stage);
    let mask = load_name(4);
    e.parallel_in_lanes(
        &[plan.mask_rows.clone(), plan.chunks.clone()],
        &[Combine::Max],
        |e, item, lane| {
            let chunk = e.op(format!("arith.remui {item}, {} : index", s.chunks));
            let row = e.op(format!("arith.divui {item}, {} : index", s.chunks));
            let size = e.index_constant(MASK_CHUNK);
            let chunk_start = e.mul(&chunk, &size);
            let row_start = e.mul(&row, &s.keys);
            let mut end = e.op("arith.constant 0.0 : f32".into());
            // Each lane's keys in order, so the last admitted is the largest.
            for step in 0..MASK_CHUNK / i64::from(WARP_LANES) {
                let offset = e.index_constant(step * i64::from(WARP_LANES));
                let from = e.add(&chunk_start, &offset);
                let j = e.add(&from, lane);
                let inside = e.op(format!("arith.cmpi ult, {j}, {} : index", s.keys));
                let readable = e.op(format!("arith.select {inside}, {j}, {} : index", s.zero));
                let at = e.add(&row_start, &readable);
                let allowed = e.load_element(&mask, &at, Dtype::Bool);
                let admitted = e.op(format!("arith.andi {allowed}, {inside} : i1"));
                let one = e.index_constant(1);
                let past = e.add(&j, &one);
                let past = e.op(format!("arith.index_cast {past} : index to i64"));
                let past = e.op(format!("arith.sitofp {past} : i64 to f32"));
                end = e.op(format!("arith.select {admitted}, {past}, {end} : f32"));
            }
            vec![end]
        },
        |e, item, lane, ends| {
            let first = e.op(format!("arith.cmpi eq, {lane}, {} : index", s.zero));
            e.when(&first, |e| e.store_element(ends[0].clone(), s.scratch, item, Dtype::F32));
        },
    );
    e
}

/// A query row's place: its batch row `b`, head `h`, query `i` and mask
/// row (indices), and where its query starts in q.
struct QueryRow {
    b: String,
    h: String,
    mask_row: String,
    query_at: String,
}

fn query_row(e: &mut Emitter<'_>, plan: &Plan<'_>, s: &Sizes, row: &str) -> QueryRow {
    let position = e.split(row, &[&s.batch, &s.heads, &s.queries]);
    let width = &s.spread.size;
    let query_at = e.mul(row, width);
    let [b, h, i] = [0, 1, 2].map(|axis| position[axis].clone());
    let mask_row = if plan.rows_mask {
        let before = e.mul(&b, &s.queries);
        e.add(&before, &i)
    } else {
        i
    };
    QueryRow { mask_row, b, h, query_at }
}

/// The sink of a query row's head (an f32), where the node has sinks.
fn sink(e: &mut Emitter<'_>, plan: &Plan<'_>, row: &QueryRow) -> Option<String> {
    plan.sinks.then(|| e.load_element(&load_name(5), &row.h, plan.operands.dtype(5)))
}

/// Where a query row's walk ends (an index) and whether its mask row
/// admits any key (an `i1`): the largest of its chunks' ends, or all the
/// keys where it admits none. The lanes read the chunks' ends together.
fn walk_end(e: &mut Emitter<'_>, s: &Sizes, warp: &Warp, row: &QueryRow) -> (String, String) {
    let first = e.mul(&row.mask_row, &s.chunks);
    let step = e.index_constant(i64::from(WARP_LANES));
    let largest = e.in_lanes(warp, &[], 1, |e, lane, _| {
        let none = e.op("arith.constant 0.0 : f32".into());
        e.for_steps(lane, &s.chunks, &step, &[(none, "f32")], |e, chunk, so_far| {
            let at = e.add(&first, chunk);
            let end = e.load_element(s.scratch, &at, Dtype::F32);
            vec![e.op(format!("arith.maximumf {}, {end} : f32", so_far[0]))]
        })
    });
    let end = e.combine_lanes(&largest, Combine::Max).remove(0);
    let zero = e.op("arith.constant 0.0 : f32".into());
    let any = e.op(format!("arith.cmpf ogt, {end}, {zero} : f32"));
    let end = e.op(format!("arith.fptoui {end} : f32 to i64"));
    let end = e.op(format!("arith.index_cast {end} : i64 to index"));
    (e.op(format!("arith.select {any}, {end}, {} : index", s.keys)), any)
}

/// What a walk over a query row's keys starts from: the row, its query's
/// elements in the lanes, whether its mask admits any key, and the head's
/// sink where the walk counts it (an f32).
#[derive(Clone, Copy)]
struct Walker<'a> {
    row: &'a QueryRow,
    queries: &'a [String],
    any: &'a str,
    sink: Option<&'a str>,
}

/// The query row's elements in its lanes, as f32s.
fn queries(e: &mut Emitter<'_>, plan: &Plan<'_>, s: &Sizes, warp: &Warp, row: &QueryRow) -> Vec<String> {
    let (q, qd) = (load_name(0), plan.operands.dtype(0));
    e.in_lanes(warp, &[], s.spread.slots(), |e, lane, _| {
        (0..s.spread.slots()).map(|slot| s.spread.load(e, lane, slot, &q, qd, |e, d| e.add(&row.query_at, d))).collect()
    })
}

/// The online softmax of a query row over keys `from..to` (indices):
/// the largest score, the total of the weights and the lanes' weighted
/// sums (values of [`Emitter::lane_type`]), each relative to the largest.
/// `walker.any`: whether the row's mask admits any key (else every key
/// counts, with the same score); `walker.sink`: a logit the walk starts
/// from (its largest so far, with a weight of one).
fn walk(
    e: &mut Emitter<'_>,
    plan: &Plan<'_>,
    s: &Sizes,
    warp: &Warp,
    walker: &Walker<'_>,
    range: (&str, &str),
) -> Vec<String> {
    let Walker { row, queries, any, sink } = *walker;
    let (k, v, scale, mask) = (load_name(1), load_name(2), load_name(3), load_name(4));
    let (kd, vd, scale_dtype) = (plan.operands.dtype(1), plan.operands.dtype(2), plan.operands.dtype(3));
    let (slots, width) = (s.spread.slots(), &s.spread.size);
    let group = e.op(format!("arith.divui {}, {} : index", s.heads, s.kv_heads));
    let kv = e.op(format!("arith.divui {}, {group} : index", row.h));
    let kv_row = e.flat(&[&row.b, &kv], &[&s.batch, &s.kv_heads]);
    let first_key = e.mul(&kv_row, &s.keys);
    let mask_at = e.mul(&row.mask_row, &s.keys);
    let scale = e.load_element(&scale, &s.zero, scale_dtype);
    let none_admitted = e.not(any);
    let lane_type = e.lane_type();
    let (top, total) = match sink {
        Some(sink) => (sink.to_string(), e.op("arith.constant 1.0 : f32".into())),
        None => (e.op("arith.constant 0xFF800000 : f32".into()), e.op("arith.constant 0.0 : f32".into())),
    };
    let mut carried: Vec<(String, &str)> = vec![(top, "f32"), (total, "f32")];
    let zeros = e.lanes_zero();
    carried.extend((0..slots).map(|_| (zeros.clone(), lane_type.as_str())));
    let types: Vec<&str> = carried.iter().map(|(_, ty)| *ty).collect();
    let (from, to) = range;
    let step = e.index_constant(KEYS_PER_STEP as i64);
    e.for_steps(from, to, &step, &carried, |e, first, so_far| {
        // The keys a step takes: each one's row in k and v (the first
        // key's past the last) and whether it counts.
        let taken: Vec<(String, String)> = (0..KEYS_PER_STEP)
            .map(|offset| {
                let offset = e.index_constant(offset as i64);
                let j = e.add(first, &offset);
                let inside = e.op(format!("arith.cmpi ult, {j}, {to} : index"));
                let j = e.op(format!("arith.select {inside}, {j}, {first} : index"));
                let at = e.add(&mask_at, &j);
                let allowed = e.load_element(&mask, &at, Dtype::Bool);
                let admitted = e.op(format!("arith.ori {allowed}, {none_admitted} : i1"));
                let admitted = e.op(format!("arith.andi {admitted}, {inside} : i1"));
                let key = e.add(&first_key, &j);
                (e.mul(&key, width), admitted)
            })
            .collect();
        let mut any_taken = taken[0].1.clone();
        for (_, admitted) in &taken[1..] {
            any_taken = e.op(format!("arith.ori {any_taken}, {admitted} : i1"));
        }
        e.if_else(
            &any_taken,
            &types,
            |e| {
                let (top, total, sums) = (&so_far[0], &so_far[1], &so_far[2..]);
                let shares = e.in_lanes(warp, queries, KEYS_PER_STEP, |e, lane, queries| {
                    taken
                        .iter()
                        .map(|(key_at, _)| {
                            let mut dot = e.op("arith.constant 0.0 : f32".into());
                            for (slot, query) in queries.iter().enumerate() {
                                let (d, _) = s.spread.position(e, lane, slot);
                                let at = e.add(key_at, &d);
                                let x = e.load_element(&k, &at, kd);
                                dot = e.op(format!("math.fma {query}, {x}, {dot} : f32"));
                            }
                            dot
                        })
                        .collect()
                });
                let dots = e.combine_lanes(&shares, Combine::Add);
                let (masked, left_out) =
                    (e.op("arith.constant -1.0e30 : f32".into()), e.op("arith.constant 0xFF800000 : f32".into()));
                let scores: Vec<String> = dots
                    .iter()
                    .zip(&taken)
                    .map(|(dot, (_, admitted))| {
                        let scaled = e.op(format!("arith.mulf {dot}, {scale} : f32"));
                        let score = e.op(format!("arith.select {any}, {scaled}, {masked} : f32"));
                        e.op(format!("arith.select {admitted}, {score}, {left_out} : f32"))
                    })
                    .collect();
                let mut new_top = top.clone();
                for score in &scores {
                    new_top = e.op(format!("arith.maximumf {new_top}, {score} : f32"));
                }
                let shift = e.op(format!("arith.subf {top}, {new_top} : f32"));
                let rescale = e.op(format!("math.exp {shift} : f32"));
                let mut new_total = e.op(format!("arith.mulf {total}, {rescale} : f32"));
                let weights: Vec<String> = scores
                    .iter()
                    .map(|score| {
                        let shift = e.op(format!("arith.subf {score}, {new_top} : f32"));
                        let weight = e.op(format!("math.exp {shift} : f32"));
                        new_total = e.op(format!("arith.addf {new_total}, {weight} : f32"));
                        weight
                    })
                    .collect();
                let sums = e.in_lanes(warp, sums, slots, |e, lane, sums| {
                    sums.iter()
                        .enumerate()
                        .map(|(slot, sum)| {
                            let (d, _) = s.spread.position(e, lane, slot);
                            let mut sum = e.op(format!("arith.mulf {sum}, {rescale} : f32"));
                            for ((value_at, _), weight) in taken.iter().zip(&weights) {
                                let at = e.add(value_at, &d);
                                let x = e.load_element(&v, &at, vd);
                                sum = e.op(format!("math.fma {weight}, {x}, {sum} : f32"));
                            }
                            sum
                        })
                        .collect()
                });
                [vec![new_top, new_total], sums].concat()
            },
            |_| so_far.to_vec(),
        )
    })
}

/// Stores a query row's result, its lanes' `sums` over `total`.
fn store_row(
    e: &mut Emitter<'_>,
    plan: &Plan<'_>,
    s: &Sizes,
    warp: &Warp,
    row: &QueryRow,
    total: &str,
    sums: &[String],
) {
    e.in_lanes(warp, sums, 0, |e, lane, sums| {
        for (slot, sum) in sums.iter().enumerate() {
            let value = e.op(format!("arith.divf {sum}, {total} : f32"));
            s.spread.store(e, lane, slot, value, ("%out", plan.dtype), |e, d| e.add(&row.query_at, d));
        }
        Vec::new()
    });
}

/// The last kernel where a row's keys are not split: a warp per query
/// row and head walks all of them.
fn walk_rows<'a>(plan: &'a Plan<'a>, stage: usize) -> Emitter<'a> {
    let (mut e, s) = plan.emitter(stage);
    e.parallel_in_warps(&plan.operands.shape(0)[..3], |e, item, warp| {
        let row = query_row(e, plan, &s, item);
        let (end, any) = walk_end(e, &s, warp, &row);
        let queries = queries(e, plan, &s, warp, &row);
        let sink = sink(e, plan, &row);
        let walker = Walker { row: &row, queries: &queries, any: &any, sink: sink.as_deref() };
        let results = walk(e, plan, &s, warp, &walker, (&s.zero, &end));
        store_row(e, plan, &s, warp, &row, &results[1], &results[2..]);
    });
    e
}

/// Where part `part` of query row `row` starts in the scratch (indices).
fn part_at(e: &mut Emitter<'_>, plan: &Plan<'_>, s: &Sizes, parts: &str, row: &str, part: &str) -> String {
    let number = e.mul(row, parts);
    let number = e.add(&number, part);
    let size = e.index_constant(plan.part_size());
    let offset = e.mul(&number, &size);
    e.add(&s.spans, &offset)
}

/// Kernel 2 where a row's keys are split: a warp per query row, head
/// and part of [`PART_KEYS`] keys walks them and leaves its maximum, total
/// and sums in the scratch. A part past the row's walk leaves nothing
/// (the last kernel does not read it).
fn walk_parts<'a>(plan: &'a Plan<'a>, stage: usize, parts: &Dim) -> Emitter<'a> {
    let (mut e, s) = plan.emitter(stage);
    let parts_index = e.dim_index(parts);
    let work: Vec<Dim> = plan.operands.shape(0)[..3].iter().cloned().chain([parts.clone()]).collect();
    e.parallel_in_warps(&work, |e, item, warp| {
        let part = e.op(format!("arith.remui {item}, {parts_index} : index"));
        let row_number = e.op(format!("arith.divui {item}, {parts_index} : index"));
        let row = query_row(e, plan, &s, &row_number);
        let (end, any) = walk_end(e, &s, warp, &row);
        let size = e.index_constant(PART_KEYS);
        let from = e.mul(&part, &size);
        let walked = e.op(format!("arith.cmpi ult, {from}, {end} : index"));
        e.when(&walked, |e| {
            let past = e.add(&from, &size);
            let shorter = e.op(format!("arith.cmpi ult, {past}, {end} : index"));
            let to = e.op(format!("arith.select {shorter}, {past}, {end} : index"));
            let queries = queries(e, plan, &s, warp, &row);
            let walker = Walker { row: &row, queries: &queries, any: &any, sink: None };
            let results = walk(e, plan, &s, warp, &walker, (&from, &to));
            let at = part_at(e, plan, &s, &parts_index, &row_number, &part);
            let one = e.index_constant(1);
            let total_at = e.add(&at, &one);
            let two = e.index_constant(2);
            let sums_at = e.add(&at, &two);
            e.in_lanes(warp, &results[2..], 0, |e, lane, sums| {
                let first = e.op(format!("arith.cmpi eq, {lane}, {} : index", s.zero));
                e.when(&first, |e| {
                    e.store_element(results[0].clone(), s.scratch, &at, Dtype::F32);
                    e.store_element(results[1].clone(), s.scratch, &total_at, Dtype::F32);
                });
                for (slot, sum) in sums.iter().enumerate() {
                    s.spread.store(e, lane, slot, sum.clone(), (s.scratch, Dtype::F32), |e, d| e.add(&sums_at, d));
                }
                Vec::new()
            });
        });
    });
    e
}

/// The last kernel where a row's keys are split: a warp per query row and
/// head combines the parts its walk took, each rescaled to the largest
/// maximum (their maxima read by the lanes together, and the sink where
/// there is one), in order, after the sink's share.
fn combine_parts<'a>(plan: &'a Plan<'a>, stage: usize, parts: &Dim) -> Emitter<'a> {
    let (mut e, s) = plan.emitter(stage);
    let parts_index = e.dim_index(parts);
    e.parallel_in_warps(&plan.operands.shape(0)[..3], |e, item, warp| {
        let row = query_row(e, plan, &s, item);
        let (end, _) = walk_end(e, &s, warp, &row);
        let (size, one) = (e.index_constant(PART_KEYS), e.index_constant(1));
        let rounded = e.op(format!("arith.subi {size}, {one} : index"));
        let rounded = e.add(&end, &rounded);
        let used = e.op(format!("arith.divui {rounded}, {size} : index"));
        let step = e.index_constant(i64::from(WARP_LANES));
        let tops = e.in_lanes(warp, &[], 1, |e, lane, _| {
            let lowest = e.op("arith.constant 0xFF800000 : f32".into());
            e.for_steps(lane, &used, &step, &[(lowest, "f32")], |e, part, so_far| {
                let at = part_at(e, plan, &s, &parts_index, item, part);
                let top = e.load_element(s.scratch, &at, Dtype::F32);
                vec![e.op(format!("arith.maximumf {}, {top} : f32", so_far[0]))]
            })
        });
        let top = e.combine_lanes(&tops, Combine::Max).remove(0);
        let (top, first_total) = match sink(e, plan, &row) {
            Some(sink) => {
                let top = e.op(format!("arith.maximumf {top}, {sink} : f32"));
                let shift = e.op(format!("arith.subf {sink}, {top} : f32"));
                let share = e.op(format!("math.exp {shift} : f32"));
                (top, share)
            }
            None => (top, e.op("arith.constant 0.0 : f32".into())),
        };
        let lane_type = e.lane_type();
        let zeros = e.lanes_zero();
        let mut carried: Vec<(String, &str)> = vec![(first_total, "f32")];
        carried.extend((0..s.spread.slots()).map(|_| (zeros.clone(), lane_type.as_str())));
        let combined = e.for_range(&s.zero, &used, &carried, |e, part, so_far| {
            let at = part_at(e, plan, &s, &parts_index, item, part);
            let part_top = e.load_element(s.scratch, &at, Dtype::F32);
            let total_at = e.add(&at, &one);
            let part_total = e.load_element(s.scratch, &total_at, Dtype::F32);
            let shift = e.op(format!("arith.subf {part_top}, {top} : f32"));
            let weight = e.op(format!("math.exp {shift} : f32"));
            let total = e.op(format!("math.fma {part_total}, {weight}, {} : f32", so_far[0]));
            let two = e.index_constant(2);
            let sums_at = e.add(&at, &two);
            let sums = e.in_lanes(warp, &so_far[1..], s.spread.slots(), |e, lane, sums| {
                sums.iter()
                    .enumerate()
                    .map(|(slot, sum)| {
                        let part_sum = s.spread.load(e, lane, slot, s.scratch, Dtype::F32, |e, d| e.add(&sums_at, d));
                        e.op(format!("math.fma {part_sum}, {weight}, {sum} : f32"))
                    })
                    .collect()
            });
            [vec![total], sums].concat()
        });
        store_row(e, plan, &s, warp, &row, &combined[0], &combined[1..]);
    });
    e
}
