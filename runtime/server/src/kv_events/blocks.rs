//! The names routers give cached prefixes, and the ledger of the blocks
//! this replica's prefix cache holds.
//!
//! A prefix is named block by block, each block's hash chained on its
//! parent's as vLLM's `sha256_cbor` prefix-caching hash chains them: the
//! SHA-256 of the canonical CBOR of (parent hash, the block's tokens,
//! None), the first block's parent the SHA-256 of the canonical CBOR of
//! the hash seed (vLLM's `PYTHONHASHSEED`). Events carry each hash as vLLM
//! gives them, its last 8 bytes as an unsigned big-endian integer.
//!
//! A snapshot of the first `n` blocks of a prompt holds each of those
//! blocks; a block is stored when the first snapshot that holds it is
//! kept and removed when the last one goes.

use super::wire::KvEvent;
use sha2::{Digest, Sha256};
use std::collections::HashMap;

/// A block's whole hash: the parent of the next block's.
type Digest32 = [u8; 32];

/// Chains block hashes from a seed.
pub struct BlockHasher {
    root: Digest32,
}

impl BlockHasher {
    /// Replicas given the same seed name the same prefixes alike.
    pub fn new(seed: &str) -> BlockHasher {
        let mut cbor = Vec::with_capacity(seed.len() + 9);
        cbor_head(&mut cbor, TEXT, seed.len() as u64);
        cbor.extend_from_slice(seed.as_bytes());
        BlockHasher { root: Sha256::digest(&cbor).into() }
    }

    /// The hash of each whole block of `block` tokens in `tokens`, in order.
    pub fn chain(&self, tokens: &[i64], block: usize) -> Vec<u64> {
        let mut parent = self.root;
        let mut cbor = Vec::new();
        tokens
            .chunks_exact(block)
            .map(|tokens| {
                cbor.clear();
                cbor.push(0x83); // an array of three
                cbor_head(&mut cbor, BYTES, parent.len() as u64);
                cbor.extend_from_slice(&parent);
                cbor_head(&mut cbor, ARRAY, tokens.len() as u64);
                for &token in tokens {
                    // Token ids are never negative.
                    cbor_head(&mut cbor, UNSIGNED, token as u64);
                }
                cbor.push(0xf6); // None: no extra keys
                parent = Sha256::digest(&cbor).into();
                u64::from_be_bytes(parent[24..].try_into().expect("eight bytes"))
            })
            .collect()
    }
}

const UNSIGNED: u8 = 0;
const BYTES: u8 = 2;
const TEXT: u8 = 3;
const ARRAY: u8 = 4;

/// A CBOR item's head in its shortest form, as canonical CBOR has it.
fn cbor_head(out: &mut Vec<u8>, major: u8, value: u64) {
    let major = major << 5;
    match value {
        0..24 => out.push(major | value as u8),
        24..0x100 => out.extend_from_slice(&[major | 24, value as u8]),
        0x100..0x1_0000 => {
            out.push(major | 25);
            out.extend_from_slice(&(value as u16).to_be_bytes());
        }
        0x1_0000..0x1_0000_0000 => {
            out.push(major | 26);
            out.extend_from_slice(&(value as u32).to_be_bytes());
        }
        _ => {
            out.push(major | 27);
            out.extend_from_slice(&value.to_be_bytes());
        }
    }
}

/// The blocks the prefix cache's snapshots hold, each with how many
/// snapshots hold it, and the events not yet published.
pub struct BlockLedger {
    hasher: BlockHasher,
    block: usize,
    holders: HashMap<u64, usize>,
    pending: Vec<KvEvent>,
}

impl BlockLedger {
    pub fn new(hasher: BlockHasher, block: usize) -> BlockLedger {
        BlockLedger { hasher, block: block.max(1), holders: HashMap::new(), pending: Vec::new() }
    }

    /// A snapshot of `prefix` (whole blocks) was kept: the blocks no other
    /// snapshot held are stored. They are the prefix's last blocks, since
    /// a snapshot that holds a block holds every block before it.
    pub fn kept(&mut self, prefix: &[i64]) {
        let hashes = self.hasher.chain(prefix, self.block);
        let first_new = hashes.iter().position(|hash| !self.holders.contains_key(hash)).unwrap_or(hashes.len());
        for &hash in &hashes {
            *self.holders.entry(hash).or_default() += 1;
        }
        if first_new < hashes.len() {
            self.pending.push(KvEvent::BlockStored {
                parent_block_hash: first_new.checked_sub(1).map(|parent| hashes[parent]),
                token_ids: prefix[first_new * self.block..hashes.len() * self.block].to_vec(),
                block_hashes: hashes[first_new..].to_vec(),
                block_size: self.block,
            });
        }
    }

    /// A snapshot of `prefix` was evicted: the blocks no snapshot holds
    /// any longer are removed.
    pub fn dropped(&mut self, prefix: &[i64]) {
        let mut removed = Vec::new();
        for hash in self.hasher.chain(prefix, self.block) {
            if let Some(holders) = self.holders.get_mut(&hash) {
                *holders -= 1;
                if *holders == 0 {
                    self.holders.remove(&hash);
                    removed.push(hash);
                }
            }
        }
        if !removed.is_empty() {
            self.pending.push(KvEvent::BlockRemoved { block_hashes: removed });
        }
    }

    /// The events since the last call, in order.
    pub fn take(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_events::wire::tests::Expected;

    #[test]
    fn blocks_are_named_as_vllm_names_them() {
        let expected = Expected::read();
        let hasher = BlockHasher::new(&expected.seed);
        assert_eq!(hasher.chain(&expected.tokens, expected.block_size), expected.hashes);
        // A partial last block has no name.
        assert_eq!(hasher.chain(&expected.tokens[..7], expected.block_size), expected.hashes[..1]);
        assert_ne!(BlockHasher::new("1").chain(&expected.tokens, 4), expected.hashes, "the seed matters");
    }

    #[test]
    fn a_block_is_stored_with_its_first_holder_and_removed_with_its_last() {
        let mut ledger = BlockLedger::new(BlockHasher::new("0"), 2);
        let hashes = BlockHasher::new("0").chain(&[1, 2, 3, 4, 5, 6], 2);
        ledger.kept(&[1, 2, 3, 4]);
        ledger.kept(&[1, 2, 3, 4, 5, 6]);
        ledger.kept(&[1, 2, 3, 4]);
        assert_eq!(
            ledger.take(),
            [
                KvEvent::BlockStored {
                    block_hashes: hashes[..2].to_vec(),
                    parent_block_hash: None,
                    token_ids: vec![1, 2, 3, 4],
                    block_size: 2
                },
                KvEvent::BlockStored {
                    block_hashes: hashes[2..].to_vec(),
                    parent_block_hash: Some(hashes[1]),
                    token_ids: vec![5, 6],
                    block_size: 2
                },
            ]
        );
        ledger.dropped(&[1, 2, 3, 4, 5, 6]);
        assert_eq!(ledger.take(), [KvEvent::BlockRemoved { block_hashes: hashes[2..].to_vec() }]);
        ledger.dropped(&[1, 2, 3, 4]);
        assert_eq!(ledger.take(), [], "still held by the other snapshot of the same prefix");
        ledger.dropped(&[1, 2, 3, 4]);
        assert_eq!(ledger.take(), [KvEvent::BlockRemoved { block_hashes: hashes[..2].to_vec() }]);
    }
}
