//! An exactly-once consumer on NATS JetStream: each order ships once, however often
//! JetStream delivers it.
//!
//! ```sh
//! cargo run -p idem-integration --example jetstream_consumer
//! ```
//!
//! JetStream delivers at least once: a message is redelivered when its ack is lost, when
//! the consumer dies before it acks, after a `nak`; and a publisher that retries may
//! publish it twice. The consumer runs its effect through `Idem::consume` under the
//! order's dedup key, and one broker-neutral [`Decision`] turns idem's answer into an ack,
//! a `nak` with a delay, or a `term` (the dead letter). The publisher sets `Nats-Msg-Id` to
//! [`dedup::message_id`] of the same key, so JetStream's duplicate window drops a
//! re-publish before any consumer sees it; the consumer's dedup catches what comes after
//! the window.
//!
//! `IDEM_NATS_URL` names the server (default `nats://127.0.0.1:4222`), `IDEM_STORE_URL`
//! the store (default: in memory). It publishes 5 orders, each twice, consumes them, and
//! prints what it did. Shared with `tests/consumer_jetstream.rs`, which runs this very code
//! against the real server with duplicates, a consumer killed before its ack, a `nak` and
//! two consumers at once.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream::consumer::pull::MessagesErrorKind;
use async_nats::jetstream::{self, consumer::PullConsumer, AckKind};
use futures_util::StreamExt;
use idem::dedup::{self, Decision, HandlerError};
use idem::{Fingerprint, Idem, Key};
use serde::{Deserialize, Serialize};

/// The dedup scope of an order's shipment.
pub const SCOPE: &str = "shipping.order_placed";

/// A message: an order to ship.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Order {
    /// The order's id: its dedup key.
    pub order_id: String,
}

impl Order {
    /// The dedup key both halves derive: the consumer's record, the publisher's msg id.
    pub fn key(&self) -> Result<Key, idem::Error> {
        Key::new(SCOPE, self.order_id.as_str())
    }
}

/// Publishes `order` with `Nats-Msg-Id` set to its dedup key's message id; whether
/// JetStream dropped it as a duplicate within its window.
pub async fn publish(
    js: &jetstream::Context,
    subject: &str,
    order: &Order,
) -> Result<bool, async_nats::Error> {
    let id = dedup::message_id(&order.key()?);
    let payload = serde_json::to_vec(order)?;
    let ack = js
        .send_publish(
            subject.to_owned(),
            jetstream::message::PublishMessage::build()
                .message_id(id)
                .payload(payload.into()),
        )
        .await?
        .await?;
    Ok(ack.duplicate)
}

/// Publishes `order` without a msg id: what a publisher that knows nothing of the key
/// sends, so JetStream keeps every copy.
pub async fn publish_plain(
    js: &jetstream::Context,
    subject: &str,
    order: &Order,
) -> Result<(), async_nats::Error> {
    js.publish(subject.to_owned(), serde_json::to_vec(order)?.into())
        .await?
        .await?;
    Ok(())
}

/// What the consumer counts.
#[derive(Debug, Default)]
pub struct Stats {
    /// Messages received (every delivery of every copy).
    pub deliveries: AtomicU64,
    /// Deliveries idem answered from the store: already processed.
    pub duplicates: AtomicU64,
    /// Acks sent.
    pub acks: AtomicU64,
    /// Naks sent (redeliver after a delay).
    pub naks: AtomicU64,
    /// Terms sent (the dead letter).
    pub terms: AtomicU64,
}

/// Faults a test injects, each once per order id.
#[derive(Debug, Default)]
pub struct Faults {
    /// Fail before the effect with an error a redelivery can fix: `nak`.
    pub fail_before_effect: Mutex<HashSet<String>>,
    /// Stop the consumer after the effect, before the ack: as if it died there.
    pub die_before_ack: Mutex<HashSet<String>>,
}

impl Faults {
    fn take(set: &Mutex<HashSet<String>>, id: &str) -> bool {
        set.lock().expect("not poisoned").remove(id)
    }
}

/// The handler's own error.
#[derive(Debug)]
pub enum ShipError {
    /// idem's answer (a duplicate running, the store down...).
    Idem(idem::Error),
    /// The carrier did not answer: a redelivery can ship it.
    CarrierDown,
    /// The message is not an order.
    Malformed(String),
}

