//! A contraction (`ir::contraction`: `out[o…, n] = sum[k] A[a(o…), k] *
//! W[w(o…), n, k]`, the linear layers and the expert products) as warps:
//! one work item per output column `n` and block of rows, split across a
//! warp's lanes along `k` ([`Emitter::parallel_in_lanes`]). The lanes read
//! a row of `W` together, each a run of [`RUN`] consecutive elements (one
//! 16-byte load of bf16), the warp 512 consecutive bytes: the read a
//! matrix–vector product at the bandwidth limit needs, where one thread
//! per output would read 32 rows a cache line apart. Adjacent warps take
//! adjacent columns of the same rows, so `A`'s rows are read from cache.
//!
//! An item takes [`ROWS`] rows, so a `W` row they share is read once for
//! all of them. Where every row reads the same `W` row (a linear layer:
//! `w` reads none of the row axes), the rows are consecutive: a decode
//! step of eight sequences reads each weight once. Where a row picks its
//! own (an expert gathered per row), the node is two kernels: the first
//! orders the rows by the `W` row they read (a warp per row counts the
//! rows before it in that order, a stable ranking: ties keep the rows'
//! order) into the node's scratch; the second takes the rows in that
//! order, eight to an item, and reads a `W` row again only where it
//! changes, so a prefill's rows that chose the same expert read its
//! weights together (the grouped product). A node of no more rows than an
//! item would take (a decode step's experts, each its own) has nothing to
//! order or share: an item per row and column, for more warps. A row past
//! the last is skipped by the whole warp.
//!
//! A node with an epilogue (`ir::contraction`: the residual add after an
//! output projection) computes it where a total is stored: lane `r`
//! binds the node's indices to row `r` and the column and evaluates the
//! node's expression, its sum read as the total.
//!
//! Each lane sums its share in f32 with fused multiply-adds (in
//! [`RUN`]-wide vectors, their elements added in order at the end), the
//! lanes' sums in a fixed tree: the contract's reordered f32 sum. The runs
//! are used where the depth is a constant multiple of [`RUN`] (rows start
//! aligned); elsewhere each lane reads every 32nd element.

use super::emit::{register, stored, Combine, Emitter, Form, Kernel, ModelEntry, Scratch, Unsupported, WARP_LANES};
use linnet_ir::contraction::{reads_index, Contraction};
use linnet_ir::dim::Dim;
use linnet_ir::Dtype;
use linnet_ir::{Scalar, Value};
use std::cell::Cell;

/// Rows an item takes; lane `r` stores row `r`, so no more than a warp's
/// lanes.
const ROWS: usize = 8;
const _: () = assert!(ROWS <= WARP_LANES as usize);

/// Consecutive elements a lane reads at once.
const RUN: i64 = 8;

/// How an item's rows are found, and whether they share their `W` row.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rows {
    /// Consecutive rows that share it (a linear layer).
    Shared,
    /// Rows that gather their own, no more of them than an item would
    /// take (a decode step's experts), so there is nothing to order or
    /// share: one row to an item, for as many warps as there are rows.
    Gathered,
    /// Rows that gather their own, taken in the order the first kernel
    /// left in the scratch.
    Ordered,
}

/// One row of an item: where its operands' rows start (indices).
struct Row {
    input: String,
    weight: String,
    /// Whether it is one of the node's rows (an `i1`), for every row of an
    /// item but its first, which always is.
    real: Option<String>,
    /// Whether it reads the `W` row the item's previous row read.
    reuse: Reuse,
}

enum Reuse {
    Never,
    Always,
    /// Where this `i1` holds (the same for every lane).
    When(String),
}

/// The node's shape as the kernels see it.
struct Layout<'a> {
    at: usize,
    leading: &'a [Dim],
    columns: &'a Dim,
    rows: Dim,
}

