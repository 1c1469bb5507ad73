//! The prefix cache: what a prompt left in its row (every state's row,
//! `Machine::state_rows`: the attention caches' filled positions, the
//! DeltaNet and convolution states) at a block boundary of the prompt,
//! keyed by the tokens before it, kept under a memory budget and evicted
//! least recently used first. A request whose prompt starts with a cached
//! prefix has it written back into its row and prefills only the rest.
//!
//! A recurrent state cannot be cut back to an earlier position, so a
//! snapshot serves only prompts that share all of its tokens. Snapshots
//! are taken where later prompts are likely to part: at the last boundary
//! of the prompt (a conversation's next turn continues it) and at the last
//! boundary before the prompt parts from a recent one (requests that share
//! a system prompt part right after it).
//!
//! With KV-cache events on, a ledger of the blocks the snapshots hold
//! records what each kept or evicted snapshot changes, for the scheduler
//! to publish.

use super::kv_events::{BlockLedger, KvEvent};
use linnet_exec::tensor::Tensor;
use std::collections::VecDeque;

/// How many recent prompts are compared with a new one.
const RECENT_PROMPTS: usize = 32;

struct Snapshot {
    tokens: Vec<i64>,
    rows: Vec<Tensor>,
    bytes: usize,
    last_used: u64,
}

pub struct PrefixCache {
    budget: usize,
    block: usize,
    snapshots: Vec<Snapshot>,
    used: usize,
    clock: u64,
    recent: VecDeque<Vec<i64>>,
    ledger: Option<BlockLedger>,
}

/// What a lookup found: the cached prefix's length and the rows to
/// restore.
pub struct Hit<'a> {
    pub tokens: usize,
    pub rows: &'a [Tensor],
}

impl PrefixCache {
    /// A cache of at most `budget` bytes of snapshots at multiples of
    /// `block` tokens; a budget of 0 keeps nothing.
    pub fn new(budget: usize, block: usize) -> PrefixCache {
        PrefixCache {
            budget,
            block: block.max(1),
            snapshots: Vec::new(),
            used: 0,
            clock: 0,
            recent: VecDeque::new(),
            ledger: None,
        }
    }

    /// The cache recording, in `ledger`, the blocks its snapshots hold.
    pub fn with_ledger(self, ledger: BlockLedger) -> PrefixCache {
        PrefixCache { ledger: Some(ledger), ..self }
    }

    /// What the snapshots kept and evicted since the last call changed
    /// in the blocks held, in order (none without a ledger).
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.ledger.as_mut().map(BlockLedger::take).unwrap_or_default()
    }

    /// The bytes the snapshots hold now.
    pub fn bytes(&self) -> usize {
        self.used
    }

    /// The longest cached prefix of `prompt` that leaves at least one of
    /// its tokens to prefill (whose logits the request needs).
    pub fn find(&mut self, prompt: &[i64]) -> Option<Hit<'_>> {
        self.clock += 1;
        let best = self
            .snapshots
            .iter_mut()
            .filter(|snapshot| snapshot.tokens.len() < prompt.len() && prompt.starts_with(&snapshot.tokens))
            .max_by_key(|snapshot| snapshot.tokens.len())?;
        best.last_used = self.clock;
        Some(Hit { tokens: best.tokens.len(), rows: &best.rows })
    }

    /// Where to snapshot `prompt` while it is prefilled from `start`, in
    /// order: the last block boundary before it parts from a recent prompt,
    /// and its own last boundary before its end; none already cached. The
    /// prompt is remembered for the prompts after it.
    pub fn save_points(&mut self, prompt: &[i64], start: usize) -> Vec<usize> {
        if self.budget == 0 {
            return Vec::new();
        }
        let shared = self.recent.iter().map(|other| common_prefix(prompt, other)).max().unwrap_or(0);
        let last = prompt.len().saturating_sub(1);
        let mut points: Vec<usize> = [shared.min(last), last].iter().map(|&at| at / self.block * self.block).collect();
        points.dedup();
        points.retain(|&point| point > start && !self.holds(&prompt[..point]));
        if self.recent.len() == RECENT_PROMPTS {
            self.recent.pop_back();
        }
        self.recent.push_front(prompt.to_vec());
        points
    }

    fn holds(&self, tokens: &[i64]) -> bool {
        self.snapshots.iter().any(|snapshot| snapshot.tokens == tokens)
    }

    /// Keeps `rows`, what the prompt `tokens` left in its row, evicting the
    /// least recently used snapshots to stay within the budget. A snapshot
    /// larger than the whole budget is not kept.
    pub fn insert(&mut self, tokens: &[i64], rows: Vec<Tensor>) {
        let bytes = rows.iter().map(|row| row.len() * element_bytes(row)).sum::<usize>();
        if bytes > self.budget || self.holds(tokens) {
            return;
        }
        while self.used + bytes > self.budget {
            let oldest = (0..self.snapshots.len()).min_by_key(|&at| self.snapshots[at].last_used).expect("over budget");
            let evicted = self.snapshots.swap_remove(oldest);
            self.used -= evicted.bytes;
            if let Some(ledger) = &mut self.ledger {
                ledger.dropped(&evicted.tokens);
            }
        }
        self.clock += 1;
        self.used += bytes;
        if let Some(ledger) = &mut self.ledger {
            ledger.kept(tokens);
        }
        self.snapshots.push(Snapshot { tokens: tokens.to_vec(), rows, bytes, last_used: self.clock });
    }
}