impl From<idem::Error> for ShipError {
    fn from(err: idem::Error) -> Self {
        ShipError::Idem(err)
    }
}

impl HandlerError for ShipError {
    fn as_idem(&self) -> Option<&idem::Error> {
        match self {
            ShipError::Idem(err) => Some(err),
            _ => None,
        }
    }
    fn is_retryable(&self) -> bool {
        matches!(self, ShipError::CarrierDown)
    }
}

/// How a consumer loop ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// Its message stream ended.
    StreamEnded,
    /// An injected fault stopped it without an ack.
    Died,
}

/// The consumer.
#[derive(Debug)]
pub struct Worker {
    /// The engine (any store).
    pub idem: Idem,
    /// Shipments made, per order id: the effect, counted.
    pub shipped: Mutex<HashMap<String, u32>>,
    /// What it did.
    pub stats: Stats,
    /// Injected faults.
    pub faults: Faults,
    /// Whether deliveries go through idem: off only to show that the tests' scenarios do
    /// produce duplicates without it.
    pub dedup: bool,
    /// How long one shipment takes.
    pub effect_time: Duration,
}

impl Worker {
    /// A worker on `idem`, with dedup on.
    pub fn new(idem: Idem) -> Self {
        Worker {
            idem,
            shipped: Mutex::default(),
            stats: Stats::default(),
            faults: Faults::default(),
            dedup: true,
            effect_time: Duration::ZERO,
        }
    }

    async fn ship(&self, order: &Order) -> Result<(), ShipError> {
        if Faults::take(&self.faults.fail_before_effect, &order.order_id) {
            return Err(ShipError::CarrierDown);
        }
        tokio::time::sleep(self.effect_time).await;
        *self
            .shipped
            .lock()
            .expect("not poisoned")
            .entry(order.order_id.clone())
            .or_default() += 1;
        Ok(())
    }

    /// Handles one delivery's payload; what to tell JetStream.
    pub async fn handle(&self, payload: &[u8]) -> Decision {
        let order: Order = match serde_json::from_slice(payload) {
            Ok(order) => order,
            Err(err) => return Decision::of_error(&ShipError::Malformed(err.to_string())),
        };
        if !self.dedup {
            return Decision::of(&self.ship(&order).await);
        }
        let key = match order.key() {
            Ok(key) => key,
            Err(err) => return Decision::of_error(&err),
        };
        let answer = self
            .idem
            .consume(key, Fingerprint::of(&order))
            .run_fallible(|| self.ship(&order))
            .await;
        if answer.as_ref().is_ok_and(|outcome| outcome.is_replay()) {
            self.stats.duplicates.fetch_add(1, Ordering::SeqCst);
        }
        Decision::of(&answer)
    }

