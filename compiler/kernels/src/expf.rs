//! `e^x` in f32 as compiled kernels compute it (the reference's is
//! `numerics`' f64 `libm`): `x = n·ln 2 + r` with `|r| ≤ ln 2 / 2` (ln 2 in
//! two parts, so that `n·ln 2` is exact), Cephes' `expf` polynomial for
//! `e^r`, and `2^n` as two factors so that subnormal results are reached;
//! infinity above the largest finite result, zero below the smallest
//! subnormal, NaN for NaN; within two units in the last place. The
//! constants are shared by the Rust form here (the runtime kernels, which
//! the compiler vectorizes) and the lanes generated code computes
//! (`codegen::cpu::lanes`), so the two cannot drift apart.

/// ln 2 as a part with few bits (so that `n` times it is exact) and the rest.
pub const LN2_HIGH: f32 = 0.693_359_4;
pub const LN2_LOW: f32 = -2.121_944_4e-4;

/// Cephes' `expf` polynomial for `(e^r - 1 - r) / r²`, highest degree first.
pub const POLYNOMIAL: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];

/// Above this the result is infinite (ln of the largest f32).
pub const LARGEST: f32 = 88.722_84;

/// Below this the result rounds to zero (ln of half the smallest
/// subnormal).
pub const SMALLEST: f32 = -103.972_08;

/// `e^x`, in straight-line code the compiler vectorizes.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = x - n * LN2_HIGH - n * LN2_LOW;
    let p = POLYNOMIAL[1..].iter().fold(POLYNOMIAL[0], |p, c| p * r + c);
    let y = p * r * r + r + 1.0;
    // A saturating conversion: out of range (or NaN) only where the
    // result is decided below, or is NaN already.
    let whole = n as i32;
    let half = whole >> 1;
    let factor = |e: i32| f32::from_bits((e.wrapping_add(127) as u32) << 23);
    let value = y * factor(half) * factor(whole.wrapping_sub(half));
    if x > LARGEST {
        f32::INFINITY
    } else if x < SMALLEST {
        0.0
    } else {
        value
    }
}

#[cfg(test)]
mod tests {
    /// Within two units in the last place of the correctly rounded
    /// result over the whole range, the same infinities, zeros and NaN.
    #[test]
    fn exp_is_within_two_ulps() {
        let mut x = -110.0f32;
        while x < 90.0 {
            let want = (f64::from(x)).exp() as f32;
            let got = super::exp(x);
            let close = if want == 0.0 || want.is_infinite() {
                got == want
            } else if want < f32::MIN_POSITIVE {
                (want - got).abs() <= f32::from_bits(1)
            } else {
                (want - got).abs() <= 2.0 * f32::EPSILON * want.abs()
            };
            assert!(close, "exp({x:e}) is {got:e}, not {want:e}");
            x += 0.001_37;
        }
        assert!(super::exp(f32::NAN).is_nan());
        assert_eq!(super::exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(super::exp(f32::NEG_INFINITY), 0.0);
    }
}
