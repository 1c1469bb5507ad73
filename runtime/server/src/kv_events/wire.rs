//! KV-cache events as vLLM publishes them: a batch is the MessagePack of
//! `[ts, [event, …]]`, each event an array led by its kind's name
//! (msgspec's array-like tagged structs, the schema vLLM's subscribers,
//! llm-d's KV-cache indexer and Dynamo's router decode):
//! `["BlockStored", block_hashes, parent_block_hash, token_ids,
//! block_size, lora_id, medium]`, `["BlockRemoved", block_hashes, medium]`,
//! `["AllBlocksCleared"]`. Linnet has no LoRA adapters and one medium, so
//! `lora_id` and `medium` are always nil.

use rmp::encode;

/// A change in what the replica's prefix cache holds.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    /// Blocks now held, consecutive in their prefix: the first's parent
    /// (none for a prefix's first block) and the tokens of them all.
    BlockStored { block_hashes: Vec<u64>, parent_block_hash: Option<u64>, token_ids: Vec<i64>, block_size: usize },
    /// Blocks no longer held.
    BlockRemoved { block_hashes: Vec<u64> },
    /// Nothing is held any more (the server stopped).
    AllBlocksCleared,
}

/// The MessagePack of one batch of events, stamped `ts` (seconds since
/// the Unix epoch).
pub fn encode_batch(ts: f64, events: &[KvEvent]) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing to a Vec cannot fail.
    let written: Result<(), encode::ValueWriteError> = (|| {
        encode::write_array_len(&mut out, 2)?;
        encode::write_f64(&mut out, ts)?;
        encode::write_array_len(&mut out, events.len() as u32)?;
        for event in events {
            write_event(&mut out, event)?;
        }
        Ok(())
    })();
    written.expect("writing to memory");
    out
}

fn write_event(out: &mut Vec<u8>, event: &KvEvent) -> Result<(), encode::ValueWriteError> {
    match event {
        KvEvent::BlockStored { block_hashes, parent_block_hash, token_ids, block_size } => {
            encode::write_array_len(out, 7)?;
            encode::write_str(out, "BlockStored")?;
            write_hashes(out, block_hashes)?;
            match parent_block_hash {
                Some(parent) => encode::write_uint(out, *parent).map(drop)?,
                None => nil(out)?,
            }
            encode::write_array_len(out, token_ids.len() as u32)?;
            for &token in token_ids {
                // Token ids are never negative.
                encode::write_uint(out, token as u64)?;
            }
            encode::write_uint(out, *block_size as u64)?;
            nil(out)?; // lora_id
            nil(out)?; // medium
        }
        KvEvent::BlockRemoved { block_hashes } => {
            encode::write_array_len(out, 3)?;
            encode::write_str(out, "BlockRemoved")?;
            write_hashes(out, block_hashes)?;
            nil(out)?; // medium
        }
        KvEvent::AllBlocksCleared => {
            encode::write_array_len(out, 1)?;
            encode::write_str(out, "AllBlocksCleared")?;
        }
    }
    Ok(())
}

fn nil(out: &mut Vec<u8>) -> Result<(), encode::ValueWriteError> {
    encode::write_nil(out).map_err(encode::ValueWriteError::InvalidMarkerWrite)
}

fn write_hashes(out: &mut Vec<u8>, hashes: &[u64]) -> Result<(), encode::ValueWriteError> {
    encode::write_array_len(out, hashes.len() as u32)?;
    for &hash in hashes {
        encode::write_uint(out, hash)?;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::Value;

    /// `tests/fixtures/kv-events/expected.json`: what msgspec and vLLM's
    /// hash chain make of known tokens and events (`make.py` there).
    pub struct Expected {
        pub seed: String,
        pub block_size: usize,
        pub tokens: Vec<i64>,
        pub hashes: Vec<u64>,
        pub ts: f64,
        pub events: Vec<KvEvent>,
        pub batch: String,
    }

    impl Expected {
        pub fn read() -> Expected {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/kv-events/expected.json");
            let value: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
            let numbers = |value: &Value| -> Vec<u64> {
                value.as_array().unwrap().iter().map(|number| number.as_u64().unwrap()).collect()
            };
            let events = value["events"]
                .as_array()
                .unwrap()
                .iter()
                .map(|event| match event["kind"].as_str().unwrap() {
                    "BlockStored" => KvEvent::BlockStored {
                        block_hashes: numbers(&event["block_hashes"]),
                        parent_block_hash: event["parent_block_hash"].as_u64(),
                        token_ids: numbers(&event["token_ids"]).into_iter().map(|token| token as i64).collect(),
                        block_size: event["block_size"].as_u64().unwrap() as usize,
                    },
                    "BlockRemoved" => KvEvent::BlockRemoved { block_hashes: numbers(&event["block_hashes"]) },
                    _ => KvEvent::AllBlocksCleared,
                })
                .collect();
            Expected {
                seed: value["seed"].as_str().unwrap().to_string(),
                block_size: value["block_size"].as_u64().unwrap() as usize,
                tokens: numbers(&value["tokens"]).into_iter().map(|token| token as i64).collect(),
                hashes: numbers(&value["hashes"]),
                ts: value["ts"].as_f64().unwrap(),
                events,
                batch: value["batch"].as_str().unwrap().to_string(),
            }
        }
    }

    #[test]
    fn a_batch_is_encoded_byte_for_byte_as_msgspec_encodes_vllms_schema() {
        let expected = Expected::read();
        let encoded: String = encode_batch(expected.ts, &expected.events).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(encoded, expected.batch);
    }
}