    /// Consumes from `consumer` until its stream ends, a fault stops it, or it is dropped.
    pub async fn run(&self, consumer: &PullConsumer) -> Result<Ended, async_nats::Error> {
        // One message at a time, so that consumers pulling from one durable consumer
        // share its messages instead of one prefetching them all. Short pull requests: on
        // a loaded machine the client was seen waiting on a request the server no longer
        // held (its `num_waiting` 0) until the request expired, 30 s by default.
        let mut messages = consumer
            .stream()
            .max_messages_per_batch(1)
            .expires(Duration::from_secs(2))
            .heartbeat(Duration::from_millis(500))
            .messages()
            .await?;
        while let Some(msg) = messages.next().await {
            let msg = match msg {
                Ok(msg) => msg,
                // A missed heartbeat or a failed pull request is a moment of the
                // connection, not of the consumer: the stream pulls again.
                Err(err)
                    if matches!(
                        err.kind(),
                        MessagesErrorKind::MissingHeartbeat | MessagesErrorKind::Pull
                    ) =>
                {
                    eprintln!("jetstream: {err}; pulling again");
                    continue;
                }
                Err(err) => return Err(err.into()),
            };
            self.stats.deliveries.fetch_add(1, Ordering::SeqCst);
            let decision = self.handle(&msg.payload).await;
            let order_id = serde_json::from_slice::<Order>(&msg.payload)
                .map(|o| o.order_id)
                .unwrap_or_default();
            match decision {
                Decision::Ack => {
                    if Faults::take(&self.faults.die_before_ack, &order_id) {
                        return Ok(Ended::Died);
                    }
                    msg.ack().await?;
                    self.stats.acks.fetch_add(1, Ordering::SeqCst);
                }
                // A held message waits longer, for the step in doubt to be resolved.
                Decision::Redeliver { after } | Decision::Hold { after } => {
                    msg.ack_with(AckKind::Nak(Some(after))).await?;
                    self.stats.naks.fetch_add(1, Ordering::SeqCst);
                }
                Decision::Reject => {
                    msg.ack_with(AckKind::Term).await?;
                    self.stats.terms.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        Ok(Ended::StreamEnded)
    }

    /// How many times `order_id` shipped.
    pub fn shipments(&self, order_id: &str) -> u32 {
        self.shipped
            .lock()
            .expect("not poisoned")
            .get(order_id)
            .copied()
            .unwrap_or(0)
    }
}

/// A stream `name` on `subject`, with a duplicate window, made anew.
pub async fn fresh_stream(
    js: &jetstream::Context,
    name: &str,
    subject: &str,
    duplicate_window: Duration,
) -> Result<jetstream::stream::Stream, async_nats::Error> {
    let _ = js.delete_stream(name).await;
    Ok(js
        .create_stream(jetstream::stream::Config {
            name: name.to_owned(),
            subjects: vec![subject.to_owned()],
            duplicate_window,
            ..Default::default()
        })
        .await?)
}

/// A durable pull consumer on `stream` whose unacked messages come back after `ack_wait`.
pub async fn pull_consumer(
    stream: &jetstream::stream::Stream,
    name: &str,
    ack_wait: Duration,
) -> Result<PullConsumer, async_nats::Error> {
    Ok(stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some(name.to_owned()),
            ack_wait,
            max_deliver: 10,
            ..Default::default()
        })
        .await?)
}

/// Waits until `consumer` has nothing pending and nothing unacked.
pub async fn drained(consumer: &PullConsumer) -> Result<(), async_nats::Error> {
    loop {
        let info = consumer.get_info().await?;
        if info.num_pending == 0 && info.num_ack_pending == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::main]
async fn main() -> Result<(), async_nats::Error> {
    let url = std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let idem = match std::env::var("IDEM_STORE_URL") {
        Ok(store) => idem::connect(&store).await?,
        Err(_) => Idem::new(idem::MemoryStore::new()),
    };
    let js = jetstream::new(async_nats::connect(&url).await?);
    let stream = fresh_stream(
        &js,
        "IDEM_EXAMPLE_ORDERS",
        "idem-example.orders",
        Duration::from_secs(60),
    )
    .await?;
    let consumer = pull_consumer(&stream, "shipping", Duration::from_secs(5)).await?;

    let orders: Vec<Order> = (1..=5)
        .map(|n| Order {
            order_id: format!("o-{n}"),
        })
        .collect();
    let mut dropped = 0;
    for order in &orders {
        // A publisher that retried: twice with the msg id (JetStream drops the second),
        // and once more without it (the consumer's dedup catches that one).
        for _ in 0..2 {
            dropped += u32::from(publish(&js, "idem-example.orders", order).await?);
        }
        publish_plain(&js, "idem-example.orders", order).await?;
    }
    println!(
        "published {} orders, each 3 times; JetStream's duplicate window dropped {dropped}",
        orders.len()
    );

    let worker = Worker::new(idem);
    tokio::select! {
        ended = worker.run(&consumer) => { ended?; }
        done = drained(&consumer) => { done?; }
    }
    let s = &worker.stats;
    println!(
        "deliveries: {}, duplicates: {}, acks: {}, naks: {}, terms: {}",
        s.deliveries.load(Ordering::SeqCst),
        s.duplicates.load(Ordering::SeqCst),
        s.acks.load(Ordering::SeqCst),
        s.naks.load(Ordering::SeqCst),
        s.terms.load(Ordering::SeqCst)
    );
    for order in &orders {
        println!(
            "{}: shipped {} time(s)",
            order.order_id,
            worker.shipments(&order.order_id)
        );
    }
    js.delete_stream("IDEM_EXAMPLE_ORDERS").await?;
    Ok(())
}
