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
//! Where every row reads the same `W` row (a linear layer: `w` reads none
//! of the row axes), an item takes [`ROWS`] rows, so `W` is read once for
//! all of them (a decode step of eight sequences reads each weight once);
//! where a row picks its own (an expert gathered per row), one. A row past
//! the last is skipped by the whole warp.
//!
//! Each lane sums its share in f32 with fused multiply-adds (in
//! [`RUN`]-wide vectors, their elements added in order at the end), the
//! lanes' sums in a fixed tree: the contract's reordered f32 sum. The runs
//! are used where the depth is a constant multiple of [`RUN`] (rows start
//! aligned); elsewhere each lane reads every 32nd element.

use super::emit::{register, stored, Combine, Emitter, Form, Kernel, Unsupported, LANES};
use crate::ir::contraction::{reads_index, Contraction};
use crate::ir::{Entry, Value};
use crate::sema::dim::Dim;
use crate::sema::ty::Dtype;

/// Rows an item takes when they share their `W` row; lane `r` stores row
/// `r`, so no more than a warp's lanes.
const ROWS: usize = 8;
const _: () = assert!(ROWS <= LANES as usize);

/// Consecutive elements a lane reads at once.
const RUN: i64 = 8;

/// One operand's row in an item: where it starts (an index) in its value.
struct Row {
    input: String,
    weight: String,
    /// Whether it is one of the node's rows (an `i1`), for every row of an
    /// item but its first, which always is.
    real: Option<String>,
}

/// The kernel of contraction node `at` of `entry`.
pub fn contraction_kernel(entry: &Entry, at: usize, form: Form, contraction: &Contraction<'_>) -> Result<Kernel, Unsupported> {
    let node = &entry.nodes[at];
    let (leading, columns) = node.shape.split_at(node.shape.len() - 1);
    let columns = &columns[0];
    let column_axis = leading.len() as u32;
    let shared = !contraction.weight.rows.iter().any(|position| (0..column_axis).any(|axis| reads_index(position, axis)));
    let rows_per_item = if shared { ROWS } else { 1 };
    let row_count = leading.iter().fold(Dim::constant(1), |count, dim| count.mul(dim));
    let blocks = row_count.add(&Dim::constant(rows_per_item as i64 - 1)).div(&Dim::constant(rows_per_item as i64));
    let read = if contraction.depth.as_constant().is_some_and(|depth| depth % RUN == 0) { Read::Runs } else { Read::Elements };

    let mut e = Emitter::new(entry, form);
    let (input, weight) = (contraction.input.value, contraction.weight.value);
    let (input_argument, weight_argument) = (e.argument(input), e.argument(weight));
    let leading_sizes: Vec<String> = leading.iter().map(|dim| e.dim_index(dim)).collect();
    let leading_sizes: Vec<&str> = leading_sizes.iter().map(String::as_str).collect();
    let (rows, columns_size, depth) = (e.dim_index(&row_count), e.dim_index(columns), e.dim_index(contraction.depth));
    let per_item = e.index_constant(rows_per_item as i64);
    let mut failed = None;
    e.parallel_in_lanes(
        &[blocks, columns.clone()],
        &vec![Combine::Add; rows_per_item],
        |e, item, lane| {
            let (column, first) = item_position(e, item, &columns_size, &per_item);
            let mut starts: Vec<Row> = Vec::with_capacity(rows_per_item);
            for r in 0..rows_per_item {
                let (row, inside) = row_number(e, &first, r, &rows);
                let real = (r > 0).then_some(inside);
                let axes = e.split(&row, &leading_sizes);
                e.indices = axes.into_iter().enumerate().map(|(axis, name)| (axis as u32, name)).collect();
                e.indices.insert(column_axis, column.clone());
                e.extents = node.shape.iter().enumerate().map(|(axis, dim)| (axis as u32, dim.clone())).collect();
                let input_row = e.position(input, contraction.input.rows);
                let weight_start = match starts.first() {
                    Some(first) if shared => Ok(first.weight.clone()),
                    _ => e.position(weight, contraction.weight.rows).map(|weight_row| {
                        let scaled = e.mul(&weight_row, &columns_size);
                        let weight_row = e.add(&scaled, &column);
                        e.mul(&weight_row, &depth)
                    }),
                };
                match (input_row, weight_start) {
                    (Ok(input_row), Ok(weight)) => starts.push(Row { input: e.mul(&input_row, &depth), weight, real }),
                    (Err(why), _) | (_, Err(why)) => {
                        failed = Some(why);
                        let zero = e.index_constant(0);
                        starts.push(Row { input: zero.clone(), weight: zero, real });
                    }
                }
            }
            let operands = Operands { input: (input_argument.as_str(), dtype_of(e, input)), weight: (weight_argument.as_str(), dtype_of(e, weight)) };
            lane_sums(e, read, lane, &depth, &starts, &operands)
        },
        |e, item, lane, totals| {
            // Lane `r` stores row `r`'s total (an item has no more rows
            // than a warp has lanes).
            let (column, first) = item_position(e, item, &columns_size, &per_item);
            for (r, total) in totals.iter().enumerate() {
                let offset = e.index_constant(r as i64);
                let row = e.add(&first, &offset);
                let inside = e.op(format!("arith.cmpi ult, {row}, {rows} : index"));
                let storing = e.op(format!("arith.cmpi eq, {lane}, {offset} : index"));
                let storing = e.op(format!("arith.andi {storing}, {inside} : i1"));
                e.when(&storing, |e| {
                    let scaled = e.mul(&row, &columns_size);
                    let at = e.add(&scaled, &column);
                    e.store_element(total.clone(), "%out", &at, node.dtype);
                });
            }
        },
    );
    match failed {
        Some(why) => Err(why),
        None => Ok(e.finish(at, node.dtype)),
    }
}

