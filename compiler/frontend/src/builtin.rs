//! The built-in functions, declared once: each one's name, its signature
//! (whether it takes an element type, how many positional arguments, the
//! one named argument it allows, what its argument's elements must be) and
//! what it is ([`Builtin`]). The checker (`sema::builtins`: the typing
//! rule of each) and the lowering (`lower::expr`: its IR) both look a name
//! up here and match on the [`Builtin`], never on its spelling.

use linnet_ir::UnaryOp;

/// What a built-in is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Builtin {
    Reshape,
    Permute,
    Concat,
    Iota,
    Fill,
    Cast,
    Select,
    /// An elementwise math function.
    Math(UnaryOp),
    Max,
    Min,
    Some,
    UnwrapOr,
    Assert,
}

/// What a math function's argument must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elements {
    /// Floats (the transcendental functions).
    Float,
    /// Any number (`abs`).
    Number,
}

/// A built-in's signature.
#[derive(Clone, Copy, Debug)]
pub struct Signature {
    pub name: &'static str,
    pub builtin: Builtin,
    /// Whether it takes one element type: `iota<i32>(...)`.
    pub element_type: bool,
    /// Its positional arguments; `None` for any number (`concat`).
    pub arity: Option<usize>,
    /// The one argument it takes by name, if any (`concat`'s `axis`).
    pub named: Option<&'static str>,
    /// What a math function's argument must hold.
    pub elements: Option<Elements>,
}

impl Signature {
    /// Whether a call of it inside an index definition works element by
    /// element (its arguments are elements, not whole tensors).
    pub fn is_elementwise(&self) -> bool {
        matches!(self.builtin, Builtin::Cast | Builtin::Select | Builtin::Max | Builtin::Min | Builtin::Math(_))
    }
}

const fn plain(name: &'static str, builtin: Builtin, arity: usize) -> Signature {
    Signature { name, builtin, element_type: false, arity: Some(arity), named: None, elements: None }
}

const fn typed(name: &'static str, builtin: Builtin, arity: usize) -> Signature {
    Signature { element_type: true, ..plain(name, builtin, arity) }
}

const fn math(name: &'static str, op: UnaryOp, elements: Elements) -> Signature {
    Signature { elements: Some(elements), ..plain(name, Builtin::Math(op), 1) }
}

/// Every built-in function.
pub const BUILTINS: &[Signature] = &[
    plain("reshape", Builtin::Reshape, 2),
    plain("permute", Builtin::Permute, 2),
    Signature {
        name: "concat",
        builtin: Builtin::Concat,
        element_type: false,
        arity: None,
        named: Some("axis"),
        elements: None,
    },
    typed("iota", Builtin::Iota, 1),
    typed("fill", Builtin::Fill, 2),
    typed("cast", Builtin::Cast, 1),
    plain("select", Builtin::Select, 3),
    math("exp", UnaryOp::Exp, Elements::Float),
    math("log", UnaryOp::Log, Elements::Float),
    math("rsqrt", UnaryOp::Rsqrt, Elements::Float),
    math("sqrt", UnaryOp::Sqrt, Elements::Float),
    math("cos", UnaryOp::Cos, Elements::Float),
    math("sin", UnaryOp::Sin, Elements::Float),
    math("tanh", UnaryOp::Tanh, Elements::Float),
    math("abs", UnaryOp::Abs, Elements::Number),
    plain("max", Builtin::Max, 2),
    plain("min", Builtin::Min, 2),
    plain("some", Builtin::Some, 1),
    plain("unwrap_or", Builtin::UnwrapOr, 2),
    plain("assert", Builtin::Assert, 2),
];

/// The built-in named `name`, if one is.
pub fn lookup(name: &str) -> Option<&'static Signature> {
    BUILTINS.iter().find(|signature| signature.name == name)
}

/// The names of the built-in functions.
pub fn names() -> impl Iterator<Item = &'static str> {
    BUILTINS.iter().map(|signature| signature.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each name is declared once, and each math function's operation once.
    #[test]
    fn every_builtin_is_declared_once() {
        for (at, signature) in BUILTINS.iter().enumerate() {
            assert!(BUILTINS[..at].iter().all(|earlier| earlier.name != signature.name), "{}", signature.name);
            assert!(
                BUILTINS[..at].iter().all(|earlier| earlier.builtin != signature.builtin),
                "{:?}",
                signature.builtin
            );
            assert_eq!(
                signature.elements.is_some(),
                matches!(signature.builtin, Builtin::Math(_)),
                "{}",
                signature.name
            );
        }
        assert_eq!(lookup("concat").map(|s| s.named), Some(Some("axis")));
        assert!(lookup("softmax").is_none());
    }
}
