//! The kernel ABI: what native code compiled for a model (by the JIT or
//! into an artifact's object file) and the CPU backend agree on. A kernel
//! is a function of one signature ([`KernelFn`]); what it loads, which dims
//! it reads and where its loads are checked are its [`KernelRecord`],
//! which an artifact's manifest carries beside the code; it reaches the
//! kernel library through the helper table (`helpers`), never through a
//! symbol, so its code needs no relocations.

use crate::helpers;
use linnet_ir::dim::Dim;
use linnet_ir::Value;
use serde::{Deserialize, Serialize};

/// `fn(out, inputs, dims, helpers, error, first_row, end_row) -> status`:
/// `inputs` points at each loaded value's elements, `dims` at the values of
/// the kernel's dims table, `helpers` at [`helpers::table`](crate::helpers::table); `error`
/// receives (load site, position, size, axis) when the status is 1. An
/// elementwise node computes rows `first_row..end_row` of its first two
/// axes flattened when it has three or more, else of its first (a
/// contraction, or a node without axes, computes everything).
pub type KernelFn =
    unsafe extern "C" fn(*mut u8, *const *const u8, *const i64, *const *const u8, *mut i64, i64, i64) -> i32;

/// Changes whenever the kernel calling convention or the helper table
/// does; an artifact of another version is rebuilt, not run.
pub const ABI_VERSION: u32 = 9;

/// Per entry, its kernels' records.
pub type EntryKernels = std::collections::BTreeMap<String, Vec<KernelRecord>>;

pub struct NativeKernel {
    pub function: KernelFn,
    pub record: KernelRecord,
}

/// A load that fell outside its tensor, as a kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadFault {
    pub site: usize,
    pub position: i64,
    pub size: i64,
    pub axis: usize,
}

/// The compiled nodes of one entry.
pub struct Compiled {
    /// The JIT module or the mapped text the kernels point into, kept alive.
    pub code: Box<dyn std::any::Any + Send>,
    /// Per node: its kernel, if it has one.
    pub kernels: Vec<Option<NativeKernel>>,
}

/// What a kernel needs at a call, from its definition to an artifact's
/// manifest to the loader: its node and symbol, the values it loads (in
/// argument order), the dims it reads (in the order of its dims table),
/// its load sites (in the numbering of its error record), and whether it
/// computes a given range of rows (an elementwise node with axes: its
/// first two axes flattened when it has three or more, else its first),
/// so that threads can share them.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KernelRecord {
    pub node: usize,
    pub symbol: String,
    pub loads: Vec<Value>,
    pub dims: Vec<Dim>,
    pub sites: Vec<LoadSite>,
    pub splits_rows: bool,
}

/// A place where a kernel loads a value, checking each position: what an
/// error record's site number refers to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadSite {
    pub value: Value,
    /// Per checked axis: the value its position reads directly, if any.
    pub sources: Vec<Option<Value>>,
}

/// Runs a kernel over `rows` (see [`KernelFn`]; a contraction or a node
/// without axes computes everything, whatever is given); the load
/// that fell outside its tensor, if one did.
///
/// # Safety
/// `inputs` must point at the kernel's loads, `out` at room for the
/// node's elements, and `dims` at the values of its dims table, all with
/// the shapes and dtypes the kernel was compiled for; `rows` lies within
/// the node's rows (see [`KernelFn`]).
pub unsafe fn call(
    kernel: &NativeKernel,
    out: *mut u8,
    inputs: &[*const u8],
    dims: &[i64],
    rows: std::ops::Range<usize>,
) -> Result<(), LoadFault> {
    let table = helpers::table();
    let mut error = [0i64; 4];
    // SAFETY: as the caller promises; the helper table is in slot order.
    let status = unsafe {
        (kernel.function)(
            out,
            inputs.as_ptr(),
            dims.as_ptr(),
            table.as_ptr(),
            error.as_mut_ptr(),
            rows.start as i64,
            rows.end as i64,
        )
    };
    match status {
        0 => Ok(()),
        _ => Err(LoadFault { site: error[0] as usize, position: error[1], size: error[2], axis: error[3] as usize }),
    }
}
