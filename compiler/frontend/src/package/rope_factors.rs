//! Rotary scalings that llama.cpp's converter writes as a tensor rather
//! than as metadata: for Llama 3's (`rope_type: "llama3"`) it stores the
//! divisor of each rotated pair's frequency (`rope_freqs.weight`) and no
//! setting of the scaling. A package's `gguf.json` names the generics its
//! scaling is written with:
//!
//! ```json
//! "rope_factors": { "tensor": "rope_freqs.weight",
//!   "llama3": { "dims": "HeadDim", "theta": "Theta", "factor": "RopeFactor",
//!               "low_freq_factor": "LowFreqFactor", "high_freq_factor": "HighFreqFactor",
//!               "original_context": "OriginalContext" } }
//! ```
//!
//! For one instance they give the divisors the file must hold, computed as
//! the converter computes them, so that a file scaled otherwise than the
//! card is refused instead of run with the card's scaling.

use super::gguf_names::{evaluate, SizeError};
use linnet_artifact::gguf_names::RopeFactors;
use serde::Deserialize;
use std::collections::HashMap;

/// `gguf.json`'s `rope_factors` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRopeFactors {
    tensor: String,
    llama3: Llama3Names,
}

/// The generics Llama 3's scaling is written with.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Llama3Names {
    dims: String,
    theta: String,
    factor: String,
    low_freq_factor: String,
    high_freq_factor: String,
    original_context: String,
}

/// The scaling of the instance whose generics are `values` (sizes) and
/// `numbers` (number settings).
pub fn resolve(
    raw: &RawRopeFactors,
    values: &HashMap<String, i64>,
    numbers: &HashMap<String, f64>,
) -> Result<RopeFactors, SizeError> {
    let names = &raw.llama3;
    let number = |name: &String| {
        let name = name.trim();
        numbers
            .get(name)
            .copied()
            .or_else(|| values.get(name).map(|&value| value as f64))
            .ok_or_else(|| SizeError(format!("`{name}` is not a generic of the model")))
    };
    let dims = evaluate(&names.dims, values)?;
    let dims = usize::try_from(dims).map_err(|_| SizeError(format!("`{}` is {dims}", names.dims)))?;
    let scaling = Llama3 {
        theta: number(&names.theta)?,
        factor: number(&names.factor)?,
        low_freq_factor: number(&names.low_freq_factor)?,
        high_freq_factor: number(&names.high_freq_factor)?,
        original_context: number(&names.original_context)?,
    };
    let settings = [
        (&names.factor, scaling.factor),
        (&names.low_freq_factor, scaling.low_freq_factor),
        (&names.high_freq_factor, scaling.high_freq_factor),
        (&names.original_context, scaling.original_context),
    ]
    .iter()
    .map(|(name, value)| format!("{} = {value}", name.trim()))
    .collect::<Vec<_>>()
    .join(", ");
    Ok(RopeFactors { tensor: raw.tensor.clone(), factors: scaling.divisors(dims), settings })
}

/// Llama 3's rotary scaling: frequencies whose wavelength is longer than
/// `original_context / low_freq_factor` divided by `factor`, those shorter
/// than `original_context / high_freq_factor` kept, those between blended.
struct Llama3 {
    theta: f64,
    factor: f64,
    low_freq_factor: f64,
    high_freq_factor: f64,
    original_context: f64,
}

impl Llama3 {
    /// Each rotated pair's divisor, for a head of `dims`.
    fn divisors(&self, dims: usize) -> Vec<f64> {
        let longest_kept = self.original_context / self.high_freq_factor;
        let shortest_divided = self.original_context / self.low_freq_factor;
        (0..dims / 2)
            .map(|pair| {
                let frequency = self.theta.powf(-((2 * pair) as f64) / dims as f64);
                let wavelength = 2.0 * std::f64::consts::PI / frequency;
                if wavelength < longest_kept {
                    1.0
                } else if wavelength > shortest_divided {
                    self.factor
                } else {
                    let smooth = (self.original_context / wavelength - self.low_freq_factor)
                        / (self.high_freq_factor - self.low_freq_factor);
                    1.0 / ((1.0 - smooth) / self.factor + smooth)
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw() -> RawRopeFactors {
        serde_json::from_str(
            r#"{"tensor": "rope_freqs.weight", "llama3": {"dims": "HeadDim", "theta": "Theta",
                "factor": "RopeFactor", "low_freq_factor": "LowFreqFactor",
                "high_freq_factor": "HighFreqFactor", "original_context": "OriginalContext"}}"#,
        )
        .unwrap()
    }

    fn numbers(factor: f64) -> HashMap<String, f64> {
        [("Theta", 500000.0), ("RopeFactor", factor), ("LowFreqFactor", 1.0), ("HighFreqFactor", 4.0)]
            .into_iter()
            .map(|(name, value)| (name.to_string(), value))
            .collect()
    }

    /// Llama 3.1 8B's scaling: the high frequencies kept, the low divided
    /// by 8, a blend between, as the converter's divisors are.
    #[test]
    fn llama_3_1_divides_the_low_frequencies_by_its_factor() {
        let values: HashMap<String, i64> = [("HeadDim".into(), 128), ("OriginalContext".into(), 8192)].into();
        let scaled = resolve(&raw(), &values, &numbers(8.0)).unwrap();
        assert_eq!(scaled.tensor, "rope_freqs.weight");
        assert_eq!(scaled.factors.len(), 64);
        assert_eq!(scaled.factors[0], 1.0);
        assert_eq!(scaled.factors[63], 8.0);
        let blended: Vec<f64> = scaled.factors.iter().copied().filter(|f| *f > 1.0 && *f < 8.0).collect();
        assert!(!blended.is_empty() && blended.windows(2).all(|pair| pair[0] < pair[1]), "{blended:?}");
        assert!(scaled.settings.contains("RopeFactor = 8") && scaled.settings.contains("OriginalContext = 8192"));
        let plain = resolve(&raw(), &values, &numbers(1.0)).unwrap();
        assert!(plain.factors.iter().all(|f| *f == 1.0), "{:?}", plain.factors);
    }

    #[test]
    fn a_generic_the_model_lacks_is_named() {
        let values: HashMap<String, i64> = [("HeadDim".into(), 128)].into();
        let error = resolve(&raw(), &values, &numbers(8.0)).err().unwrap();
        assert!(error.0.contains("`OriginalContext`"), "{error}");
    }
}
