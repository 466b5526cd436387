//! Consumer dedup: marking a message as processed by its dedup key, and telling a
//! duplicate delivery apart, on any [`Store`](crate::Store).
//!
//! Queues and logs deliver at least once. A consumer makes that exactly once per effect by
//! keying each message (a `stream:partition:offset`, the broker's message id, or a business
//! key such as `order-confirmation:{order_id}:{version}`) and asking the engine:
//!
//! - [`Idem::consume`]: run the handler once per key, under a lease, and replay its stored
//!   result to every redelivery. The right tool when the effect leaves the process (an
//!   email, a payment provider): the lease keeps two consumers from running it at once,
//!   and a handler that fails releases the key so the redelivery runs it again.
//! - [`Idem::mark_processed`]: record the key now, answering [`Delivery::First`] the first
//!   time and [`Delivery::Duplicate`] after. For work already done (or made safe) by other
//!   means: mark after the effect and before the ack.
//! - [`Idem::is_processed`]: only look.
//!
//! Dedup records are ordinary records: the value `()` in the JSON codec, result version 0,
//! fingerprint [`Fingerprint::NONE`]. The SQL stores write the same record inside the
//! user's own transaction (`SqlStore::mark_processed_in`), so the two paths see each other.

use crate::codec::Json;
use crate::engine::outcome::WithOutcome;
use crate::{Call, Error, Fingerprint, Idem, Key, Origin, Record};

/// Whether a delivery is the first of its dedup key or a duplicate of one already processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// No record was under the key: this delivery did (or is to do) the work.
    First,
    /// The key was already processed: ack the message and do nothing.
    Duplicate,
}

impl Delivery {
    /// Whether this delivery is a duplicate.
    pub fn is_duplicate(self) -> bool {
        self == Delivery::Duplicate
    }

    /// The delivery a call's [`Origin`] tells: the run is the first, a replay a duplicate.
    pub fn of(origin: Origin) -> Delivery {
        match origin {
            Origin::Ran => Delivery::First,
            _ => Delivery::Duplicate,
        }
    }
}

/// The dedup key of a message at `offset` in `partition` of `stream` (Kafka, Redpanda,
/// Kinesis, a Redis stream...): scope `scope`, id `stream:partition:offset`.
///
/// ```
/// let key = idem::dedup::offset_key("billing.consumer", "orders", 3, 1042)?;
/// assert_eq!(key.as_str(), "billing.consumer/orders:3:1042");
/// # Ok::<(), idem::Error>(())
/// ```
pub fn offset_key(scope: &str, stream: &str, partition: u32, offset: u64) -> Result<Key, Error> {
    Key::new(scope, format!("{stream}:{partition}:{offset}"))
}

impl Idem {
    /// Starts the call of a message handler under its dedup `key`: no fingerprint (a
    /// redelivery is the same message; [`Fingerprint::NONE`]), and answering an
    /// [`Outcome`](crate::Outcome) whose [`origin`](crate::Outcome::origin) tells the
    /// first delivery ([`Delivery::of`]) from a duplicate. Run it with
    /// [`run`](Call::run) or [`run_fallible`](Call::run_fallible): the handler runs once
    /// under a lease and its result is stored; a duplicate gets the stored result, and one
    /// arriving while the first still runs gets [`Error::InProgress`] (do not ack it:
    /// requeue it, or set [`in_progress`](Call::in_progress) to wait).
    ///
    /// ```
    /// # use idem::{Idem, Key, MemoryStore, dedup::Delivery};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem::Error> {
    /// let idem = Idem::new(MemoryStore::new());
    /// let key = Key::new("mail.consumer", "order-confirmation:o-7:1")?;
    /// let send = || async { "sent".to_string() };
    /// let first = idem.consume(key.clone()).run(send).await?;
    /// let again = idem.consume(key).run(send).await?;
    /// assert_eq!(Delivery::of(first.origin()), Delivery::First);
    /// assert_eq!(Delivery::of(again.origin()), Delivery::Duplicate);
    /// # Ok(()) }
    /// ```
    pub fn consume(&self, key: Key) -> Call<'_, crate::BuiltinCodec, WithOutcome> {
        self.call(key, Fingerprint::NONE).with_outcome()
    }

    /// Marks `key` processed and says whether it already was: [`Delivery::First`] when
    /// this call wrote the record, [`Delivery::Duplicate`] when one was there (written by
    /// this method, by [`consume`](Self::consume) with a `()` result, or by a SQL store's
    /// `mark_processed_in`). The record lives for the engine's ttl.
    ///
    /// A key another call still holds (a [`consume`](Self::consume) running) answers
    /// [`Error::InProgress`]: neither first nor duplicate yet.
    ///
    /// ```
    /// # use idem::{Idem, Key, MemoryStore, dedup::Delivery};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem::Error> {
    /// let idem = Idem::new(MemoryStore::new());
    /// let key = Key::new("audit.consumer", "msg-81c2")?;
    /// assert_eq!(idem.mark_processed(key.clone()).await?, Delivery::First);
    /// assert_eq!(idem.mark_processed(key.clone()).await?, Delivery::Duplicate);
    /// assert!(idem.is_processed(&key).await?);
    /// # Ok(()) }
    /// ```
    pub async fn mark_processed(&self, key: Key) -> Result<Delivery, Error> {
        // Always JSON, whatever the engine's codec: the record must read the same through
        // every path, the SQL stores' transactional one included.
        let outcome = self
            .call(key, Fingerprint::NONE)
            .codec(Json)
            .with_outcome()
            .run(|| async {})
            .await?;
        Ok(Delivery::of(outcome.origin()))
    }

    /// Whether `key` has a completed record (processed, within its ttl). A claim still
    /// running is not processed.
    pub async fn is_processed(&self, key: &Key) -> Result<bool, Error> {
        match self.store().get(key).await {
            Ok(record) => Ok(matches!(record, Some(Record::Completed { .. }))),
            Err(source) => Err(Error::Store {
                key: key.clone(),
                source,
            }),
        }
    }
}
