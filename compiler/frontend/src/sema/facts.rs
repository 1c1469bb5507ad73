//! What a scope knows about its dims: the `where` clauses in force, as
//! rewrite rules (`Conv == 2 * KeyHeads * KeyDim + ValueHeads * ValueDim`
//! makes `Conv` the sum) and inequalities (`P >= 0`). Equalities are used
//! to normalize; inequalities, with every dim being non-negative, to prove
//! obligations such as a callee's `where` clauses or a slice's bounds.
//! A proof either succeeds or the obligation is reported: nothing is
//! assumed.

use linnet_ir::dim::{Atom, Dim};
use linnet_ir::CmpOp;

#[derive(Clone, Default)]
pub struct Facts {
    /// `atom := dim`, applied in order until nothing changes.
    rewrites: Vec<(Atom, Dim)>,
    /// Each `P` here is known to satisfy `P >= 0`.
    nonnegative: Vec<Dim>,
    /// Each `P` here is known to be non-zero.
    nonzero: Vec<Dim>,
    /// `a := d * (a / d)` for each `a % d == 0` with a generic `d`: tried
    /// when an equality does not hold as normalized.
    tilings: Vec<(Atom, Dim)>,
}

/// How far the prover chases bounds before giving up.
const PROOF_DEPTH: usize = 4;

impl Facts {
    /// `dim` with every known equality applied.
    pub fn normalize(&self, dim: &Dim) -> Dim {
        if self.rewrites.is_empty() {
            return dim.clone();
        }
        let mut current = dim.clone();
        for _ in 0..8 {
            let next = current
                .map_atoms(&mut |atom| self.rewrites.iter().find(|(from, _)| from == atom).map(|(_, to)| to.clone()));
            if next == current {
                break;
            }
            current = next;
        }
        current
    }

    pub fn equal(&self, a: &Dim, b: &Dim) -> bool {
        a == b || self.is_zero(&self.normalize(&a.sub(b)))
    }

    /// Whether a normalized difference is zero, dividends tiled by their
    /// generic divisors where the facts say they divide exactly.
    fn is_zero(&self, difference: &Dim) -> bool {
        difference.is_zero()
            || (!self.tilings.is_empty()
                && self
                    .normalize(&difference.map_atoms(&mut |atom| {
                        self.tilings.iter().find(|(from, _)| from == atom).map(|(_, to)| to.clone())
                    }))
                    .is_zero())
    }

    /// Adds `lhs op rhs` as a known fact.
    pub fn assume(&mut self, lhs: &Dim, op: CmpOp, rhs: &Dim) {
        let difference = self.normalize(&lhs.sub(rhs));
        match op {
            CmpOp::Eq => self.assume_zero(difference),
            CmpOp::Ne => self.nonzero.push(difference),
            CmpOp::Ge => self.nonnegative.push(difference),
            CmpOp::Gt => self.nonnegative.push(difference.sub(&Dim::constant(1))),
            CmpOp::Le => self.nonnegative.push(difference.scale(-1)),
            CmpOp::Lt => self.nonnegative.push(difference.scale(-1).sub(&Dim::constant(1))),
        }
    }

