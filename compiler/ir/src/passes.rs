//! The IR's pass pipeline: the optimizing passes as a list, in order, and
//! the verifier run on what lowering made and after each pass, so that a
//! pass that breaks the IR is named at once rather than found by the
//! code generator or at run time. The verifier runs after every pass in
//! debug builds and tests; in release builds after the last one only,
//! unless [`Checking::EachPass`] is asked for (`LINNET_VERIFY_IR=1`).

use crate::Model;
use std::fmt;

/// One pass: its name (as a failure names it) and what it does.
#[derive(Clone, Copy)]
pub struct Pass {
    pub name: &'static str,
    pub run: fn(&mut Model),
}

/// The optimizing passes, in the order they run: inline values read once
/// into their consumer, compute what is left only once, read views where
/// they lie, and place independent nodes together.
pub const OPTIMIZE: &[Pass] = &[
    Pass { name: "fuse", run: crate::fuse::fuse },
    Pass { name: "cse", run: crate::cse::eliminate },
    Pass { name: "views", run: crate::views::read_through },
    Pass { name: "schedule", run: crate::schedule::schedule },
];

/// When the verifier runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checking {
    /// On the input and after every pass.
    EachPass,
    /// On the input and after the last pass.
    End,
}

impl Checking {
    /// After every pass in debug builds (tests among them) or when
    /// `LINNET_VERIFY_IR=1`; else at the end only.
    pub fn default_for_build() -> Checking {
        let asked = std::env::var("LINNET_VERIFY_IR").is_ok_and(|value| value == "1");
        if cfg!(debug_assertions) || asked {
            Checking::EachPass
        } else {
            Checking::End
        }
    }
}

/// The IR did not verify: after which pass (`lowering` for the input), and
/// what the verifier found. Always a compiler bug.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassError {
    pub pass: &'static str,
    pub problem: crate::VerifyError,
}

impl fmt::Display for PassError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "after `{}`: {}", self.pass, self.problem)
    }
}

impl std::error::Error for PassError {}

/// Runs `passes` over `model` in order, verifying it as `checking` says.
pub fn run(model: &mut Model, passes: &[Pass], checking: Checking) -> Result<(), PassError> {
    let check = |model: &Model, pass: &'static str| crate::verify(model).map_err(|problem| PassError { pass, problem });
    check(model, "lowering")?;
    for (at, pass) in passes.iter().enumerate() {
        (pass.run)(model);
        if checking == Checking::EachPass || at + 1 == passes.len() {
            check(model, pass.name)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{entry_of, index};
    use crate::{BinaryOp, Dtype, NodeKind, Scalar, Value};

    fn load(value: u32) -> Scalar {
        Scalar::Load(Value(value), vec![index(0), index(1)], Dtype::F32)
    }

    /// `x: [2, 4]`; `y = x + x`; `z = y * y`, returned.
    fn model() -> Model {
        let binary = |op, value| Scalar::Binary(op, Box::new(load(value)), Box::new(load(value)), Dtype::F32);
        let entry = entry_of(vec![binary(BinaryOp::Add, 0), binary(BinaryOp::Mul, 1)]);
        Model { name: "tiny".into(), params: Vec::new(), states: Vec::new(), entries: vec![entry] }
    }

    /// A pass that makes the first computed node read the last one.
    fn breaks_order(model: &mut Model) {
        let last = model.entries[0].nodes.len() as u32 - 1;
        model.entries[0].nodes[1].kind = NodeKind::Compute(load(last));
    }

    #[test]
    fn a_pass_that_breaks_the_ir_is_named() {
        assert_eq!(run(&mut model(), OPTIMIZE, Checking::EachPass), Ok(()));
        // (A pass after a broken one may fail in its own way: the point of
        // checking each.)
        let broken = [Pass { name: "breaks-order", run: breaks_order }, Pass { name: "nothing", run: |_| {} }];
        let error = run(&mut model(), &broken, Checking::EachPass).unwrap_err();
        assert_eq!(error.pass, "breaks-order", "{error}");
        assert!(error.to_string().starts_with("after `breaks-order`: IR verifier"), "{error}");
        // Checked at the end only, the failure is the last pass's.
        let error = run(&mut model(), &broken, Checking::End).unwrap_err();
        assert_eq!(error.pass, "nothing", "{error}");
    }
}
