//! Where a model's parameters are in a GGUF file made by llama.cpp's
//! converter, for one instance of a package (its `gguf.json`, every size
//! evaluated): what an artifact records and the runtime's GGUF loader
//! applies. The frontend reads and evaluates `gguf.json` into these.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What the converter did to a parameter's values on the way into the
/// file, with sizes of type `N` (expressions as written, integers once
/// resolved).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Change<N> {
    /// The file holds the value plus this constant (`norm + 1`).
    Plus(f64),
    /// The file holds `-exp(value)`.
    NegatedExp,
    /// Along `axis`, from `from` on, `groups × per_group` heads of `head`
    /// elements are stored tiled (`[per_group][groups][head]`) where the
    /// parameter holds them grouped (`[groups][per_group][head]`).
    TiledHeads { axis: usize, from: N, groups: N, per_group: N, head: N },
    /// Along `axis`, each of `heads` heads of `head` elements holds its two
    /// halves interleaved (`[head / 2][2]`) where the parameter holds them
    /// one after the other (`[2][head / 2]`): llama.cpp's converter so
    /// permutes Llama's query and key rows for its rotary layout.
    RotaryPairs { axis: usize, heads: N, head: N },
    /// Each of the file's tensors holds its part of the parameter with the
    /// last two axes swapped (gpt-oss's experts, stored `[in, out]` in the
    /// checkpoint and `[out, in]` in the file); undone before the tensors
    /// are concatenated.
    Transposed,
}

/// Where one parameter's values are in the file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Source<N> {
    /// The file's tensors, concatenated along `axis` (one, usually).
    pub tensors: Vec<String>,
    pub axis: usize,
    pub changes: Vec<Change<N>>,
}

/// A metadata value the file must hold.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Expected {
    Int(i64),
    Float(f64),
}

/// A package's `gguf.json` for one instance: every size evaluated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GgufNames {
    /// `general.architecture` of the files it reads.
    pub architecture: String,
    pub metadata: BTreeMap<String, Expected>,
    /// What a key of `metadata` means where the file leaves it out (the
    /// converter writes some only where the checkpoint has them).
    #[serde(default)]
    pub absent_means: BTreeMap<String, Expected>,
    /// Parameter path to where its values are.
    pub tensors: BTreeMap<String, Source<i64>>,
    /// The rotary frequencies' divisors the card's settings give, which a
    /// file that stores its own (llama.cpp's `rope_freqs`) must agree with.
    #[serde(default)]
    pub rope_factors: Option<RopeFactors>,
}

/// A rotary scaling the converter writes as a tensor of the divisors of
/// the frequencies (Llama 3's `rope_freqs.weight`) rather than as metadata.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeFactors {
    /// The file's tensor of divisors, one per rotated pair.
    pub tensor: String,
    /// The divisors the card's settings give.
    pub factors: Vec<f64>,
    /// The card's settings that gave them, as an error shows them
    /// (`RopeFactor = 8, LowFreqFactor = 1, …`).
    pub settings: String,
}
