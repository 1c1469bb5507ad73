//! Comparisons: of values in the IR, of dims in clauses and facts, and the
//! surface syntax's comparison operators.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    /// Whether the comparison holds for two values so ordered; unordered
    /// values (a NaN) are only unequal.
    pub fn holds(self, ordering: Option<std::cmp::Ordering>) -> bool {
        match (self, ordering) {
            (_, None) => self == CmpOp::Ne,
            (CmpOp::Eq, Some(o)) => o.is_eq(),
            (CmpOp::Ne, Some(o)) => o.is_ne(),
            (CmpOp::Lt, Some(o)) => o.is_lt(),
            (CmpOp::Le, Some(o)) => o.is_le(),
            (CmpOp::Gt, Some(o)) => o.is_gt(),
            (CmpOp::Ge, Some(o)) => o.is_ge(),
        }
    }

    /// Whether `lhs self rhs` holds for two integers.
    pub fn holds_between(self, lhs: i64, rhs: i64) -> bool {
        self.holds(Some(lhs.cmp(&rhs)))
    }

    pub fn symbol(self) -> &'static str {
        match self {
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }
}