fn common_prefix(a: &[i64], b: &[i64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The bytes an element of `tensor` takes on the host.
fn element_bytes(tensor: &Tensor) -> usize {
    use linnet_exec::tensor::Data;
    match &tensor.data {
        Data::F32(_) => 4,
        Data::I64(_) => 8,
        Data::Bool(_) => 1,
        Data::Bf16(_) => 2,
        Data::Blocks(..) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use linnet_ir::Dtype;

    fn rows(floats: usize) -> Vec<Tensor> {
        vec![Tensor::from_f32(Dtype::F32, vec![floats], vec![0.0; floats])]
    }

    #[test]
    fn a_prompt_finds_its_longest_cached_prefix_and_keeps_a_token() {
        let mut cache = PrefixCache::new(1 << 20, 4);
        cache.insert(&[1, 2, 3, 4], rows(8));
        cache.insert(&[1, 2, 3, 4, 5, 6, 7, 8], rows(8));
        assert_eq!(cache.find(&[1, 2, 3, 4, 5, 6, 7, 8, 9]).map(|hit| hit.tokens), Some(8));
        // The whole prompt cached leaves no token for its logits.
        assert_eq!(cache.find(&[1, 2, 3, 4, 5, 6, 7, 8]).map(|hit| hit.tokens), Some(4));
        assert_eq!(cache.find(&[1, 2, 3, 9, 9]).map(|hit| hit.tokens), None);
    }

    #[test]
    fn snapshots_are_taken_where_prompts_part_and_at_their_last_block() {
        let mut cache = PrefixCache::new(1 << 20, 4);
        let system: Vec<i64> = (0..10).collect();
        let first = [&system[..], &[100, 101, 102]].concat();
        // Alone: its last boundary before its end (12 of 13 tokens).
        assert_eq!(cache.save_points(&first, 0), vec![12]);
        let second = [&system[..], &[200, 201, 202, 203, 204]].concat();
        // Parting from the first after 10 tokens: at 8, and its own 12.
        assert_eq!(cache.save_points(&second, 0), vec![8, 12]);
        cache.insert(&second[..8], rows(1));
        let third = [&system[..], &[300]].concat();
        // Both its points are 8, where it starts from the cache.
        assert_eq!(cache.save_points(&third, 8), Vec::<usize>::new());
        assert!(PrefixCache::new(0, 4).save_points(&first, 0).is_empty(), "no budget, no snapshots");
    }

    #[test]
    fn the_least_recently_used_snapshot_goes_first() {
        let mut cache = PrefixCache::new(100, 1);
        cache.insert(&[1], rows(10));
        cache.insert(&[2], rows(10));
        assert!(cache.find(&[1, 0]).is_some());
        cache.insert(&[3], rows(10));
        assert_eq!(cache.bytes(), 80);
        assert!(cache.find(&[2, 0]).is_none(), "the least recently used was evicted");
        assert!(cache.find(&[1, 0]).is_some() && cache.find(&[3, 0]).is_some());
        cache.insert(&[4], rows(26));
        assert!(cache.find(&[4, 0]).is_none(), "larger than the whole budget: not kept");
    }

    #[test]
    fn kept_and_evicted_snapshots_are_recorded_as_blocks_stored_and_removed() {
        use crate::kv_events::BlockHasher;
        let hashes = BlockHasher::new("0").chain(&[1, 2, 3, 4], 2);
        let mut cache = PrefixCache::new(100, 2).with_ledger(BlockLedger::new(BlockHasher::new("0"), 2));
        cache.insert(&[1, 2], rows(10));
        cache.insert(&[1, 2, 3, 4], rows(10));
        let stored: Vec<Vec<u64>> = cache
            .take_events()
            .into_iter()
            .map(|event| match event {
                KvEvent::BlockStored { block_hashes, .. } => block_hashes,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(stored, [vec![hashes[0]], vec![hashes[1]]]);
        // [1, 2] is the least recently used: evicted, its block still held
        // by [1, 2, 3, 4]; then [1, 2, 3, 4] goes, and both blocks with it.
        cache.insert(&[5, 6], rows(10));
        cache.insert(&[7, 8], rows(10));
        let removed: Vec<KvEvent> =
            cache.take_events().into_iter().filter(|event| matches!(event, KvEvent::BlockRemoved { .. })).collect();
        assert_eq!(removed, [KvEvent::BlockRemoved { block_hashes: hashes.clone() }]);
        assert!(PrefixCache::new(100, 2).take_events().is_empty());
    }
}
