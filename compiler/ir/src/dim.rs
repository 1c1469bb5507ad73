//! Dim expressions in canonical form. A [`Dim`] is a polynomial with integer
//! coefficients over atoms: a generic (`H`), the element count of a
//! variadic shape (`|S|`), or an irreducible `a / b` or `a % b`. Every
//! constructor normalizes, so two dims are equal exactly when they are
//! equal as values: `HeadDim / 4 + (HeadDim - HeadDim / 4)` is `HeadDim`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

pub type Symbol = Arc<str>;

/// Values of generics, by name.
pub type Generics = std::collections::HashMap<Symbol, i64>;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub enum Atom {
    Generic(Symbol),
    /// The product of the dims a variadic shape stands for.
    ShapeSize(Symbol),
    /// Floor division that does not simplify.
    Div(Box<Dim>, Box<Dim>),
    /// Remainder that does not simplify.
    Rem(Box<Dim>, Box<Dim>),
}

/// A product of atoms, sorted, with repetition for powers.
pub type Monomial = Vec<Atom>;

#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(from = "Vec<(Monomial, i64)>", into = "Vec<(Monomial, i64)>")]
pub struct Dim {
    /// Monomial to coefficient; no zero coefficients; the empty monomial
    /// is the constant term.
    terms: BTreeMap<Monomial, i64>,
}

/// A dim is stored as its terms; reading one back normalizes it again.
impl From<Vec<(Monomial, i64)>> for Dim {
    fn from(terms: Vec<(Monomial, i64)>) -> Dim {
        Dim::from_terms(terms)
    }
}

impl From<Dim> for Vec<(Monomial, i64)> {
    fn from(dim: Dim) -> Vec<(Monomial, i64)> {
        dim.terms.into_iter().collect()
    }
}

impl Dim {
    pub fn constant(value: i64) -> Dim {
        let mut terms = BTreeMap::new();
        if value != 0 {
            terms.insert(Vec::new(), value);
        }
        Dim { terms }
    }

    pub fn atom(atom: Atom) -> Dim {
        Dim { terms: BTreeMap::from([(vec![atom], 1)]) }
    }

    pub fn generic(name: &str) -> Dim {
        Dim::atom(Atom::Generic(Arc::from(name)))
    }

    pub fn terms(&self) -> impl Iterator<Item = (&Monomial, i64)> {
        self.terms.iter().map(|(monomial, coefficient)| (monomial, *coefficient))
    }

    fn from_terms(terms: impl IntoIterator<Item = (Monomial, i64)>) -> Dim {
        let mut dim = Dim::default();
        for (mut monomial, coefficient) in terms {
            monomial.sort();
            dim.add_term(monomial, coefficient);
        }
        dim
    }

    fn add_term(&mut self, monomial: Monomial, coefficient: i64) {
        if coefficient == 0 {
            return;
        }
        let slot = self.terms.entry(monomial).or_insert(0);
        *slot += coefficient;
        if *slot == 0 {
            self.terms.retain(|_, c| *c != 0);
        }
    }

    pub fn as_constant(&self) -> Option<i64> {
        match self.terms.len() {
            0 => Some(0),
            1 => self.terms.get(&Vec::new()).copied(),
            _ => None,
        }
    }

    pub fn is_zero(&self) -> bool {
        self.terms.is_empty()
    }

    /// The atom this dim is, if it is exactly one atom.
    pub fn as_atom(&self) -> Option<&Atom> {
        match self.terms.iter().next() {
            Some((monomial, 1)) if self.terms.len() == 1 && monomial.len() == 1 => Some(&monomial[0]),
            _ => None,
        }
    }

    /// The generic this dim is, if it is exactly one generic.
    pub fn as_generic(&self) -> Option<&Symbol> {
        match self.as_atom() {
            Some(Atom::Generic(name)) => Some(name),
            _ => None,
        }
    }

    pub fn add(&self, other: &Dim) -> Dim {
        let mut sum = self.clone();
        for (monomial, coefficient) in other.terms() {
            sum.add_term(monomial.clone(), coefficient);
        }
        sum
    }

    pub fn scale(&self, factor: i64) -> Dim {
        Dim::from_terms(self.terms().map(|(m, c)| (m.clone(), c * factor)))
    }

    pub fn sub(&self, other: &Dim) -> Dim {
        self.add(&other.scale(-1))
    }

    pub fn mul(&self, other: &Dim) -> Dim {
        let mut product = Dim::default();
        for (left, a) in self.terms() {
            for (right, b) in other.terms() {
                let mut monomial = left.clone();
                monomial.extend(right.iter().cloned());
                monomial.sort();
                product.add_term(monomial, a * b);
            }
        }
        product
    }

