//! KV-cache events for prefix-aware routers, as vLLM publishes them
//! (`--kv-events-config`): each change in what the prefix cache holds
//! (blocks stored when a snapshot is kept, removed when the last snapshot
//! holding them is evicted, all cleared when the server stops), batched
//! per scheduler step and sent on a ZeroMQ PUB socket as three frames:
//! the topic, the batch's sequence number (8 bytes, big-endian) and its
//! MessagePack (`wire`). With a replay endpoint, a ROUTER socket answers a
//! client's sequence number with every buffered batch from it on, then an
//! empty payload under sequence -1, as vLLM's replay does.
//!
//! `blocks` names the blocks; the publisher runs on a thread of its own,
//! so the scheduler only queues batches.

mod blocks;
mod wire;

pub use blocks::{BlockHasher, BlockLedger};
pub use wire::KvEvent;

use serde_json::Value;
use std::collections::VecDeque;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

/// Where and how events are published: vLLM's `KVEventsConfig`.
#[derive(Debug, Clone, PartialEq)]
pub struct KvEventsConfig {
    /// The PUB socket's endpoint (`tcp://*:5557` by default).
    pub endpoint: String,
    /// The replay ROUTER socket's endpoint, if any.
    pub replay_endpoint: Option<String>,
    /// How many recent batches the replay socket can send again.
    pub buffer_steps: usize,
    /// Batches that may wait for the publisher; past it, a batch is dropped
    /// (logged), never the scheduler held up.
    pub max_queue_size: usize,
    /// The first frame of every message, which subscribers filter on.
    pub topic: String,
}

/// vLLM's default per-subscriber high-water mark, the only one the
/// publisher's socket has.
const HIGH_WATER_MARK: u64 = 100_000;

impl KvEventsConfig {
    /// Reads vLLM's `--kv-events-config` JSON. `None` when it asks for
    /// nothing to be published (`enable_kv_cache_events` false or publisher
    /// `null`); a field it does not know, or a value it cannot honour, is
    /// an error naming it.
    pub fn parse(text: &str) -> Result<Option<KvEventsConfig>, KvEventsError> {
        let bad = |message: String| KvEventsError::Config(message);
        let value: Value = serde_json::from_str(text).map_err(|error| bad(format!("not JSON: {error}")))?;
        let fields = value.as_object().ok_or_else(|| bad("not a JSON object".into()))?;
        let mut config = KvEventsConfig {
            endpoint: "tcp://*:5557".to_string(),
            replay_endpoint: None,
            buffer_steps: 10_000,
            max_queue_size: 100_000,
            topic: String::new(),
        };
        let mut enabled = false;
        let mut publisher = None;
        for (name, value) in fields {
            let text = || value.as_str().map(str::to_string).ok_or_else(|| bad(format!("`{name}` must be a string")));
            let count = || value.as_u64().ok_or_else(|| bad(format!("`{name}` must be a whole number")));
            match name.as_str() {
                "enable_kv_cache_events" => {
                    enabled =
                        value.as_bool().ok_or_else(|| bad("`enable_kv_cache_events` must be true or false".into()))?
                }
                "publisher" => publisher = Some(text()?),
                "endpoint" => config.endpoint = text()?,
                "replay_endpoint" if value.is_null() => config.replay_endpoint = None,
                "replay_endpoint" => config.replay_endpoint = Some(text()?),
                "buffer_steps" => config.buffer_steps = count()? as usize,
                "max_queue_size" => config.max_queue_size = (count()? as usize).max(1),
                "topic" => config.topic = text()?,
                "hwm" if count()? == HIGH_WATER_MARK => {}
                "hwm" => {
                    return Err(bad(format!(
                        "`hwm` can only be {HIGH_WATER_MARK}: the publisher's socket has a fixed high-water mark"
                    )))
                }
                _ => return Err(bad(format!("unknown field `{name}`"))),
            }
        }
        match publisher.as_deref() {
            None | Some("zmq") if enabled => Ok(Some(config)),
            None | Some("zmq" | "null") => Ok(None),
            Some(other) => Err(bad(format!("publisher `{other}` is not one of `zmq`, `null`"))),
        }
    }
}

