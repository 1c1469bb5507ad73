//! The numerics of record (`docs/language.md`, "Numerics"): how a float is
//! rounded to each dtype, how integers wrap, divide and take remainders,
//! and the elementary functions. The reference interpreter, constant
//! folding and the CPU backend's helpers all compute through these, and
//! nothing here depends on the host: rounding is done with exact f64
//! operations (no F16C, no `half`), and the functions come from the
//! portable `libm` crate, so the reference gives the same bits on every
//! machine.

use crate::BinaryOp;
use crate::Dtype;

/// A binary float format narrower than f64: explicit mantissa bits and
/// the exponent range of its normal numbers.
#[derive(Clone, Copy, Debug)]
struct Format {
    mantissa_bits: i32,
    min_exponent: i32,
    max_exponent: i32,
}

const BF16: Format = Format { mantissa_bits: 7, min_exponent: -126, max_exponent: 127 };
const F16: Format = Format { mantissa_bits: 10, min_exponent: -14, max_exponent: 15 };

/// `2^exponent` as an f64, for exponents of normal f64 numbers.
fn power_of_two(exponent: i32) -> f64 {
    debug_assert!((-1022..=1023).contains(&exponent));
    f64::from_bits(((exponent + 1023) as u64) << 52)
}

impl Format {
    fn largest(self) -> f64 {
        (2.0 - power_of_two(-self.mantissa_bits)) * power_of_two(self.max_exponent)
    }

    /// `value` rounded to the nearest number of this format, ties to even;
    /// past the largest finite number, infinity. Every step is exact in
    /// f64: the quantum is a power of two, so scaling by it never rounds.
    fn round(self, value: f64) -> f64 {
        if !value.is_finite() || value == 0.0 {
            return value;
        }
        let biased = ((value.to_bits() >> 52) & 0x7ff) as i32;
        // f64 subnormals lie far below every format's smallest quantum.
        let exponent = (biased - 1023).max(self.min_exponent);
        let quantum = power_of_two(exponent - self.mantissa_bits);
        let rounded = (value / quantum).round_ties_even() * quantum;
        if rounded.abs() > self.largest() {
            f64::INFINITY.copysign(value)
        } else {
            rounded
        }
    }
}

/// A float rounded to `dtype` (nearest-even), held in f64; other dtypes
/// pass through.
pub fn round(value: f64, dtype: Dtype) -> f64 {
    match dtype {
        // IEEE conversion, nearest-even: the same on every host.
        Dtype::F32 => value as f32 as f64,
        Dtype::Bf16 => BF16.round(value),
        Dtype::F16 => F16.round(value),
        _ => value,
    }
}

/// A bf16 value from its bits.
pub fn bf16_value(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// An f16 value from its bits, exactly.
#[inline]
pub fn f16_value(bits: u16) -> f32 {
    let sign = u32::from(bits & 0x8000) << 16;
    let exponent = u32::from(bits >> 10) & 0x1f;
    let mantissa = u32::from(bits & 0x3ff);
    match exponent {
        0 => {
            let magnitude = mantissa as f32 * f32::from_bits(0x3380_0000); // 2^-24
            f32::from_bits(sign | magnitude.to_bits())
        }
        0x1f => f32::from_bits(sign | 0x7f80_0000 | (mantissa << 13)),
        _ => f32::from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13)),
    }
}

/// The bits of `value` rounded to f16, nearest-even (past the largest
/// finite f16 an infinity; a NaN stays a quiet NaN).
pub fn f16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let magnitude = bits & 0x7fff_ffff;
    if magnitude > 0x7f80_0000 {
        return sign | 0x7e00;
    }
    if magnitude >= 0x477f_f000 {
        return sign | 0x7c00;
    }
    if magnitude < 0x3880_0000 {
        // Below the smallest normal: a multiple of 2^-24, exact in f32.
        let units = (f32::from_bits(magnitude) * 16_777_216.0).round_ties_even();
        return sign | units as u16;
    }
    let exponent = (magnitude >> 23) + 15 - 127;
    let mantissa = magnitude & 0x7f_ffff;
    let mut half = (exponent << 10) | (mantissa >> 13);
    let rest = mantissa & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && half & 1 == 1) {
        half += 1;
    }
    sign | half as u16
}

/// The bits of `value` rounded to bf16 (a NaN stays a quiet NaN).
pub fn bf16_bits(value: f32) -> u16 {
    if value.is_nan() {
        return ((value.to_bits() >> 16) as u16) | 0x0040;
    }
    ((BF16.round(value as f64) as f32).to_bits() >> 16) as u16
}

/// An integer wrapped to `dtype`.
pub fn wrap(value: i64, dtype: Dtype) -> i64 {
    match dtype {
        Dtype::I32 => value as i32 as i64,
        _ => value,
    }
}

/// Integer floor division as the language defines it: by zero gives 0,
/// overflow wraps.
pub fn div_euclid(x: i64, y: i64) -> i64 {
    if y == 0 {
        0
    } else {
        x.wrapping_div_euclid(y)
    }
}

/// The remainder matching `div_euclid`.
pub fn rem_euclid(x: i64, y: i64) -> i64 {
    if y == 0 {
        0
    } else {
        x.wrapping_rem_euclid(y)
    }
}

/// An arithmetic operator on integers as the language defines it:
/// wrapping, Euclidean division and remainder, by zero giving 0.
pub fn integer(op: BinaryOp, x: i64, y: i64) -> i64 {
    match op {
        BinaryOp::Add => x.wrapping_add(y),
        BinaryOp::Sub => x.wrapping_sub(y),
        BinaryOp::Mul => x.wrapping_mul(y),
        BinaryOp::Div => div_euclid(x, y),
        BinaryOp::Rem => rem_euclid(x, y),
        BinaryOp::Max => x.max(y),
        BinaryOp::Min => x.min(y),
        BinaryOp::Cmp(_) | BinaryOp::And | BinaryOp::Or => unreachable!("{op:?} is not arithmetic"),
    }
}

