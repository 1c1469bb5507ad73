//! The text of MLIR kernels, one SSA value at a time: the emitter every
//! GPU kernel is written with (the `Compute` nodes' in `kernel`, the
//! intrinsics' in `intrinsic`), and the calling convention they share.
//! Every value is a flat `memref<?xT>` in its own element type (bool as
//! `i8`); the output comes first, then the values read, then the node's
//! scratch if it has one ([`Scratch`]), then the entry's dims as a
//! `memref<?xi64>` table (in the order [`Kernel::dims`] lists them) and a
//! `memref<9xi64>` of faults ([`Fault`], [`FAULT_SLOTS`]). In registers
//! floats are f32 and integers i64.
//!
//! A node's work may take several kernels, launched in order with the
//! same arguments (its stages: one orders an expert product's rows, the
//! next computes them in that order); what one stage leaves for the next
//! is in the node's scratch.
//!
//! A kernel is independent work items (their count the product of
//! [`Kernel::work`]) with sequential code in each, written once and
//! wrapped in one of two [`Form`]s: for the host, a `func.func` whose
//! items are an `scf.parallel` (MLIR runs it on the CPU); for the device,
//! a `gpu.func` kernel with one thread per item, [`THREADS`] to a block,
//! that computes everything (sizes included) from its arguments, so a
//! launch needs only them and the item count. An item may instead be
//! split across a warp's [`WARP_LANES`] ([`Emitter::parallel_in_lanes`]): each
//! lane reduces its share, and the lanes' shares are combined in one
//! fixed tree, by shuffles on the device and by the same operations in
//! order on the host, so both forms compute the same bits.

use linnet_ir::bounds::Ranges;
use linnet_ir::dim::Dim;
use linnet_ir::quant::BlockFormat;
use linnet_ir::Dtype;
use linnet_ir::{Entry, NodeKind, Param, Scalar, Value};
use std::collections::HashMap;

/// An entry as its kernels are written from it: with its model's
/// parameters, whose storage says how a parameter's elements are read (a
/// quantized one's blocks are a `memref<?xi8>`, decoded where they are
/// read: `dequant`). It reads as the entry.
#[derive(Clone, Copy)]
pub struct ModelEntry<'m> {
    pub entry: &'m Entry,
    pub params: &'m [Param],
}

impl ModelEntry<'_> {
    /// The block format `value` is stored in, if it is a quantized
    /// parameter.
    pub fn blocks(&self, value: Value) -> Option<BlockFormat> {
        match self.entry.nodes[value.index()].kind {
            NodeKind::Param(at) => self.params[at].storage,
            _ => None,
        }
    }
}

impl std::ops::Deref for ModelEntry<'_> {
    type Target = Entry;

    fn deref(&self) -> &Entry {
        self.entry
    }
}

/// A node's kernel: its MLIR function and what it is called with.
pub struct Kernel {
    /// The node it computes.
    pub node: usize,
    /// Its place among its node's kernels, in launch order (0 for a node
    /// of one kernel).
    pub stage: usize,
    /// `ENTRY_vNODE`.
    pub name: String,
    pub text: String,
    /// The values it reads, in argument order after the output.
    pub loads: Vec<Value>,
    /// The non-constant dims, in the order of the dims table.
    pub dims: Vec<Dim>,
    /// The work items: as many as the product of these dims.
    pub work: Vec<Dim>,
    /// The threads each item takes: 1, or [`WARP_LANES`].
    pub lanes: u32,
    /// Whether it can raise a fault (else its faults table is not read).
    pub faults: bool,
    /// The axes its loads check, numbered as a fault names them.
    pub checks: Vec<Check>,
    /// The scratch its node's kernels share, if they need one.
    pub scratch: Option<Scratch>,
    /// The same body as the code of one unit (an item on the host, a
    /// thread on the device) whose number is given: what a launch group
    /// runs for its units of this kernel.
    pub member: Member,
}

/// A kernel's body as the code of one unit, whose number (an index) is
/// `unit`, defined before it; the body names its arguments as the kernel
/// does (`%out`, `%inK`, `%dims`, `%error`).
pub struct Member {
    pub unit: String,
    pub body: String,
}

/// Device memory a node's kernels share while the node runs (given to
/// each after its loads, as `%scratch`): `elements` of `dtype`, whose
/// contents no kernel may expect before a stage of the same node wrote
/// them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Scratch {
    pub dtype: Dtype,
    pub elements: Dim,
}

/// An axis a kernel checks its loads' positions against: a position
/// outside it is reported with these, as the CPU backend reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Check {
    pub value: Value,
    pub axis: usize,
    /// The value the position reads directly, if any (an input holding a
    /// position or a token id).
    pub source: Option<Value>,
}

/// Where a kernel runs: the same body, wrapped for MLIR's host lowering or
/// as a GPU kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    Host,
    Device,
}

/// Threads in a block of a device kernel.
pub const THREADS: u32 = 256;

/// The lanes of a work item split across a warp
/// ([`Emitter::parallel_in_lanes`]): a warp's threads.
pub const WARP_LANES: u32 = 32;