/// Why events cannot be published.
#[derive(Debug, thiserror::Error)]
pub enum KvEventsError {
    /// The config asks for what cannot be done, or is not vLLM's.
    #[error("{0}")]
    Config(String),
    #[error("cannot publish KV-cache events on {endpoint}: {error}")]
    Bind { endpoint: String, error: String },
    #[error("cannot start the KV-cache event publisher: {0}")]
    Start(#[from] std::io::Error),
}

/// Where the scheduler queues batches of events.
#[derive(Clone)]
pub struct EventSink {
    batches: mpsc::Sender<Vec<KvEvent>>,
}

impl EventSink {
    /// Queues one batch; a full queue drops it (logged).
    pub fn publish(&self, events: Vec<KvEvent>) {
        if let Err(mpsc::error::TrySendError::Full(events)) = self.batches.try_send(events) {
            tracing::warn!(events = events.len(), "the KV-cache event queue is full: a batch of events is dropped");
        }
    }
}

/// The publisher's thread: it ends once every sink is gone and what they
/// queued is sent.
pub struct Publisher {
    thread: std::thread::JoinHandle<()>,
}

impl Publisher {
    /// Binds the sockets and starts publishing what the returned sink
    /// is given.
    pub fn start(config: KvEventsConfig) -> Result<(EventSink, Publisher), KvEventsError> {
        let (batches, queued) = mpsc::channel(config.max_queue_size);
        let (bound, binding) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new().name("kv-events".to_string()).spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(error) => return drop(bound.send(Err(KvEventsError::Start(error)))),
            };
            runtime.block_on(async move {
                match Sockets::bind(&config).await {
                    Ok(sockets) => {
                        let _ = bound.send(Ok(()));
                        sockets.run(config, queued).await;
                    }
                    Err(error) => drop(bound.send(Err(error))),
                }
            });
        })?;
        match binding.recv() {
            Ok(Ok(())) => Ok((EventSink { batches }, Publisher { thread })),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(KvEventsError::Start(std::io::Error::other("the publisher's thread ended"))),
        }
    }

    /// Waits for the last batches to go out.
    pub fn finish(self) {
        let _ = self.thread.join();
    }
}

/// Sequence -1: the end of a replay.
const END_OF_REPLAY: [u8; 8] = (-1i64).to_be_bytes();

/// How long the publisher lets its last messages reach subscribers once
/// nothing more is queued (ZeroMQ's linger).
const LINGER: Duration = Duration::from_millis(200);

struct Sockets {
    publish: zeromq::PubSocket,
    replay: Option<(zeromq::RouterSendHalf, mpsc::Receiver<ZmqMessage>)>,
}

impl Sockets {
    async fn bind(config: &KvEventsConfig) -> Result<Sockets, KvEventsError> {
        let mut publish = zeromq::PubSocket::new();
        bind(&mut publish, &config.endpoint).await?;
        let replay = match &config.replay_endpoint {
            Some(endpoint) => {
                let mut router = zeromq::RouterSocket::new();
                bind(&mut router, endpoint).await?;
                let (send, mut receive) = router.split();
                // Requests are read on a task of their own, so a request
                // half read is never lost to a batch that arrives meanwhile.
                let (requests, requested) = mpsc::channel(16);
                tokio::spawn(async move {
                    while let Ok(request) = receive.recv().await {
                        if requests.send(request).await.is_err() {
                            break;
                        }
                    }
                });
                Some((send, requested))
            }
            None => None,
        };
        Ok(Sockets { publish, replay })
    }

    async fn run(mut self, config: KvEventsConfig, mut queued: mpsc::Receiver<Vec<KvEvent>>) {
        let mut sent: VecDeque<(i64, Vec<u8>)> = VecDeque::new();
        let mut sequence: i64 = 0;
        loop {
            let request = async {
                match &mut self.replay {
                    Some((_, requested)) => requested.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                events = queued.recv() => {
                    let Some(events) = events else { break };
                    let ts = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |since| since.as_secs_f64());
                    let payload = wire::encode_batch(ts, &events);
                    let mut message = ZmqMessage::from(config.topic.clone());
                    message.push_back(sequence.to_be_bytes().to_vec().into());
                    message.push_back(payload.clone().into());
                    if let Err(error) = self.publish.send(message).await {
                        tracing::warn!(%error, "a batch of KV-cache events could not be sent");
                    }
                    if config.buffer_steps > 0 {
                        if sent.len() == config.buffer_steps {
                            sent.pop_front();
                        }
                        sent.push_back((sequence, payload));
                    }
                    sequence += 1;
                }
                Some(request) = request => self.replay(request, &sent).await,
            }
        }
        tokio::time::sleep(LINGER).await;
    }