/// Item `item`'s output column and first row (indices), from the number
/// of columns and the rows an item takes.
fn item_position(e: &mut Emitter<'_>, item: &str, columns: &str, per_item: &str) -> (String, String) {
    let column = e.op(format!("arith.remui {item}, {columns} : index"));
    let block = e.op(format!("arith.divui {item}, {columns} : index"));
    (column, e.mul(&block, per_item))
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
/// elements (from element `RUN * lane`, every `RUN * LANES`th), or single
/// elements (from element `lane`, every `LANES`th).
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
    fn load(self, e: &mut Emitter<'_>, argument: &str, at: &str, dtype: Dtype) -> String {
        if let Read::Elements = self {
            return e.load_element(argument, at, dtype);
        }
        let element = stored(dtype);
        let alignment = match e.form() {
            Form::Device => format!(" {{alignment = {}}}", RUN as usize * dtype.bytes()),
            Form::Host => String::new(),
        };
        let run = e.op(format!("vector.load {argument}[{at}]{alignment} : memref<?x{element}>, vector<{RUN}x{element}>"));
        match register(dtype) {
            "f32" if element != "f32" => e.op(format!("arith.extf {run} : vector<{RUN}x{element}> to vector<{RUN}xf32>")),
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
fn lane_sums(e: &mut Emitter<'_>, read: Read, lane: &str, depth: &str, starts: &[Row], operands: &Operands<'_>) -> Vec<String> {
    let width = e.index_constant(read.width());
    let from = e.mul(lane, &width);
    let step = e.index_constant(read.width() * i64::from(LANES));
    let zero = e.op(read.zero());
    let register = read.register();
    let carried: Vec<(String, &str)> = starts.iter().map(|_| (zero.clone(), register.as_str())).collect();
    let sums = e.for_steps(&from, depth, &step, &carried, |e, k, sums| {
        let ((input, input_dtype), (weight, weight_dtype)) = (operands.input, operands.weight);
        let mut weights: Option<(&str, String)> = None;
        let mut next = Vec::with_capacity(starts.len());
        for (start, sum) in starts.iter().zip(sums) {
            let w = match weights.take() {
                Some((read_from, w)) if read_from == start.weight => w,
                _ => {
                    let at = e.add(&start.weight, k);
                    read.load(e, weight, &at, weight_dtype)
                }
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
            weights = Some((&start.weight, w));
        }
        next
    });
    sums.into_iter().map(|sum| read.total(e, sum)).collect()
}