/// An arithmetic operator on floats, in f64 (the result is rounded to its
/// type by the caller); `max` and `min` return the number when one side is
/// NaN.
pub fn float(op: BinaryOp, x: f64, y: f64) -> f64 {
    match op {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Rem => x % y,
        BinaryOp::Max => x.max(y),
        BinaryOp::Min => x.min(y),
        BinaryOp::Cmp(_) | BinaryOp::And | BinaryOp::Or => unreachable!("{op:?} is not arithmetic"),
    }
}

/// The elementary functions of record, from `libm` (portable, the same
/// bits everywhere), in f64.
pub mod math {
    pub fn exp(x: f64) -> f64 {
        libm::exp(x)
    }
    pub fn ln(x: f64) -> f64 {
        libm::log(x)
    }
    pub fn cos(x: f64) -> f64 {
        libm::cos(x)
    }
    pub fn sin(x: f64) -> f64 {
        libm::sin(x)
    }
    pub fn tanh(x: f64) -> f64 {
        libm::tanh(x)
    }
    pub fn sqrt(x: f64) -> f64 {
        // IEEE square root is correctly rounded on every host.
        x.sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every finite number of a 16-bit format, in increasing order of
    /// magnitude, from its bits.
    fn positives(format: Format, from_bits: impl Fn(u16) -> f64) -> Vec<f64> {
        let count = 1u32 << 15;
        let values: Vec<f64> = (0..count).map(|bits| from_bits(bits as u16)).filter(|v| v.is_finite()).collect();
        assert!(values.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(*values.last().unwrap(), format.largest());
        values
    }

    fn f16_from_bits(bits: u16) -> f64 {
        let (exponent, mantissa) = (i32::from((bits >> 10) & 0x1f), f64::from(bits & 0x3ff));
        match exponent {
            0 => mantissa * power_of_two(-24),
            31 => f64::NAN,
            _ => (1024.0 + mantissa) * power_of_two(exponent - 25),
        }
    }

    /// Exhaustive over rounding boundaries: each number of the format
    /// rounds to itself; the midpoint between two neighbours rounds to the
    /// one with an even last bit, and the nearest f64s on either side of it
    /// to the nearer neighbour; past the largest number's half-way point
    /// lies infinity. The table comes from the formats' bit layouts, not
    /// from any rounding library.
    fn check_format(format: Format, dtype: Dtype, values: &[f64]) {
        for (bits, pair) in values.windows(2).enumerate() {
            let (low, high) = (pair[0], pair[1]);
            let mid = (low + high) / 2.0;
            let even = if bits % 2 == 0 { low } else { high };
            for sign in [1.0, -1.0] {
                assert_eq!(round(sign * low, dtype).to_bits(), (sign * low).to_bits());
                assert_eq!(round(sign * mid, dtype), sign * even, "{dtype:?}: tie at {mid:e}");
                assert_eq!(round(sign * mid.next_down(), dtype), sign * low, "{dtype:?}: below {mid:e}");
                assert_eq!(round(sign * mid.next_up(), dtype), sign * high, "{dtype:?}: above {mid:e}");
            }
        }
        let top = format.largest();
        let half_ulp = power_of_two(format.max_exponent - format.mantissa_bits - 1);
        assert_eq!(round(top + half_ulp, dtype), f64::INFINITY);
        assert_eq!(round((top + half_ulp).next_down(), dtype), top);
        assert_eq!(round(-(top + half_ulp), dtype), f64::NEG_INFINITY);
        assert!(round(f64::NAN, dtype).is_nan());
        assert_eq!(round(-0.0, dtype).to_bits(), (-0.0f64).to_bits());
        assert_eq!(round(f64::MIN_POSITIVE / 4.0, dtype), 0.0);
    }

    #[test]
    fn bf16_rounds_to_nearest_even_at_every_boundary() {
        let values = positives(BF16, |bits| f64::from(bf16_value(bits)));
        check_format(BF16, Dtype::Bf16, &values);
    }

    #[test]
    fn f16_rounds_to_nearest_even_at_every_boundary() {
        let values = positives(F16, f16_from_bits);
        check_format(F16, Dtype::F16, &values);
    }

    /// Rounding an f32 to bf16 agrees with the integer formulation
    /// (add 0x7fff plus the kept low bit, truncate) on a large sample of
    /// every exponent: all upper halves with low halves at and around the
    /// tie.
    #[test]
    fn bf16_bits_agree_with_the_integer_formulation() {
        for high in 0u32..=0xffff {
            for low in [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xc000, 0xffff, high.wrapping_mul(2654435761) & 0xffff] {
                let value = f32::from_bits(high << 16 | low);
                if value.is_nan() {
                    assert!(bf16_value(bf16_bits(value)).is_nan());
                    continue;
                }
                let bits = value.to_bits();
                let expected = ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16;
                assert_eq!(bf16_bits(value), expected, "{value:e} ({bits:#010x})");
            }
        }
    }

    #[test]
    fn integer_division_is_euclidean_and_total() {
        assert_eq!((div_euclid(-7, 2), rem_euclid(-7, 2)), (-4, 1));
        assert_eq!((div_euclid(7, -2), rem_euclid(7, -2)), (-3, 1));
        assert_eq!((div_euclid(5, 0), rem_euclid(5, 0)), (0, 0));
        assert_eq!(div_euclid(i64::MIN, -1), i64::MIN);
        assert_eq!(wrap(1 << 31, Dtype::I32), -(1 << 31));
    }
}