/// The kernels of contraction node `at` of `entry`, in launch order.
pub fn contraction_kernels(
    entry: ModelEntry<'_>,
    at: usize,
    form: Form,
    contraction: &Contraction<'_>,
) -> Result<Vec<Kernel>, Unsupported> {
    let node = &entry.nodes[at];
    let (leading, columns) = node.shape.split_at(node.shape.len() - 1);
    let layout = Layout {
        at,
        leading,
        columns: &columns[0],
        rows: leading.iter().fold(Dim::constant(1), |count, dim| count.mul(dim)),
    };
    let column_axis = leading.len() as u32;
    let shared =
        !contraction.weight.rows.iter().any(|position| (0..column_axis).any(|axis| reads_index(position, axis)));
    let one_item = layout.rows.as_constant().is_some_and(|rows| rows <= ROWS as i64);
    if shared || one_item {
        let rows = if shared { Rows::Shared } else { Rows::Gathered };
        return Ok(vec![products(entry, form, contraction, &layout, rows)?]);
    }
    // The order is launched first, so the products are the node's second
    // kernel; they are written first, for the order to take their loads.
    let products = products(entry, form, contraction, &layout, Rows::Ordered)?;
    let order = order(entry, form, contraction, &layout, &products.loads)?;
    Ok(vec![order, products])
}

/// The scratch of a node whose rows are ordered: each row's number, in
/// the order of the `W` rows they read.
fn order_scratch(layout: &Layout<'_>) -> Scratch {
    Scratch { dtype: Dtype::I64, elements: layout.rows.clone() }
}

/// The sizes of the node's row axes (indices), read once per kernel for
/// [`bind_row`].
fn row_sizes(e: &mut Emitter<'_>, layout: &Layout<'_>) -> Vec<String> {
    layout.leading.iter().map(|dim| e.dim_index(dim)).collect()
}

/// Binds the node's axes to row `row` (an index, split along `sizes`,
/// from [`row_sizes`]) and output column `column`.
fn bind_row(e: &mut Emitter<'_>, layout: &Layout<'_>, sizes: &[String], row: &str, column: &str) {
    let sizes: Vec<&str> = sizes.iter().map(String::as_str).collect();
    let shape: Vec<Dim> = layout.leading.iter().chain([layout.columns]).cloned().collect();
    e.bind_axes(row, &sizes, &shape);
    e.indices.insert(layout.leading.len() as u32, column.to_string());
}

/// The first kernel of a gathered product: a warp per row, whose lanes
/// count the rows that come before it (a `W` row lower, or the same one
/// and a lower row number), so that its lane 0 stores the row's number at
/// that rank in the scratch. The count is an f32 sum of ones, exact below
/// 2^24 rows.
fn order(
    entry: ModelEntry<'_>,
    form: Form,
    contraction: &Contraction<'_>,
    layout: &Layout<'_>,
    loads: &[Value],
) -> Result<Kernel, Unsupported> {
    let node = &entry.nodes[layout.at];
    let mut e = Emitter::new(entry, layout.at, 0, form);
    // Both kernels take the same arguments.
    e.loads = loads.to_vec();
    let order = e.scratch(order_scratch(layout));
    let rows = e.dim_index(&layout.rows);
    let sizes = row_sizes(&mut e, layout);
    let failed = Cell::new(None);
    let weight_row = |e: &mut Emitter<'_>, row: &str| {
        let zero = e.index_constant(0);
        bind_row(e, layout, &sizes, row, &zero);
        e.position(contraction.weight.value, contraction.weight.rows).unwrap_or_else(|why| {
            failed.set(Some(why));
            zero
        })
    };
    e.parallel_in_lanes(
        std::slice::from_ref(&layout.rows),
        &[Combine::Add],
        |e, row, lane| {
            let mine = weight_row(e, row);
            let step = e.index_constant(i64::from(WARP_LANES));
            let none = e.op("arith.constant 0.0 : f32".into());
            e.for_steps(lane, &rows, &step, &[(none, "f32")], |e, other, count| {
                let theirs = weight_row(e, other);
                let lower = e.op(format!("arith.cmpi ult, {theirs}, {mine} : index"));
                let same = e.op(format!("arith.cmpi eq, {theirs}, {mine} : index"));
                let earlier = e.op(format!("arith.cmpi ult, {other}, {row} : index"));
                let tie = e.op(format!("arith.andi {same}, {earlier} : i1"));
                let before = e.op(format!("arith.ori {lower}, {tie} : i1"));
                let (one, zero) = (e.op("arith.constant 1.0 : f32".into()), e.op("arith.constant 0.0 : f32".into()));
                let counted = e.op(format!("arith.select {before}, {one}, {zero} : f32"));
                vec![e.op(format!("arith.addf {}, {counted} : f32", count[0]))]
            })
        },
        |e, row, lane, totals| {
            let zero = e.index_constant(0);
            let first = e.op(format!("arith.cmpi eq, {lane}, {zero} : index"));
            e.when(&first, |e| {
                let rank = e.op(format!("arith.fptoui {} : f32 to i64", totals[0]));
                let rank = e.op(format!("arith.index_cast {rank} : i64 to index"));
                let number = e.op(format!("arith.index_cast {row} : index to i64"));
                e.store_element(number, order, &rank, Dtype::I64);
            });
        },
    );
    if e.loads != loads {
        return Err(Unsupported("ordering an expert product's rows reads a value its product does not".into()));
    }
    match failed.take() {
        Some(why) => Err(why),
        None => Ok(e.finish_stage(node.dtype, "order")),
    }
}