    /// `self / divisor` if it divides exactly as a polynomial by a
    /// single-term divisor.
    fn exact_quotient(&self, divisor: &Dim) -> Option<Dim> {
        let (divisor_monomial, divisor_coefficient) = match divisor.terms.iter().next() {
            Some((m, c)) if divisor.terms.len() == 1 => (m, *c),
            _ => return None,
        };
        let mut quotient = Dim::default();
        for (monomial, coefficient) in self.terms() {
            if coefficient % divisor_coefficient != 0 {
                return None;
            }
            let mut rest = monomial.clone();
            for atom in divisor_monomial {
                let at = rest.iter().position(|a| a == atom)?;
                rest.remove(at);
            }
            quotient.add_term(rest, coefficient / divisor_coefficient);
        }
        Some(quotient)
    }

    /// Floor division (dims are non-negative).
    pub fn div(&self, divisor: &Dim) -> Dim {
        if self.is_zero() {
            return Dim::default();
        }
        if let Some(c) = divisor.as_constant() {
            if c == 0 {
                return Dim::atom(Atom::Div(Box::new(self.clone()), Box::new(divisor.clone())));
            }
            // floor((c*q + r) / c) = q + floor(r / c) for integer q.
            let mut whole = Dim::default();
            let mut rest = Dim::default();
            for (monomial, coefficient) in self.terms() {
                whole.add_term(monomial.clone(), coefficient.div_euclid(c));
                rest.add_term(monomial.clone(), coefficient.rem_euclid(c));
            }
            let rest = match rest.as_constant() {
                Some(r) => Dim::constant(r.div_euclid(c)),
                None => Dim::atom(Atom::Div(Box::new(rest), Box::new(divisor.clone()))),
            };
            return whole.add(&rest);
        }
        match self.exact_quotient(divisor) {
            Some(quotient) => quotient,
            None => Dim::atom(Atom::Div(Box::new(self.clone()), Box::new(divisor.clone()))),
        }
    }

    pub fn rem(&self, divisor: &Dim) -> Dim {
        if let Some(c) = divisor.as_constant() {
            if c == 0 {
                return Dim::atom(Atom::Rem(Box::new(self.clone()), Box::new(divisor.clone())));
            }
            let mut rest = Dim::default();
            for (monomial, coefficient) in self.terms() {
                rest.add_term(monomial.clone(), coefficient.rem_euclid(c));
            }
            return match rest.as_constant() {
                Some(r) => Dim::constant(r.rem_euclid(c)),
                None => Dim::atom(Atom::Rem(Box::new(rest), Box::new(divisor.clone()))),
            };
        }
        if self.exact_quotient(divisor).is_some() {
            return Dim::default();
        }
        Dim::atom(Atom::Rem(Box::new(self.clone()), Box::new(divisor.clone())))
    }

    /// Rebuilds the dim with every atom replaced by `replace(atom)`, or by
    /// itself (its operands rewritten) where `replace` gives nothing.
    pub fn map_atoms(&self, replace: &mut dyn FnMut(&Atom) -> Option<Dim>) -> Dim {
        let mut result = Dim::default();
        for (monomial, coefficient) in self.terms() {
            let mut product = Dim::constant(coefficient);
            for atom in monomial {
                let rebuilt = match atom {
                    Atom::Div(a, b) => {
                        let (a, b) = (a.map_atoms(replace), b.map_atoms(replace));
                        a.div(&b)
                    }
                    Atom::Rem(a, b) => {
                        let (a, b) = (a.map_atoms(replace), b.map_atoms(replace));
                        a.rem(&b)
                    }
                    _ => Dim::atom(atom.clone()),
                };
                let replaced = match rebuilt.as_atom() {
                    Some(atom) => replace(atom).unwrap_or(rebuilt),
                    None => rebuilt,
                };
                product = product.mul(&replaced);
            }
            result = result.add(&product);
        }
        result
    }

    /// The value under an assignment of the generics (and shape sizes).
    pub fn evaluate(&self, value_of: &dyn Fn(&Atom) -> Option<i64>) -> Result<i64, EvalError> {
        let mut total: i64 = 0;
        for (monomial, coefficient) in self.terms() {
            let mut product = coefficient;
            for atom in monomial {
                let value = match atom {
                    Atom::Div(a, b) | Atom::Rem(a, b) => {
                        let (a, b) = (a.evaluate(value_of)?, b.evaluate(value_of)?);
                        if b == 0 {
                            return Err(EvalError::DivisionByZero);
                        }
                        if matches!(atom, Atom::Div(..)) {
                            a.div_euclid(b)
                        } else {
                            a.rem_euclid(b)
                        }
                    }
                    other => value_of(other).ok_or_else(|| EvalError::Unknown(other.clone()))?,
                };
                product = product.checked_mul(value).ok_or(EvalError::Overflow)?;
            }
            total = total.checked_add(product).ok_or(EvalError::Overflow)?;
        }
        Ok(total)
    }