/// A work item's warp ([`Emitter::parallel_in_warps`]): on the device,
/// this thread's lane (an index); on the host, none (every lane at once).
pub struct Warp {
    lane: Option<String>,
}

/// Where a kernel's body makes its unit's number (an `scf.parallel` on the
/// host, the thread's number on the device), so that the same body can
/// also be written as the code of one unit whose number is given
/// ([`Kernel::member`]).
struct Opening {
    /// The unit's SSA name.
    unit: String,
    /// How many units there are (an index), on the host.
    count: String,
    /// The bytes of the body that make the unit.
    lines: std::ops::Range<usize>,
    /// The bytes of the `scf.reduce` that closes the host's loop.
    reduce: Option<std::ops::Range<usize>>,
}

impl Opening {
    /// `body` as the code of one unit: the loop (host) or the thread's
    /// number (device) left out, and on the host a guard in its place.
    fn member_body(&self, body: &str) -> String {
        let guard = match self.reduce {
            Some(_) => {
                format!("    %inside = arith.cmpi ult, {}, {} : index\n    scf.if %inside {{\n", self.unit, self.count)
            }
            None => String::new(),
        };
        let rest = match &self.reduce {
            Some(reduce) => format!("{}{}", &body[self.lines.end..reduce.start], &body[reduce.end..]),
            None => body[self.lines.end..].to_string(),
        };
        format!("{}{guard}{rest}", &body[..self.lines.start])
    }
}

/// How two lanes' values combine ([`Emitter::combine_lanes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Combine {
    Add,
    Max,
    Min,
}

impl Combine {
    fn op(self) -> &'static str {
        match self {
            Combine::Add => "arith.addf",
            Combine::Max => "arith.maxnumf",
            Combine::Min => "arith.minnumf",
        }
    }
}

/// Why a node has no kernel for this target yet.
#[derive(Debug)]
pub struct Unsupported(pub String);

/// The faults table's length: the flags of [`Fault`], then the detail of
/// the fault raised (slot 3: a cache write's offending request, slot 4:
/// the rows it may name; slots 5, 6, 7: the [`Check`] a load failed, its
/// position and the axis' size), then the kernel that raised it (slot 8,
/// [`owner`]). One table serves a whole call: the first kernel that
/// raises a fault owns it, and no other kernel writes it after, so that
/// it is read once, when the call ends, and names the node the call
/// failed at, as the CPU backend stops at it. Within the owner, a kind's
/// first fault keeps its details, as the CPU backend reports the first;
/// where items fault at once, they are one item's.
pub const FAULT_SLOTS: usize = 9;

/// Slots of the faults table past the flags.
pub const REQUEST_SLOT: usize = 3;
pub const CHECK_SLOT: usize = 5;
pub const OWNER_SLOT: usize = 8;

/// The most kernels a node is.
const MAX_STAGES: usize = 8;

/// How the faults table names the kernel that raised its faults: stage
/// `stage` of node `node`, never 0 (no fault).
pub fn owner(node: usize, stage: usize) -> i64 {
    (node * MAX_STAGES + stage + 1) as i64
}

/// The node and stage an owner in the faults table names, if it names one.
#[cfg(any(feature = "nvptx", feature = "cuda"))]
pub fn owned_by(owner: i64) -> Option<(usize, usize)> {
    let number = usize::try_from(owner).ok()?.checked_sub(1)?;
    Some((number / MAX_STAGES, number % MAX_STAGES))
}

/// What a kernel reports in its faults table: the slot it sets to 1, with
/// its details past the flags ([`FAULT_SLOTS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// A load's position outside its axis (the element read is 0).
    PositionOutsideAxis = 0,
    /// A cache write's position or span outside the cache (nothing written).
    OutsideCache = 1,
    /// `write_slots`: a row named by slots whose requests sum past `x`.
    RequestOutsideX = 2,
}

impl Fault {
    /// The faults table's slot where this fault's details begin.
    fn details_slot(self) -> usize {
        match self {
            Fault::PositionOutsideAxis => CHECK_SLOT,
            Fault::OutsideCache | Fault::RequestOutsideX => REQUEST_SLOT,
        }
    }
}

/// The storage type of a dtype in memory.
pub fn stored(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Bf16 => "bf16",
        Dtype::F16 => "f16",
        Dtype::F32 => "f32",
        Dtype::I32 => "i32",
        Dtype::I64 => "i64",
        Dtype::Bool => "i8",
    }
}

/// The register type of a dtype.
pub fn register(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Bf16 | Dtype::F16 | Dtype::F32 => "f32",
        Dtype::I32 | Dtype::I64 => "i64",
        Dtype::Bool => "i1",
    }
}