    /// Answers a replay request, `[client, "", first sequence]`: every
    /// buffered batch from that sequence on, then the end marker.
    async fn replay(&mut self, request: ZmqMessage, sent: &VecDeque<(i64, Vec<u8>)>) {
        let Some((send, _)) = &mut self.replay else { return };
        let frames = request.into_vec();
        let (Some(client), Some(asked)) = (frames.first(), frames.last()) else { return };
        let Ok(first) = <[u8; 8]>::try_from(&asked[..]).map(i64::from_be_bytes) else {
            tracing::warn!("a KV-cache event replay request without an 8-byte sequence number was ignored");
            return;
        };
        let replies = sent
            .iter()
            .filter(|(sequence, _)| *sequence >= first)
            .map(|(sequence, payload)| (sequence.to_be_bytes().to_vec(), payload.clone()))
            .chain(std::iter::once((END_OF_REPLAY.to_vec(), Vec::new())));
        for (sequence, payload) in replies {
            let mut reply = ZmqMessage::from(client.clone());
            reply.push_back(Vec::new().into());
            reply.push_back(sequence.into());
            reply.push_back(payload.into());
            if send.send(reply).await.is_err() {
                return;
            }
        }
    }
}

/// Binds `socket` to a vLLM-style endpoint: `tcp://*:PORT` is every
/// interface.
async fn bind(socket: &mut impl Socket, endpoint: &str) -> Result<(), KvEventsError> {
    let address = endpoint.replacen("tcp://*:", "tcp://0.0.0.0:", 1);
    socket
        .bind(&address)
        .await
        .map(drop)
        .map_err(|error| KvEventsError::Bind { endpoint: endpoint.to_string(), error: error.to_string() })
}

/// The hash seed replicas share to name blocks alike: `PYTHONHASHSEED`,
/// as vLLM's, else one of this process's own.
pub fn hash_seed() -> String {
    std::env::var("PYTHONHASHSEED").unwrap_or_else(|_| {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_nanos());
        format!("linnet-{now:x}-{:x}", std::process::id())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_is_read_as_vllm_reads_it() {
        let config = KvEventsConfig::parse(
            r#"{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
                "replay_endpoint": "tcp://*:5558", "topic": "kv-events", "buffer_steps": 5, "hwm": 100000}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(config.replay_endpoint.as_deref(), Some("tcp://*:5558"));
        assert_eq!((config.topic.as_str(), config.buffer_steps), ("kv-events", 5));
        let defaults = KvEventsConfig::parse(r#"{"enable_kv_cache_events": true}"#).unwrap().unwrap();
        assert_eq!((defaults.endpoint.as_str(), defaults.topic.as_str()), ("tcp://*:5557", ""));
        assert_eq!(KvEventsConfig::parse(r#"{"publisher": "zmq"}"#).unwrap(), None, "not enabled");
        assert_eq!(KvEventsConfig::parse(r#"{"enable_kv_cache_events": true, "publisher": "null"}"#).unwrap(), None);
        for (bad, named) in [
            (r#"{"enable_kv_cache_events": true, "publisher": "nats"}"#, "nats"),
            (r#"{"enable_kv_cache_events": true, "hwm": 5}"#, "hwm"),
            (r#"{"enable_kv_cache_events": true, "endpoints": "tcp://*:1"}"#, "endpoints"),
            (r#"{"enable_kv_cache_events": "yes"}"#, "enable_kv_cache_events"),
            (r#"{"enable_kv_cache_events": true, "buffer_steps": -1}"#, "buffer_steps"),
            ("[1]", "object"),
        ] {
            let error = KvEventsConfig::parse(bad).unwrap_err().to_string();
            assert!(error.contains(named), "{bad}: {error}");
        }
    }
}