    /// Solves `difference == 0` for one of its atoms (one with coefficient
    /// ±1 that stands alone in its term) and records the rewrite.
    fn assume_zero(&mut self, difference: Dim) {
        let solvable = difference.terms().find_map(|(monomial, coefficient)| {
            (monomial.len() == 1 && coefficient.abs() == 1).then(|| (monomial[0].clone(), coefficient))
        });
        let Some((atom, coefficient)) = solvable else {
            // Nothing to solve for: keep it as two inequalities.
            self.nonnegative.push(difference.scale(-1));
            self.nonnegative.push(difference);
            return;
        };
        // a % c == 0 for a lone atom a also means a == c * (a / c), which
        // lets `2 * (D / 2)` and `D` meet. With a generic divisor
        // (`H % Heads == 0`) the same holds, but kept aside for equalities
        // only: as a rewrite it would spell every `H` as
        // `Heads * (H / Heads)` in the types the messages show.
        if let Atom::Rem(dividend, divisor) = &atom {
            if let (Some(inner), Some(_), 1) = (dividend.as_atom(), divisor.as_atom(), difference.terms().count()) {
                self.tilings.push((inner.clone(), dividend.div(divisor).mul(divisor)));
            }
            if let (Some(inner), Some(_)) = (dividend.as_atom(), divisor.as_constant()) {
                if difference.terms().count() == 1 {
                    let whole = dividend.div(divisor).mul(divisor);
                    self.add_rule(inner.clone(), whole);
                }
            }
        }
        // coefficient * atom + rest == 0  =>  atom == -rest / coefficient
        let rest = difference.sub(&Dim::atom(atom.clone()).scale(coefficient));
        let value = self.normalize(&rest.scale(-coefficient));
        self.add_rule(atom, value);
    }

    fn add_rule(&mut self, atom: Atom, value: Dim) {
        let rule = (atom, value);
        for (_, to) in &mut self.rewrites {
            *to = to.map_atoms(&mut |a| (a == &rule.0).then(|| rule.1.clone()));
        }
        self.rewrites.push(rule);
        self.nonnegative = self.nonnegative.iter().map(|p| self.normalize(p)).collect();
    }

    /// Whether `lhs op rhs` follows from the facts.
    pub fn proves(&self, lhs: &Dim, op: CmpOp, rhs: &Dim) -> bool {
        let difference = self.normalize(&lhs.sub(rhs));
        match op {
            CmpOp::Eq => self.is_zero(&difference),
            CmpOp::Ne => {
                self.positive(&difference)
                    || self.positive(&difference.scale(-1))
                    || self.nonzero.iter().any(|known| {
                        let known = self.normalize(known);
                        known == difference || known == difference.scale(-1)
                    })
            }
            CmpOp::Ge => self.nonnegative_dim(&difference, PROOF_DEPTH),
            CmpOp::Gt => self.positive(&difference),
            CmpOp::Le => self.nonnegative_dim(&difference.scale(-1), PROOF_DEPTH),
            CmpOp::Lt => self.positive(&difference.scale(-1)),
        }
    }

    fn positive(&self, dim: &Dim) -> bool {
        self.nonnegative_dim(&dim.sub(&Dim::constant(1)), PROOF_DEPTH)
    }

    /// The least value an atom can take under the facts (dims are >= 0).
    fn atom_lower_bound(&self, atom: &Atom) -> i64 {
        let mut bound = 0;
        for fact in &self.nonnegative {
            // c * atom + k >= 0 with c > 0  =>  atom >= ceil(-k / c)
            let mut linear = None;
            let mut constant = 0;
            let mut other = false;
            for (monomial, coefficient) in fact.terms() {
                match monomial.as_slice() {
                    [] => constant = coefficient,
                    [only] if only == atom && coefficient > 0 => linear = Some(coefficient),
                    _ => other = true,
                }
            }
            if let (Some(c), false) = (linear, other) {
                bound = bound.max((-constant + c - 1).div_euclid(c));
            }
        }
        if let Atom::Div(a, b) = atom {
            if let (Some(divisor), Some(low)) = (b.as_constant(), self.lower_bound(a)) {
                if divisor > 0 {
                    bound = bound.max(low.div_euclid(divisor));
                }
            }
        }
        bound
    }

    /// A lower bound of a dim whose non-constant terms all have positive
    /// coefficients; `None` otherwise.
    fn lower_bound(&self, dim: &Dim) -> Option<i64> {
        let mut total = 0i64;
        for (monomial, coefficient) in dim.terms() {
            if monomial.is_empty() {
                total = total.checked_add(coefficient)?;
                continue;
            }
            if coefficient < 0 {
                return None;
            }
            let mut product = coefficient;
            for atom in monomial {
                product = product.checked_mul(self.atom_lower_bound(atom))?;
            }
            total = total.checked_add(product)?;
        }
        Some(total)
    }