/// Emits the body of one kernel, one SSA value at a time.
pub struct Emitter<'e> {
    pub entry: ModelEntry<'e>,
    /// The node this kernel computes and its place among the node's
    /// kernels.
    node: usize,
    stage: usize,
    form: Form,
    work: Vec<Dim>,
    lanes: u32,
    body: String,
    next: usize,
    pub loads: Vec<Value>,
    dims: Vec<Dim>,
    /// The SSA names (of type `index`) of the node's axes and of the
    /// reduction indices in scope, by index number (`Compute` nodes).
    pub indices: HashMap<u32, String>,
    /// The dim each of those indices runs over.
    pub extents: HashMap<u32, Dim>,
    /// Narrower ranges some indices lie in where the code being written
    /// is in a select's branch (`ir::bounds::branch_ranges`): an `scf.if`
    /// runs only the branch its condition picks.
    pub ranges: Ranges,
    /// Subexpressions already computed (a row's shared reductions and
    /// invariant parts), by address in the node's expression: their SSA
    /// names.
    pub hoisted: HashMap<*const Scalar, String>,
    faults: bool,
    checks: Vec<Check>,
    scratch: Option<Scratch>,
    opening: Option<Opening>,
}

impl<'e> Emitter<'e> {
    /// The emitter of stage `stage` (its place in launch order) of node
    /// `node`'s kernels.
    pub fn new(entry: ModelEntry<'e>, node: usize, stage: usize, form: Form) -> Emitter<'e> {
        assert!(stage < MAX_STAGES, "a node is at most {MAX_STAGES} kernels");
        Emitter {
            entry,
            node,
            stage,
            form,
            work: Vec::new(),
            lanes: 1,
            body: String::new(),
            next: 0,
            loads: Vec::new(),
            dims: Vec::new(),
            indices: HashMap::new(),
            extents: HashMap::new(),
            ranges: Ranges::new(),
            hoisted: HashMap::new(),
            faults: false,
            checks: Vec::new(),
            scratch: None,
            opening: None,
        }
    }

    /// The emitter with `dims` as the first entries of its dims table (a
    /// launch group's, whose members read the table as theirs).
    pub fn with_dims(self, dims: Vec<Dim>) -> Emitter<'e> {
        Emitter { dims, ..self }
    }

