//! The reference interpreter, a backend of the executor (`exec`) and the
//! semantics of record for the tensor IR. Each `Compute` node is evaluated
//! element by element with the numerics of `docs/language.md`
//! (`numerics`): a bf16 or f16 value is rounded where it is produced, sums
//! accumulate in f64 in index order and round once, and a load outside a
//! tensor is an error naming the value. Every other backend is held to it
//! within the tolerances stated there.

mod eval;

use crate::tensor::Tensor;
use crate::{Backend, BuildError, Machine, NodeError, Site, Values};
use linnet_ir::analysis::Analysis;
use linnet_ir::{Intrinsic, Model, NodeKind};

/// The interpreter: host tensors, nothing to compile.
#[derive(Clone, Copy, Debug, Default)]
pub struct Interpreter;

/// `model` with `params` on the interpreter.
pub fn machine(model: Model, params: Vec<Tensor>) -> Machine {
    Machine::new(model, params, Interpreter).expect("the interpreter runs every node")
}

impl Backend for Interpreter {
    fn reads_blocks(&self) -> bool {
        true
    }

    type Buffer = Tensor;

    fn name(&self) -> &'static str {
        "interp"
    }

    fn prepare(&mut self, _: &Model, _: &[Analysis]) -> Result<(), BuildError> {
        Ok(())
    }

    crate::tensor::host_memory!(dequantized);

    fn compute(&mut self, site: Site<'_>, values: &Values<Tensor>) -> Result<Tensor, NodeError> {
        let node = &site.entry.nodes[site.at];
        let NodeKind::Compute(scalar) = &node.kind else { unreachable!("the executor computes only `Compute` nodes") };
        eval::compute(scalar, site.shape.to_vec(), node.dtype, values, site.dims)
    }

    fn intrinsic(&mut self, site: Site<'_>, intrinsic: Intrinsic, args: &[&Tensor]) -> Result<Tensor, NodeError> {
        Ok(crate::reference::run_widened(intrinsic, args, site.shape.to_vec()))
    }

    fn write_cache(
        &mut self,
        _: Site<'_>,
        intrinsic: Intrinsic,
        cache: &mut Tensor,
        args: &[&Tensor],
    ) -> Result<(), NodeError> {
        crate::reference::write_cache_widened(intrinsic, cache, args)
    }
}