    fn nonnegative_dim(&self, dim: &Dim, depth: usize) -> bool {
        if self.lower_bound(dim).is_some_and(|low| low >= 0) {
            return true;
        }
        // dim = fact + rest with rest >= 0
        let known = self.nonnegative.iter().any(|fact| self.lower_bound(&dim.sub(fact)).is_some_and(|low| low >= 0));
        if known || depth == 0 {
            return known;
        }
        // A term -k * (a / c): since a / c <= a / c exactly, prove
        // c * (dim + k * (a / c)) - k * a >= 0 instead.
        dim.terms().any(|(monomial, coefficient)| match monomial.as_slice() {
            [Atom::Div(a, b)] if coefficient < 0 => match b.as_constant() {
                Some(c) if c > 0 => {
                    let without = dim.sub(&Dim::atom(monomial[0].clone()).scale(coefficient));
                    let bounded = without.scale(c).add(&a.scale(coefficient));
                    self.nonnegative_dim(&bounded, depth - 1)
                }
                _ => false,
            },
            _ => false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(name: &str) -> Dim {
        Dim::generic(name)
    }

    #[test]
    fn equalities_rewrite() {
        let mut facts = Facts::default();
        let sum = g("KeyHeads").mul(&g("KeyDim")).scale(2).add(&g("ValueHeads").mul(&g("ValueDim")));
        facts.assume(&g("Conv"), CmpOp::Eq, &sum);
        let columns = g("Conv").sub(&g("KeyHeads").mul(&g("KeyDim")).scale(2));
        assert!(facts.equal(&columns, &g("ValueHeads").mul(&g("ValueDim"))));
    }

    #[test]
    fn remainders_as_facts() {
        let mut facts = Facts::default();
        let quarter = g("HeadDim").div(&Dim::constant(4));
        facts.assume(&quarter.rem(&Dim::constant(2)), CmpOp::Eq, &Dim::constant(0));
        assert!(facts.proves(&quarter.rem(&Dim::constant(2)), CmpOp::Eq, &Dim::constant(0)));
        assert!(!Facts::default().proves(&quarter.rem(&Dim::constant(2)), CmpOp::Eq, &Dim::constant(0)));
        // H % Heads == 0: the heads tile H exactly, and H stays positive.
        let whole = g("Heads").mul(&g("H").div(&g("Heads")));
        assert!(!Facts::default().equal(&whole, &g("H")));
        let mut facts = Facts::default();
        facts.assume(&g("H"), CmpOp::Gt, &Dim::constant(0));
        facts.assume(&g("H").rem(&g("Heads")), CmpOp::Eq, &Dim::constant(0));
        assert!(facts.equal(&whole, &g("H")));
        assert!(facts.proves(&g("H"), CmpOp::Gt, &Dim::constant(0)));
    }

    #[test]
    fn inequalities() {
        let mut facts = Facts::default();
        facts.assume(&g("S"), CmpOp::Gt, &Dim::constant(0));
        facts.assume(&g("Width"), CmpOp::Gt, &Dim::constant(1));
        assert!(facts.proves(&g("S"), CmpOp::Ge, &Dim::constant(1)));
        assert!(facts.proves(&g("B").mul(&g("S")), CmpOp::Ge, &Dim::constant(0)));
        assert!(facts.proves(&g("Width").sub(&Dim::constant(1)), CmpOp::Gt, &Dim::constant(0)));
        assert!(!facts.proves(&g("B"), CmpOp::Gt, &Dim::constant(0)));
        // x / 4 <= x
        let quarter = g("HeadDim").div(&Dim::constant(4));
        assert!(facts.proves(&quarter, CmpOp::Le, &g("HeadDim")));
        assert!(!facts.proves(&g("HeadDim"), CmpOp::Le, &quarter));
    }
}