    /// The node's scratch, `scratch`, as an argument of this kernel: its
    /// name (a `memref<?xT>`).
    pub fn scratch(&mut self, scratch: Scratch) -> &'static str {
        assert!(self.scratch.as_ref().is_none_or(|known| *known == scratch), "a node's kernels share one scratch");
        self.scratch = Some(scratch);
        "%scratch"
    }

    pub fn form(&self) -> Form {
        self.form
    }

    pub fn fresh(&mut self) -> String {
        self.next += 1;
        format!("%t{}", self.next)
    }

    pub fn line(&mut self, text: String) {
        self.body.push_str("    ");
        self.body.push_str(&text);
        self.body.push('\n');
    }

    /// Lines written elsewhere (indented, each ending its line), as they are.
    pub fn lines(&mut self, text: &str) {
        self.body.push_str(text);
    }

    /// `name = op`; returns the name.
    pub fn op(&mut self, text: String) -> String {
        let name = self.fresh();
        self.line(format!("{name} = {text}"));
        name
    }

    pub fn index_constant(&mut self, value: i64) -> String {
        self.op(format!("arith.constant {value} : index"))
    }

    /// A dim's value as `i64`: a constant, or its slot in the dims table.
    pub fn dim(&mut self, dim: &Dim) -> String {
        if let Some(value) = dim.as_constant() {
            return self.op(format!("arith.constant {value} : i64"));
        }
        let slot = match self.dims.iter().position(|known| known == dim) {
            Some(slot) => slot,
            None => {
                self.dims.push(dim.clone());
                self.dims.len() - 1
            }
        };
        let at = self.index_constant(slot as i64);
        self.op(format!("memref.load %dims[{at}] : memref<?xi64>"))
    }

    pub fn argument(&mut self, value: Value) -> String {
        let at = match self.loads.iter().position(|known| *known == value) {
            Some(at) => at,
            None => {
                self.loads.push(value);
                self.loads.len() - 1
            }
        };
        format!("%in{at}")
    }

    /// Rounds an f32 register to `dtype`'s precision where it has less.
    pub fn rounded(&mut self, value: String, dtype: Dtype) -> String {
        match dtype {
            Dtype::Bf16 | Dtype::F16 => {
                let narrow = self.op(format!("arith.truncf {value} : f32 to {}", stored(dtype)));
                self.op(format!("arith.extf {narrow} : {} to f32", stored(dtype)))
            }
            _ => value,
        }
    }

    /// An i64 register wrapped to `dtype`'s width.
    pub fn wrapped(&mut self, value: String, dtype: Dtype) -> String {
        if dtype == Dtype::I32 {
            let narrow = self.op(format!("arith.trunci {value} : i64 to i32"));
            self.op(format!("arith.extsi {narrow} : i32 to i64"))
        } else {
            value
        }
    }

    /// `|a|` of an i64 (wrapping at the most negative, as Rust's).
    pub fn magnitude(&mut self, a: String) -> String {
        let zero = self.op("arith.constant 0 : i64".into());
        let negative = self.op(format!("arith.cmpi slt, {a}, {zero} : i64"));
        let negated = self.op(format!("arith.subi {zero}, {a} : i64"));
        self.op(format!("arith.select {negative}, {negated}, {a} : i64"))
    }

    /// A stored element as a register.
    pub fn widened(&mut self, element: String, dtype: Dtype) -> String {
        match dtype {
            Dtype::Bf16 | Dtype::F16 => self.op(format!("arith.extf {element} : {} to f32", stored(dtype))),
            Dtype::F32 => element,
            Dtype::I32 => self.op(format!("arith.extsi {element} : i32 to i64")),
            Dtype::I64 => element,
            Dtype::Bool => {
                let zero = self.op("arith.constant 0 : i8".into());
                self.op(format!("arith.cmpi ne, {element}, {zero} : i8"))
            }
        }
    }

    /// A register as stored.
    pub fn narrowed(&mut self, value: String, dtype: Dtype) -> String {
        match dtype {
            Dtype::Bf16 | Dtype::F16 => self.op(format!("arith.truncf {value} : f32 to {}", stored(dtype))),
            Dtype::F32 | Dtype::I64 => value,
            Dtype::I32 => self.op(format!("arith.trunci {value} : i64 to i32")),
            Dtype::Bool => self.op(format!("arith.extui {value} : i1 to i8")),
        }
    }

    /// `!a` of an `i1`.
    pub fn not(&mut self, a: &str) -> String {
        let yes = self.op("arith.constant true".into());
        self.op(format!("arith.xori {a}, {yes} : i1"))
    }

    /// Whether i64 `position` is in `0..size` (`size` an i64).
    pub fn inside(&mut self, position: &str, size: &str) -> String {
        let zero = self.op("arith.constant 0 : i64".into());
        let above = self.op(format!("arith.cmpi sge, {position}, {zero} : i64"));
        let below = self.op(format!("arith.cmpi slt, {position}, {size} : i64"));
        self.op(format!("arith.andi {above}, {below} : i1"))
    }

    /// A dim's value as an `index`.
    pub fn dim_index(&mut self, dim: &Dim) -> String {
        let value = self.dim(dim);
        self.op(format!("arith.index_cast {value} : i64 to index"))
    }

    /// `a * b` or `a + b` on indices.
    pub fn mul(&mut self, a: &str, b: &str) -> String {
        self.op(format!("arith.muli {a}, {b} : index"))
    }

    pub fn add(&mut self, a: &str, b: &str) -> String {
        self.op(format!("arith.addi {a}, {b} : index"))
    }

    /// The flat position of `positions` (indices) in a row-major array of
    /// `sizes` (indices).
    pub fn flat(&mut self, positions: &[&str], sizes: &[&str]) -> String {
        let mut flat = self.index_constant(0);
        for (position, size) in positions.iter().zip(sizes) {
            let scaled = self.mul(&flat, size);
            flat = self.add(&scaled, position);
        }
        flat
    }

    /// Splits flat `item` (an index below the product of `sizes`) into its
    /// positions along `sizes` (row-major).
    pub fn split(&mut self, item: &str, sizes: &[&str]) -> Vec<String> {
        let mut rest = item.to_string();
        let mut positions = vec![String::new(); sizes.len()];
        for (axis, size) in sizes.iter().enumerate().rev() {
            if axis == 0 {
                positions[0] = rest.clone();
                break;
            }
            positions[axis] = self.op(format!("arith.remui {rest}, {size} : index"));
            rest = self.op(format!("arith.divui {rest}, {size} : index"));
        }
        positions
    }

    /// Binds the node's axes for the code that follows: the first
    /// `sizes.len()` are `flat` (an index) split along `sizes`
    /// ([`Emitter::split`]), and each runs over its dim of `shape`.
    pub fn bind_axes(&mut self, flat: &str, sizes: &[&str], shape: &[Dim]) {
        let axes = self.split(flat, sizes);
        self.indices = axes.into_iter().enumerate().map(|(axis, name)| (axis as u32, name)).collect();
        self.extents = shape.iter().enumerate().map(|(axis, dim)| (axis as u32, dim.clone())).collect();
    }

    /// Element `at` (an index) of `argument`, a `memref<?xT>` of `dtype`,
    /// as a register.
    /// A quantized parameter's element is decoded from its blocks.
    pub fn load_element(&mut self, argument: &str, at: &str, dtype: Dtype) -> String {
        if let Some(format) = self.blocks_of(argument) {
            return self.decoded(argument, at, format, 1);
        }
        let element = self.op(format!("memref.load {argument}[{at}] : memref<?x{}>", stored(dtype)));
        self.widened(element, dtype)
    }

    /// The block format of `argument` (`%inK`), if it is a quantized
    /// parameter.
    pub fn blocks_of(&self, argument: &str) -> Option<BlockFormat> {
        let load = argument.strip_prefix("%in")?.parse::<usize>().ok()?;
        self.entry.blocks(*self.loads.get(load)?)
    }

    /// Stores register `value` as element `at` of `argument` (of `dtype`).
    pub fn store_element(&mut self, value: String, argument: &str, at: &str, dtype: Dtype) {
        let value = if dtype.is_float() { self.rounded(value, dtype) } else { value };
        let value = self.narrowed(value, dtype);
        self.line(format!("memref.store {value}, {argument}[{at}] : memref<?x{}>", stored(dtype)));
    }

    /// Sets `fault`'s slot of the faults table, with `details` (i64 SSA
    /// names) in its detail slots if it is the first of its kind, unless
    /// another kernel of the call owns the table ([`FAULT_SLOTS`]).
    pub fn fault(&mut self, fault: Fault, details: &[&str]) {
        self.faults = true;
        let me = self.op(format!("arith.constant {} : i64", owner(self.node, self.stage)));
        let owner_slot = self.index_constant(OWNER_SLOT as i64);
        let owner = self.op(format!("memref.load %error[{owner_slot}] : memref<{FAULT_SLOTS}xi64>"));
        let zero = self.op("arith.constant 0 : i64".into());
        let free = self.op(format!("arith.cmpi eq, {owner}, {zero} : i64"));
        let mine = self.op(format!("arith.cmpi eq, {owner}, {me} : i64"));
        let writes = self.op(format!("arith.ori {free}, {mine} : i1"));
        self.when(&writes, |e| {
            let slot = e.index_constant(fault as i64);
            if !details.is_empty() {
                let raised = e.op(format!("memref.load %error[{slot}] : memref<{FAULT_SLOTS}xi64>"));
                let first = e.op(format!("arith.cmpi eq, {raised}, {zero} : i64"));
                e.when(&first, |e| {
                    for (at, detail) in details.iter().enumerate() {
                        let slot = e.index_constant((fault.details_slot() + at) as i64);
                        e.line(format!("memref.store {detail}, %error[{slot}] : memref<{FAULT_SLOTS}xi64>"));
                    }
                });
            }
            let flag = e.op("arith.constant 1 : i64".into());
            e.line(format!("memref.store {flag}, %error[{slot}] : memref<{FAULT_SLOTS}xi64>"));
            e.line(format!("memref.store {me}, %error[{owner_slot}] : memref<{FAULT_SLOTS}xi64>"));
        });
    }

    /// `then` only while no kernel of the call has raised a fault: a cache
    /// write after the node a call fails at writes nothing, as on the CPU
    /// backend, which stops there.
    pub fn unless_faulted(&mut self, then: impl FnOnce(&mut Self)) {
        let owner_slot = self.index_constant(OWNER_SLOT as i64);
        let owner = self.op(format!("memref.load %error[{owner_slot}] : memref<{FAULT_SLOTS}xi64>"));
        let zero = self.op("arith.constant 0 : i64".into());
        let clear = self.op(format!("arith.cmpi eq, {owner}, {zero} : i64"));
        self.when(&clear, then);
    }

    /// Raises [`Fault::PositionOutsideAxis`] for `check`, with the
    /// position and the axis' size (i64 SSA names).
    pub fn fault_outside_axis(&mut self, check: Check, position: &str, size: &str) {
        let number = self.op(format!("arith.constant {} : i64", self.checks.len()));
        self.checks.push(check);
        self.fault(Fault::PositionOutsideAxis, &[&number, position, size]);
    }

    /// The number of work items, the product of `work` (an index).
    fn item_count(&mut self, work: &[Dim]) -> String {
        self.work = work.to_vec();
        let mut count = self.index_constant(1);
        for dim in work {
            let size = self.dim_index(dim);
            count = self.mul(&count, &size);
        }
        count
    }

    /// This device thread's number in the launch (an index).
    fn thread_number(&mut self) -> String {
        let block = self.op("gpu.block_id x".into());
        let threads = self.index_constant(i64::from(THREADS));
        let thread = self.op("gpu.thread_id x".into());
        let first = self.mul(&block, &threads);
        self.add(&first, &thread)
    }

    /// The kernel's work items, as many as the product of `work`; `body`
    /// is given the item's number (an index). On the host, an
    /// `scf.parallel`; on the device, this thread's item, if it is one.
    pub fn parallel(&mut self, work: &[Dim], body: impl FnOnce(&mut Self, &str)) {
        let count = self.item_count(work);
        let element = self.open_units(&count);
        if self.form == Form::Device {
            let mine = self.op(format!("arith.cmpi ult, {element}, {count} : index"));
            self.line(format!("scf.if {mine} {{"));
        }
        body(self, &element);
        self.close_units();
    }

    /// Opens the kernel's units, as many as `count` (an index) on the
    /// host: there an `scf.parallel` over them (closed by
    /// [`Emitter::close_units`]); on the device this thread's number (the
    /// caller guards it). Gives the unit's name, and records where it was
    /// made ([`Opening`]).
    fn open_units(&mut self, count: &str) -> String {
        assert!(self.opening.is_none(), "a kernel opens its units once");
        let (zero, one) = match self.form {
            Form::Host => (self.index_constant(0), self.index_constant(1)),
            Form::Device => Default::default(),
        };
        let start = self.body.len();
        let unit = match self.form {
            Form::Host => {
                let unit = self.fresh();
                self.line(format!("scf.parallel ({unit}) = ({zero}) to ({count}) step ({one}) {{"));
                unit
            }
            Form::Device => self.thread_number(),
        };
        self.opening =
            Some(Opening { unit: unit.clone(), count: count.to_string(), lines: start..self.body.len(), reduce: None });
        unit
    }

    /// Closes what [`Emitter::open_units`] and its caller's guard opened.
    fn close_units(&mut self) {
        if self.form == Form::Host {
            let start = self.body.len();
            self.line("scf.reduce".into());
            let reduce = start..self.body.len();
            self.opening.as_mut().expect("units are opened before they close").reduce = Some(reduce);
        }
        self.line("}".into());
    }

    /// The kernel's work items, as many as the product of `work`, each
    /// split across [`WARP_LANES`] lanes. `lane_body` is given the item and the
    /// lane (indices) and gives that lane's share of each of the item's
    /// f32 reductions (`combines`: how two shares combine); the shares are
    /// combined across the lanes ([`Emitter::combine_lanes`]). Then
    /// `finish` is given the item, each lane in turn and the totals.
    pub fn parallel_in_lanes(
        &mut self,
        work: &[Dim],
        combines: &[Combine],
        lane_body: impl FnOnce(&mut Self, &str, &str) -> Vec<String>,
        finish: impl FnOnce(&mut Self, &str, &str, &[String]),
    ) {
        self.parallel_in_warps(work, |e, item, warp| {
            let shares = e.in_lanes(warp, &[], combines.len(), |e, lane, _| lane_body(e, item, lane));
            let totals: Vec<String> = shares
                .iter()
                .zip(combines)
                .flat_map(|(shares, combine)| e.combine_lanes(std::slice::from_ref(shares), *combine))
                .collect();
            e.in_lanes(warp, &[], 0, |e, lane, _| {
                finish(e, item, lane, &totals);
                Vec::new()
            });
        });
    }

    /// The kernel's work items, as many as the product of `work`, each a
    /// warp's: `body` is given the item (an index) and the [`Warp`], whose
    /// lanes run code with [`Emitter::in_lanes`] and exchange values with
    /// [`Emitter::combine_lanes`]. Values outside `in_lanes` are the same
    /// in every lane.
    ///
    /// On the device the lanes are a warp's threads; on the host they are
    /// the elements of vectors ([`Emitter::lane_type`]), and a lane's code
    /// runs for each in turn.
    pub fn parallel_in_warps(&mut self, work: &[Dim], body: impl FnOnce(&mut Self, &str, &Warp)) {
        self.lanes = WARP_LANES;
        let count = self.item_count(work);
        let unit = self.open_units(&count);
        match self.form {
            Form::Host => body(self, &unit, &Warp { lane: None }),
            Form::Device => {
                let lanes = self.index_constant(i64::from(WARP_LANES));
                let item = self.op(format!("arith.divui {unit}, {lanes} : index"));
                let lane = self.op(format!("arith.remui {unit}, {lanes} : index"));
                // Uniform across a warp: its lanes share the item.
                let mine = self.op(format!("arith.cmpi ult, {item}, {count} : index"));
                self.line(format!("scf.if {mine} {{"));
                body(self, &item, &Warp { lane: Some(lane) });
            }
        }
        self.close_units();
    }

    /// The type of an f32 each lane holds its own of.
    pub fn lane_type(&self) -> String {
        match self.form {
            Form::Host => format!("vector<{WARP_LANES}xf32>"),
            Form::Device => "f32".into(),
        }
    }

    /// 0.0 in every lane.
    pub fn lanes_zero(&mut self) -> String {
        let ty = self.lane_type();
        match self.form {
            Form::Host => self.op(format!("arith.constant dense<0.0> : {ty}")),
            Form::Device => self.op("arith.constant 0.0 : f32".into()),
        }
    }

    /// `body` in every lane of `warp`: given the lane (an index) and the
    /// lane's own of each of `inputs` (values of [`Emitter::lane_type`]),
    /// it gives the lane's `outputs` f32s, which come back as values of
    /// that type.
    pub fn in_lanes(
        &mut self,
        warp: &Warp,
        inputs: &[String],
        outputs: usize,
        body: impl FnOnce(&mut Self, &str, &[String]) -> Vec<String>,
    ) -> Vec<String> {
        let Some(lane) = &warp.lane else {
            let ty = self.lane_type();
            let (zero, lanes) = (self.index_constant(0), self.index_constant(i64::from(WARP_LANES)));
            let zeros = self.lanes_zero();
            let carried: Vec<(String, &str)> = (0..outputs).map(|_| (zeros.clone(), ty.as_str())).collect();
            return self.for_range(&zero, &lanes, &carried, |e, lane, so_far| {
                let mine: Vec<String> = inputs
                    .iter()
                    .map(|input| e.op(format!("vector.extract {input}[{lane}] : f32 from {ty}")))
                    .collect();
                let values = body(e, lane, &mine);
                assert_eq!(values.len(), outputs, "a lane gives every output");
                values
                    .iter()
                    .zip(so_far)
                    .map(|(value, so_far)| e.op(format!("vector.insert {value}, {so_far}[{lane}] : f32 into {ty}")))
                    .collect()
            });
        };
        let values = body(self, lane, inputs);
        assert_eq!(values.len(), outputs, "a lane gives every output");
        values
    }

    /// The lanes' values of each of `values` (of [`Emitter::lane_type`])
    /// combined in a fixed tree (lane `l` with lane `l + 16`, then with
    /// `l + 8`, … `l + 1`): for each, the same f32 in every lane. The
    /// trees' steps are interleaved, so that they overlap on the device.
    ///
    /// On the device the tree is the warp's butterfly of `gpu.shuffle
    /// xor`: lanes `l` and `l ^ o` combine the same two values (in either
    /// order: the same bits), so every lane ends with lane 0's total. On
    /// the host the same combinations fold the vector's halves, in the
    /// same order: the two forms compute the same bits.
    pub fn combine_lanes(&mut self, values: &[String], combine: Combine) -> Vec<String> {
        let halves = std::iter::successors(Some(WARP_LANES / 2), |half| (*half > 1).then_some(half / 2));
        let mut values = values.to_vec();
        let width = (self.form == Form::Device).then(|| self.op(format!("arith.constant {WARP_LANES} : i32")));
        for half in halves {
            let offset = width.as_ref().map(|_| self.op(format!("arith.constant {half} : i32")));
            for value in &mut values {
                *value = match (&width, &offset) {
                    (Some(width), Some(offset)) => {
                        let theirs = self.shuffle("xor", value, offset, width);
                        self.op(format!("{} {value}, {theirs} : f32", combine.op()))
                    }
                    _ => {
                        let whole = format!("vector<{}xf32>", 2 * half);
                        let slice = |e: &mut Self, from: u32| {
                            let lanes: Vec<String> = (from..from + half).map(|lane| lane.to_string()).collect();
                            e.op(format!("vector.shuffle {value}, {value} [{}] : {whole}, {whole}", lanes.join(", ")))
                        };
                        let (low, high) = (slice(self, 0), slice(self, half));
                        self.op(format!("{} {low}, {high} : vector<{half}xf32>", combine.op()))
                    }
                };
            }
        }
        match self.form {
            Form::Host => values
                .iter()
                .map(|value| self.op(format!("vector.extract {value}[0] : f32 from vector<1xf32>")))
                .collect(),
            Form::Device => values,
        }
    }

    /// Another lane's f32 on the device: `gpu.shuffle MODE` of `value` with
    /// `offset` and `width` (i32s).
    fn shuffle(&mut self, mode: &str, value: &str, offset: &str, width: &str) -> String {
        let (theirs, valid) = (self.fresh(), self.fresh());
        self.line(format!("{theirs}, {valid} = gpu.shuffle {mode} {value}, {offset}, {width} : f32"));
        theirs
    }

    /// `scf.for` over `from..to` (indices) carrying `carried` (initial
    /// value, register type); `body` gets the counter and the carried
    /// values and gives the next ones. The loop's results, in order.
    pub fn for_range(
        &mut self,
        from: &str,
        to: &str,
        carried: &[(String, &str)],
        body: impl FnOnce(&mut Self, &str, &[String]) -> Vec<String>,
    ) -> Vec<String> {
        let one = self.index_constant(1);
        self.for_steps(from, to, &one, carried, body)
    }

    /// [`Emitter::for_range`] counting by `step` (an index).
    pub fn for_steps(
        &mut self,
        from: &str,
        to: &str,
        step: &str,
        carried: &[(String, &str)],
        body: impl FnOnce(&mut Self, &str, &[String]) -> Vec<String>,
    ) -> Vec<String> {
        let (result, counter) = (self.fresh(), self.fresh());
        let names: Vec<String> = carried.iter().map(|_| self.fresh()).collect();
        let types: Vec<&str> = carried.iter().map(|(_, ty)| *ty).collect();
        if carried.is_empty() {
            self.line(format!("scf.for {counter} = {from} to {to} step {step} {{"));
        } else {
            let arguments: Vec<String> =
                names.iter().zip(carried).map(|(name, (initial, _))| format!("{name} = {initial}")).collect();
            let prefix = Self::results_prefix(&result, carried.len());
            self.line(format!(
                "{prefix} = scf.for {counter} = {from} to {to} step {step} iter_args({}) -> ({}) {{",
                arguments.join(", "),
                types.join(", ")
            ));
        }
        let next = body(self, &counter, &names);
        if !carried.is_empty() {
            self.line(format!("  scf.yield {} : {}", next.join(", "), types.join(", ")));
        }
        self.line("}".into());
        if carried.is_empty() {
            Vec::new()
        } else {
            Self::results(&result, carried.len())
        }
    }

    /// `scf.if condition` giving values of types `types`: `then`'s or
    /// `otherwise`'s.
    pub fn if_else(
        &mut self,
        condition: &str,
        types: &[&str],
        then: impl FnOnce(&mut Self) -> Vec<String>,
        otherwise: impl FnOnce(&mut Self) -> Vec<String>,
    ) -> Vec<String> {
        let name = self.fresh();
        let types = types.join(", ");
        let count = Self::results_prefix(&name, types.split(", ").count());
        self.line(format!("{count} = scf.if {condition} -> ({types}) {{"));
        let a = then(self);
        self.line(format!("  scf.yield {} : {types}", a.join(", ")));
        self.line("} else {".into());
        let b = otherwise(self);
        self.line(format!("  scf.yield {} : {types}", b.join(", ")));
        self.line("}".into());
        Self::results(&name, a.len())
    }

    /// How an operation of `count` results named `name` is written.
    fn results_prefix(name: &str, count: usize) -> String {
        if count == 1 {
            name.to_string()
        } else {
            format!("{name}:{count}")
        }
    }

    /// The results of an operation of `count` results named `name`.
    fn results(name: &str, count: usize) -> Vec<String> {
        match count {
            1 => vec![name.to_string()],
            n => (0..n).map(|k| format!("{name}#{k}")).collect(),
        }
    }

    /// `scf.if condition` with no result.
    pub fn when(&mut self, condition: &str, then: impl FnOnce(&mut Self)) {
        self.line(format!("scf.if {condition} {{"));
        then(self);
        self.line("}".into());
    }

    /// `scf.if condition` with no result, and an `else`.
    pub fn when_else(&mut self, condition: &str, then: impl FnOnce(&mut Self), otherwise: impl FnOnce(&mut Self)) {
        self.line(format!("scf.if {condition} {{"));
        then(self);
        self.line("} else {".into());
        otherwise(self);
        self.line("}".into());
    }

    /// The node's (last) kernel, writing `out` (of `dtype`) from the
    /// loads, with the body emitted so far: `ENTRY_vNODE`.
    pub fn finish(self, dtype: Dtype) -> Kernel {
        let name = format!("{}_v{}", self.entry.name, self.node);
        self.finish_named(dtype, name)
    }

    /// [`Emitter::finish`] for a kernel of the node before its last,
    /// named for what it does: `ENTRY_vNODE_WHAT`.
    pub fn finish_stage(self, dtype: Dtype, what: &str) -> Kernel {
        let name = format!("{}_v{}_{what}", self.entry.name, self.node);
        self.finish_named(dtype, name)
    }

    fn finish_named(self, dtype: Dtype, name: String) -> Kernel {
        let arguments = self.arguments(&[("%out".to_string(), dtype)]);
        let opening = self.opening.as_ref().expect("every kernel opens its units");
        let member = Member { unit: opening.unit.clone(), body: opening.member_body(&self.body) };
        let text = self.function(&name, &arguments);
        Kernel {
            node: self.node,
            stage: self.stage,
            name,
            text,
            loads: self.loads,
            dims: self.dims,
            work: self.work,
            lanes: self.lanes,
            faults: self.faults,
            checks: self.checks,
            scratch: self.scratch,
            member,
        }
    }

    /// The calling convention's arguments of a function of this body
    /// writing `outputs` (names and dtypes): them, the loads, the scratch
    /// if it has one, the dims and faults tables.
    fn arguments(&self, outputs: &[(String, Dtype)]) -> String {
        let outputs = outputs.iter().map(|(name, dtype)| format!("{name}: memref<?x{}>", stored(*dtype)));
        let loads =
            self.loads.iter().enumerate().map(|(at, value)| format!("%in{at}: memref<?x{}>", self.stored_type(*value)));
        let scratch = self.scratch.iter().map(|scratch| format!("%scratch: memref<?x{}>", stored(scratch.dtype)));
        let tables = [format!("%dims: memref<?xi64>, %error: memref<{FAULT_SLOTS}xi64>")];
        outputs.chain(loads).chain(scratch).chain(tables).collect::<Vec<_>>().join(", ")
    }

    /// The element type `value` is stored in: a quantized parameter's
    /// blocks are bytes.
    fn stored_type(&self, value: Value) -> &'static str {
        match self.entry.blocks(value) {
            Some(_) => "i8",
            None => stored(self.entry.nodes[value.index()].dtype),
        }
    }

    /// The body emitted so far as function `name` of `arguments` (MLIR
    /// text) for the emitter's form: a host function MLIR's execution
    /// engine can call, or a device kernel.
    fn function(&self, name: &str, arguments: &str) -> String {
        match self.form {
            // `llvm.emit_c_interface`: MLIR's execution engine calls only
            // such functions.
            Form::Host => format!("func.func @{name}({arguments}) attributes {{ llvm.emit_c_interface }} {{\n{}    return\n}}\n", self.body),
            Form::Device => format!(
                "gpu.func @{name}({arguments}) kernel attributes {{ known_block_size = array<i32: {THREADS}, 1, 1> }} {{\n{}    gpu.return\n}}\n",
                self.body
            ),
        }
    }

    /// The body emitted so far as a launch group's function `name`, which
    /// writes `outputs` (their dtypes: `%out0`, `%out1`, …) from the
    /// loads; with its loads and dims table.
    pub fn finish_group(self, name: &str, outputs: &[Dtype]) -> (String, Vec<Value>, Vec<Dim>) {
        let outputs: Vec<(String, Dtype)> =
            outputs.iter().enumerate().map(|(k, dtype)| (format!("%out{k}"), *dtype)).collect();
        let text = self.function(name, &self.arguments(&outputs));
        (text, self.loads, self.dims)
    }

    /// This unit's number and the loop over `count` units (an index) on
    /// the host: `body` is given the unit. A launch group's dispatch.
    pub fn units(&mut self, count: &str, body: impl FnOnce(&mut Self, &str)) {
        let unit = self.open_units(count);
        body(self, &unit);
        // The device has no guard of its own to close.
        if self.form == Form::Host {
            self.close_units();
        }
    }
}