    /// The value under values of the generics it mentions: the one way a
    /// dim is evaluated once its generics are bound (a variadic shape's size
    /// is not a generic's value, and is unknown here).
    pub fn value_under(&self, generics: &Generics) -> Result<i64, EvalError> {
        self.evaluate(&|atom| match atom {
            Atom::Generic(name) => generics.get(name).copied(),
            _ => None,
        })
    }

    /// Every generic this dim mentions.
    pub fn generics(&self, out: &mut Vec<Symbol>) {
        for (monomial, _) in self.terms() {
            for atom in monomial {
                match atom {
                    Atom::Generic(name) | Atom::ShapeSize(name) => out.push(name.clone()),
                    Atom::Div(a, b) | Atom::Rem(a, b) => {
                        a.generics(out);
                        b.generics(out);
                    }
                }
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum EvalError {
    Unknown(Atom),
    DivisionByZero,
    Overflow,
}

impl fmt::Display for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let operand = |f: &mut fmt::Formatter<'_>, dim: &Dim| {
            if dim.terms.len() > 1 || dim.terms.values().any(|c| *c != 1) && dim.as_constant().is_none() {
                write!(f, "({dim})")
            } else {
                write!(f, "{dim}")
            }
        };
        match self {
            Atom::Generic(name) => f.write_str(name),
            Atom::ShapeSize(name) => write!(f, "|{name}|"),
            Atom::Div(a, b) => {
                operand(f, a)?;
                f.write_str(" / ")?;
                operand(f, b)
            }
            Atom::Rem(a, b) => {
                operand(f, a)?;
                f.write_str(" % ")?;
                operand(f, b)
            }
        }
    }
}

impl fmt::Display for Dim {
    /// Terms of higher degree first, the constant last: `2 * KeyHeads * KeyDim + 1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return f.write_str("0");
        }
        let mut terms: Vec<(&Monomial, i64)> = self.terms().collect();
        terms.sort_by_key(|(monomial, _)| std::cmp::Reverse(monomial.len()));
        for (at, (monomial, coefficient)) in terms.into_iter().enumerate() {
            let magnitude = coefficient.abs();
            if at == 0 {
                if coefficient < 0 {
                    f.write_str("-")?;
                }
            } else {
                f.write_str(if coefficient < 0 { " - " } else { " + " })?;
            }
            let mut factors: Vec<String> = Vec::new();
            if magnitude != 1 || monomial.is_empty() {
                factors.push(magnitude.to_string());
            }
            for atom in monomial {
                match atom {
                    Atom::Div(..) | Atom::Rem(..) if monomial.len() > 1 || magnitude != 1 => {
                        factors.push(format!("({atom})"))
                    }
                    _ => factors.push(atom.to_string()),
                }
            }
            f.write_str(&factors.join(" * "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(name: &str) -> Dim {
        Dim::generic(name)
    }

    #[test]
    fn sums_and_products_normalize() {
        let head = g("HeadDim");
        let quarter = head.div(&Dim::constant(4));
        assert_eq!(quarter.add(&head.sub(&quarter)), head);
        let a = g("Heads").mul(&head).mul(&Dim::constant(2));
        let b = Dim::constant(2).mul(&head).mul(&g("Heads"));
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "2 * HeadDim * Heads");
    }

    #[test]
    fn constant_division_pulls_out_multiples() {
        let x = g("X").scale(6).add(&Dim::constant(3));
        assert_eq!(x.div(&Dim::constant(3)), g("X").scale(2).add(&Dim::constant(1)));
        assert_eq!(x.rem(&Dim::constant(3)), Dim::constant(0));
        assert_eq!(g("X").scale(4).div(&Dim::constant(2)), g("X").scale(2));
        assert!(g("X").div(&Dim::constant(2)).as_atom().is_some());
    }

    #[test]
    fn exact_division_by_a_monomial() {
        let bs = g("B").mul(&g("S"));
        assert_eq!(bs.div(&g("B")), g("S"));
        assert_eq!(bs.rem(&g("S")), Dim::default());
    }

    #[test]
    fn evaluation() {
        let d = g("HeadDim").div(&Dim::constant(4)).rem(&Dim::constant(2));
        let value = d.evaluate(&|atom| match atom {
            Atom::Generic(name) if &**name == "HeadDim" => Some(256),
            _ => None,
        });
        assert_eq!(value, Ok(0));
        assert_eq!(g("A").div(&g("B")).evaluate(&|_| Some(0)), Err(EvalError::DivisionByZero));
    }
}
