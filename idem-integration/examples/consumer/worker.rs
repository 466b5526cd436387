//! The worker of `examples/consumer`: an order-shipped consumer on RabbitMQ with manual
//! acks. Shared with `tests/consumer_rabbitmq.rs`, which runs this very code against a real
//! broker with duplicates, crashes and rollbacks.
//!
//! Each message carries an order id. Its two effects take the two paths idem offers:
//!
//! 1. The shipment row lives in Postgres, beside idem's records: the dedup record is written
//!    in the same transaction as the row (`PostgresStore::mark_processed_in`), so both
//!    commit or neither does. No lease; a crash before the commit leaves nothing behind.
//! 2. The confirmation email leaves the database, so no transaction can undo it: it goes
//!    through `#[idempotent]`, whose lease keeps two consumers from sending it at once and
//!    whose stored result answers every later delivery. It is called on every delivery,
//!    duplicates included (a replay costs one read): a consumer that crashed after the
//!    commit and before the email must still send it on the redelivery.
//!
//! The message is acked only after both; any failure nacks it back onto the queue.
#![allow(dead_code)] // the test and the example each use a part of it

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use futures_util::StreamExt;
use idem::dedup::Decision;
use idem::stores::PostgresStore;
use idem::{idempotent, Fingerprint, Idem, Key, Origin};
use lapin::options::{BasicAckOptions, BasicNackOptions};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a processed message is remembered: longer than any redelivery can come.
pub const DEDUP_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// The email sender: the effect outside the database.
pub struct Mailer {
    pub idem: Idem,
    /// Emails really sent (a real mailer would call an SMTP server or a provider's API).
    pub sent: AtomicU64,
}

impl Mailer {
    /// Sends the confirmation of `order_id` once, however often it is called.
    #[idempotent(key = order_id, store = self.idem, scope = "shipping.confirmation_email", ttl = "7d")]
    pub async fn send_confirmation(&self, order_id: String) -> Result<String, idem::Error> {
        self.sent.fetch_add(1, Ordering::SeqCst);
        Ok(format!("confirmation of order {order_id} sent"))
    }
}

/// What a worker counts, to show what the broker really delivered.
#[derive(Default, Debug)]
pub struct Stats {
    pub deliveries: AtomicU64,
    /// Deliveries the broker flagged `redelivered` (after a nack or a consumer that died).
    pub redelivered: AtomicU64,
    /// Deliveries whose dedup record was already there.
    pub duplicates: AtomicU64,
    pub acks: AtomicU64,
    pub nacks: AtomicU64,
}

impl Stats {
    pub fn get(n: &AtomicU64) -> u64 {
        n.load(Ordering::SeqCst)
    }
}

/// Faults a test injects, each once per order id.
#[derive(Default)]
pub struct Faults {
    /// Fail after the shipment row is written, before the commit: the transaction rolls back.
    pub fail_after_write: Mutex<HashSet<String>>,
    /// Die after the commit and the email, before the ack.
    pub die_before_ack: Mutex<HashSet<String>>,
}

impl Faults {
    fn take(set: &Mutex<HashSet<String>>, order_id: &str) -> bool {
        set.lock().unwrap().remove(order_id)
    }
}

/// How a consumer's run ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The broker closed the stream.
    StreamClosed,
    /// An injected fault: the caller must drop the connection without acking.
    Died,
}

pub struct Worker {
    pub store: PostgresStore,
    /// The effect table (an identifier the worker made, spliced into its statements).
    pub shipments: String,
    pub mailer: Mailer,
    pub stats: Stats,
    pub faults: Faults,
}

impl Worker {
    /// Creates the shipment table (no unique key: a second row for an order must be
    /// countable, not an error that hides a missing dedup).
    pub async fn setup(&self) -> Result<(), BoxError> {
        self.store.migrate().await?;
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {} (order_id text NOT NULL, shipped_at timestamptz NOT NULL DEFAULT now())",
            self.shipments
        ))
        .execute(self.store.pool())
        .await?;
        Ok(())
    }

    /// Handles one delivery of `order_id`; whether it was the first.
    pub async fn handle(&self, order_id: &str) -> Result<Origin, BoxError> {
        let key = Key::new("shipping.order_shipped", order_id)?;
        let mut tx = self.store.pool().begin().await?;
        let delivery = self
            .store
            .mark_processed_in(&mut *tx, &key, Fingerprint::of(order_id), DEDUP_TTL)
            .await?;
        if delivery == Origin::Ran {
            sqlx::query(&format!(
                "INSERT INTO {} (order_id) VALUES ($1)",
                self.shipments
            ))
            .bind(order_id)
            .execute(&mut *tx)
            .await?;
            if Faults::take(&self.faults.fail_after_write, order_id) {
                // Dropping `tx` rolls back the row and the dedup record together.
                return Err(format!("injected failure after writing order {order_id}").into());
            }
        }
        tx.commit().await?;
        self.mailer.send_confirmation(order_id.to_string()).await?;
        Ok(delivery)
    }

    /// Consumes until the stream ends or an injected fault kills the consumer.
    pub async fn run(&self, mut consumer: lapin::Consumer) -> Result<Ended, BoxError> {
        while let Some(delivery) = consumer.next().await {
            let delivery = delivery?;
            self.stats.deliveries.fetch_add(1, Ordering::SeqCst);
            if delivery.redelivered {
                self.stats.redelivered.fetch_add(1, Ordering::SeqCst);
            }
            let order_id = String::from_utf8_lossy(&delivery.data).into_owned();
            let answer = self.handle(&order_id).await;
            if answer.as_ref().is_ok_and(|d| d.is_replay()) {
                self.stats.duplicates.fetch_add(1, Ordering::SeqCst);
            }
            // One decision for every broker: what idem (or the handler) answered, as an
            // ack, a requeue, or a dead letter.
            match Decision::of(&answer) {
                Decision::Ack => {
                    if Faults::take(&self.faults.die_before_ack, &order_id) {
                        return Ok(Ended::Died);
                    }
                    delivery.ack(BasicAckOptions::default()).await?;
                    self.stats.acks.fetch_add(1, Ordering::SeqCst);
                }
                // RabbitMQ requeues at once: the delay is a hint it has no place for.
                // A held message is requeued too: it is done once its step is resolved.
                decision @ (Decision::Redeliver { .. }
                | Decision::Hold { .. }
                | Decision::Reject) => {
                    let requeue = decision != Decision::Reject;
                    if let Err(e) = &answer {
                        eprintln!(
                            "order {order_id}: {e}; {}",
                            if requeue { "requeued" } else { "rejected" }
                        );
                    }
                    delivery
                        .nack(BasicNackOptions {
                            requeue,
                            ..Default::default()
                        })
                        .await?;
                    self.stats.nacks.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        Ok(Ended::StreamClosed)
    }
}