/// The products: one item per output column and [`ROWS`] rows (one
/// where they are [`Rows::Gathered`]), found as `kind` says.
fn products(
    entry: ModelEntry<'_>,
    form: Form,
    contraction: &Contraction<'_>,
    layout: &Layout<'_>,
    kind: Rows,
) -> Result<Kernel, Unsupported> {
    let node = &entry.nodes[layout.at];
    let rows_per_item = if kind == Rows::Gathered { 1 } else { ROWS };
    let blocks = layout.rows.add(&Dim::constant(rows_per_item as i64 - 1)).div(&Dim::constant(rows_per_item as i64));
    let read =
        if contraction.depth.as_constant().is_some_and(|depth| depth % RUN == 0) { Read::Runs } else { Read::Elements };

    let stage = usize::from(kind == Rows::Ordered);
    let mut e = Emitter::new(entry, layout.at, stage, form);
    let (input, weight) = (contraction.input.value, contraction.weight.value);
    let (input_argument, weight_argument) = (e.argument(input), e.argument(weight));
    let order = (kind == Rows::Ordered).then(|| e.scratch(order_scratch(layout)));
    let (row_count, columns, depth) =
        (e.dim_index(&layout.rows), e.dim_index(layout.columns), e.dim_index(contraction.depth));
    let per_item = e.index_constant(rows_per_item as i64);
    let sizes = row_sizes(&mut e, layout);
    // Item `item`'s column and rows: each row's number and, but for the
    // first, whether it is one.
    let item_rows = |e: &mut Emitter<'_>, item: &str| {
        let column = e.op(format!("arith.remui {item}, {columns} : index"));
        let block = e.op(format!("arith.divui {item}, {columns} : index"));
        let first = e.mul(&block, &per_item);
        let rows: Vec<(String, Option<String>)> = (0..rows_per_item)
            .map(|r| {
                let (slot, inside) = row_number(e, &first, r, &row_count);
                let row = match order {
                    Some(order) => {
                        let number = e.load_element(order, &slot, Dtype::I64);
                        e.op(format!("arith.index_cast {number} : i64 to index"))
                    }
                    None => slot,
                };
                (row, (r > 0).then_some(inside))
            })
            .collect();
        (column, rows)
    };
    let failed = Cell::new(None);
    e.parallel_in_lanes(
        &[blocks, layout.columns.clone()],
        &vec![Combine::Add; rows_per_item],
        |e, item, lane| {
            let (column, rows) = item_rows(e, item);
            let mut starts: Vec<Row> = Vec::with_capacity(rows_per_item);
            let mut previous_weight_row: Option<String> = None;
            for (row, real) in rows {
                bind_row(e, layout, &sizes, &row, &column);
                let input_row = e.position(input, contraction.input.rows);
                let weight_row = match &previous_weight_row {
                    Some(shared) if kind == Rows::Shared => Ok(shared.clone()),
                    _ => e.position(weight, contraction.weight.rows),
                };
                match (input_row, weight_row) {
                    (Ok(input_row), Ok(weight_row)) => {
                        let reuse = match &previous_weight_row {
                            None => Reuse::Never,
                            Some(_) if kind == Rows::Shared => Reuse::Always,
                            Some(previous) => {
                                Reuse::When(e.op(format!("arith.cmpi eq, {weight_row}, {previous} : index")))
                            }
                        };
                        let scaled = e.mul(&weight_row, &columns);
                        let weight_column = e.add(&scaled, &column);
                        starts.push(Row {
                            input: e.mul(&input_row, &depth),
                            weight: e.mul(&weight_column, &depth),
                            real,
                            reuse,
                        });
                        previous_weight_row = Some(weight_row);
                    }
                    (Err(why), _) | (_, Err(why)) => {
                        failed.set(Some(why));
                        let zero = e.index_constant(0);
                        starts.push(Row { input: zero.clone(), weight: zero, real, reuse: Reuse::Never });
                    }
                }
            }
            let operands = Operands {
                input: (input_argument.as_str(), dtype_of(e, input)),
                weight: (weight_argument.as_str(), dtype_of(e, weight)),
            };
            lane_sums(e, read, lane, &depth, &starts, &operands)
        },
        |e, item, lane, totals| {
            // Lane `r` stores row `r`'s total.
            let (column, rows) = item_rows(e, item);
            for (r, (total, (row, real))) in totals.iter().zip(rows).enumerate() {
                let offset = e.index_constant(r as i64);
                let storing = e.op(format!("arith.cmpi eq, {lane}, {offset} : index"));
                let storing = match real {
                    Some(real) => e.op(format!("arith.andi {storing}, {real} : i1")),
                    None => storing,
                };
                e.when(&storing, |e| {
                    let scaled = e.mul(&row, &columns);
                    let at = e.add(&scaled, &column);
                    let value = match contraction.epilogue {
                        Some(epilogue) => {
                            bind_row(e, layout, &sizes, &row, &column);
                            from_total(e, contraction.sum, total, epilogue).unwrap_or_else(|why| {
                                failed.set(Some(why));
                                total.clone()
                            })
                        }
                        None => total.clone(),
                    };
                    e.store_element(value, "%out", &at, node.dtype);
                });
            }
        },
    );
    match failed.take() {
        Some(why) => Err(why),
        None => Ok(e.finish(node.dtype)),
    }
}

