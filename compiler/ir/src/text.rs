//! The IR's readable text form (`linnetc build --emit ir`): parameters and
//! states with their shapes, then each entry's nodes, one per line.

use super::{BinaryOp, Entry, Model, Node, NodeKind, ReduceOp, Scalar, UnaryOp};
use std::fmt::{self, Display, Formatter};

fn dims(shape: &[impl Display]) -> String {
    shape.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

impl Display for Model {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        writeln!(f, "model {}", self.name)?;
        for (at, param) in self.params.iter().enumerate() {
            let stored = param.storage.map(|format| format!(" in {format}")).unwrap_or_default();
            writeln!(f, "  param p{at} {}: [{}; {}]{stored}", param.path, dims(&param.shape), param.dtype.name())?;
        }
        for (at, state) in self.states.iter().enumerate() {
            writeln!(f, "  state s{at} {}: [{}; {}]", state.path, dims(&state.shape), state.dtype.name())?;
        }
        for entry in &self.entries {
            write!(f, "{entry}")?;
        }
        Ok(())
    }
}

impl Display for Entry {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let generics: Vec<&str> = self.dims.iter().map(|d| &**d).collect();
        let inputs: Vec<String> =
            self.inputs.iter().map(|i| format!("{}: [{}; {}]", i.name, dims(&i.shape), i.dtype.name())).collect();
        writeln!(f, "\nentry {}<{}>({})", self.name, generics.join(", "), inputs.join(", "))?;
        for requirement in &self.requires {
            writeln!(f, "  requires {}", requirement.text)?;
        }
        for (at, node) in self.nodes.iter().enumerate() {
            writeln!(f, "  v{at}: [{}; {}] = {}", dims(&node.shape), node.dtype.name(), NodeText(node))?;
        }
        let outputs: Vec<String> = self.outputs.iter().map(|v| format!("v{}", v.0)).collect();
        writeln!(f, "  return {}", outputs.join(", "))
    }
}

struct NodeText<'a>(&'a Node);

impl Display for NodeText<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match &self.0.kind {
            NodeKind::Input(at) => write!(f, "input {at}"),
            NodeKind::Param(at) => write!(f, "param p{at}"),
            NodeKind::State(at) => write!(f, "state s{at}"),
            NodeKind::Compute(scalar) => write!(f, "compute {scalar}"),
            NodeKind::Intrinsic(intrinsic, args) => {
                let args: Vec<String> = args.iter().map(|v| format!("v{}", v.0)).collect();
                write!(f, "{}({})", intrinsic.name(), args.join(", "))
            }
            NodeKind::WriteState(at, value) => write!(f, "write s{at} <- v{}", value.0),
            NodeKind::Assert(value, message) => write!(f, "assert v{} {message:?}", value.0),
        }
    }
}

fn unary_name(op: UnaryOp) -> &'static str {
    match op {
        UnaryOp::Neg => "neg",
        UnaryOp::Not => "not",
        UnaryOp::Exp => "exp",
        UnaryOp::Log => "log",
        UnaryOp::Rsqrt => "rsqrt",
        UnaryOp::Sqrt => "sqrt",
        UnaryOp::Cos => "cos",
        UnaryOp::Sin => "sin",
        UnaryOp::Tanh => "tanh",
        UnaryOp::Abs => "abs",
    }
}

fn binary_symbol(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "+",
        BinaryOp::Sub => "-",
        BinaryOp::Mul => "*",
        BinaryOp::Div => "/",
        BinaryOp::Rem => "%",
        BinaryOp::Max => "max",
        BinaryOp::Min => "min",
        BinaryOp::And => "&&",
        BinaryOp::Or => "||",
        BinaryOp::Cmp(op) => op.symbol(),
    }
}

impl Display for Scalar {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Index(k, _) => write!(f, "i{k}"),
            Scalar::Dim(dim) => write!(f, "({dim})"),
            Scalar::Float(value, dtype) => write!(f, "{value:?}{}", dtype.name()),
            Scalar::Int(value, dtype) => write!(f, "{value}{}", dtype.name()),
            Scalar::Bool(value) => write!(f, "{value}"),
            Scalar::Load(value, positions, _) => {
                let positions: Vec<String> = positions.iter().map(ToString::to_string).collect();
                write!(f, "v{}[{}]", value.0, positions.join(", "))
            }
            Scalar::Unary(op, a, _) => write!(f, "{}({a})", unary_name(*op)),
            Scalar::Binary(op @ (BinaryOp::Max | BinaryOp::Min), a, b, _) => {
                write!(f, "{}({a}, {b})", binary_symbol(*op))
            }
            Scalar::Binary(op, a, b, _) => write!(f, "({a} {} {b})", binary_symbol(*op)),
            Scalar::Select(c, a, b, _) => write!(f, "select({c}, {a}, {b})"),
            Scalar::Cast(a, dtype) => write!(f, "cast<{}>({a})", dtype.name()),
            Scalar::Reduce { op, index, extent, body, dtype } => {
                let name = match op {
                    ReduceOp::Sum => "sum",
                    ReduceOp::Max => "max",
                    ReduceOp::Min => "min",
                };
                write!(f, "{name}<{}>[i{index} < {extent}] {body}", dtype.name())
            }
        }
    }
}