/// The node's `epilogue` at the bound row and column, its `sum` read as
/// `total`.
fn from_total(e: &mut Emitter<'_>, sum: &Scalar, total: &str, epilogue: &Scalar) -> Result<String, Unsupported> {
    let key = sum as *const Scalar;
    e.hoisted.insert(key, total.to_string());
    let value = e.scalar(epilogue);
    e.hoisted.remove(&key);
    value
}

/// Row `first + r` of the item, or row 0 past the last (`rows`); and
/// whether it is one of the rows.
fn row_number(e: &mut Emitter<'_>, first: &str, r: usize, rows: &str) -> (String, String) {
    let offset = e.index_constant(r as i64);
    let row = e.add(first, &offset);
    let inside = e.op(format!("arith.cmpi ult, {row}, {rows} : index"));
    let zero = e.index_constant(0);
    (e.op(format!("arith.select {inside}, {row}, {zero} : index")), inside)
}

fn dtype_of(e: &Emitter<'_>, value: Value) -> Dtype {
    e.entry.nodes[value.index()].dtype
}

/// The two operands' arguments and element types.
struct Operands<'a> {
    input: (&'a str, Dtype),
    weight: (&'a str, Dtype),
}

/// How a lane reads its share of a row: runs of [`RUN`] consecutive
/// elements (from element `RUN * lane`, every `RUN * WARP_LANES`th), or single
/// elements (from element `lane`, every `WARP_LANES`th).
#[derive(Clone, Copy)]
enum Read {
    Runs,
    Elements,
}

impl Read {
    fn width(self) -> i64 {
        match self {
            Read::Runs => RUN,
            Read::Elements => 1,
        }
    }

    /// The type a lane's sums are kept in.
    fn register(self) -> String {
        match self {
            Read::Runs => format!("vector<{RUN}xf32>"),
            Read::Elements => "f32".into(),
        }
    }

    fn zero(self) -> String {
        match self {
            Read::Runs => format!("arith.constant dense<0.0> : {}", self.register()),
            Read::Elements => "arith.constant 0.0 : f32".into(),
        }
    }

    /// What `argument` (of `dtype`) holds from `at`, as f32s. On the
    /// device a run's load says it is aligned (a row starts at a multiple
    /// of the run, and device buffers at 256 bytes), so it is one vector
    /// load; the host's buffers promise nothing.
    /// A quantized parameter's run is decoded in registers.
    fn load(self, e: &mut Emitter<'_>, argument: &str, at: &str, dtype: Dtype) -> String {
        if let Read::Elements = self {
            return e.load_element(argument, at, dtype);
        }
        if let Some(format) = e.blocks_of(argument) {
            return e.decoded(argument, at, format, RUN as usize);
        }
        let element = stored(dtype);
        let alignment = match e.form() {
            Form::Device => format!(" {{alignment = {}}}", RUN as usize * dtype.bytes()),
            Form::Host => String::new(),
        };
        let run =
            e.op(format!("vector.load {argument}[{at}]{alignment} : memref<?x{element}>, vector<{RUN}x{element}>"));
        match register(dtype) {
            "f32" if element != "f32" => {
                e.op(format!("arith.extf {run} : vector<{RUN}x{element}> to vector<{RUN}xf32>"))
            }
            _ => run,
        }
    }

    /// `sum + a * w`, fused.
    fn fma(self, e: &mut Emitter<'_>, a: &str, w: &str, sum: &str) -> String {
        match self {
            Read::Runs => e.op(format!("vector.fma {a}, {w}, {sum} : {}", self.register())),
            Read::Elements => e.op(format!("math.fma {a}, {w}, {sum} : f32")),
        }
    }

    /// A lane's sum: a run's elements added in order.
    fn total(self, e: &mut Emitter<'_>, sum: String) -> String {
        match self {
            Read::Runs => e.op(format!("vector.reduction <add>, {sum} : {} into f32", self.register())),
            Read::Elements => sum,
        }
    }
}

/// One lane's sums, one per row of the item (`starts`); a `W` row the
/// previous row read is not read again.
fn lane_sums(
    e: &mut Emitter<'_>,
    read: Read,
    lane: &str,
    depth: &str,
    starts: &[Row],
    operands: &Operands<'_>,
) -> Vec<String> {
    let width = e.index_constant(read.width());
    let from = e.mul(lane, &width);
    let step = e.index_constant(read.width() * i64::from(WARP_LANES));
    let zero = e.op(read.zero());
    let register = read.register();
    let carried: Vec<(String, &str)> = starts.iter().map(|_| (zero.clone(), register.as_str())).collect();
    let sums = e.for_steps(&from, depth, &step, &carried, |e, k, sums| {
        let ((input, input_dtype), (weight, weight_dtype)) = (operands.input, operands.weight);
        let mut previous: Option<String> = None;
        let mut next = Vec::with_capacity(starts.len());
        for (start, sum) in starts.iter().zip(sums) {
            let load = |e: &mut Emitter<'_>| {
                let at = e.add(&start.weight, k);
                vec![read.load(e, weight, &at, weight_dtype)]
            };
            let w = match (&start.reuse, previous.take()) {
                (Reuse::Always, Some(w)) => w,
                (Reuse::When(same), Some(w)) => e.if_else(same, &[register.as_str()], |_| vec![w], load).remove(0),
                _ => load(e).remove(0),
            };
            // A row past the last (the whole warp's) is skipped.
            let product = |e: &mut Emitter<'_>| {
                let at = e.add(&start.input, k);
                let a = read.load(e, input, &at, input_dtype);
                vec![read.fma(e, &a, &w, sum)]
            };
            next.push(match &start.real {
                Some(real) => e.if_else(real, &[register.as_str()], product, |_| vec![sum.clone()]).remove(0),
                None => product(e).remove(0),
            });
            previous = Some(w);
        }
        next
    });
    sums.into_iter().map(|sum| read.total(e, sum)).collect()
}
