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
//! - [`Idem::mark_processed`]: record the key now, answering [`Origin::Ran`] the first
//!   time and [`Origin::Store`] after. For work already done (or made safe) by other
//!   means: mark after the effect and before the ack.
//! - [`Idem::is_processed`]: only look.
//!
//! Dedup records are ordinary records: the value `()` in the JSON codec, result version 0,
//! and the message's fingerprint ([`Fingerprint::NONE`] when the caller trusts the key
//! alone), so that a reused id with another payload is [`Error::KeyReuse`], not a
//! duplicate. The SQL stores write the same record inside the
//! user's own transaction (`SqlStore::mark_processed_in`), so the two paths see each other.

use std::time::Duration;

use crate::codec::Json;
use crate::{BoxError, CallWithOutcome, Error, Fingerprint, Idem, Key, Origin, Record};

/// What a consumer tells its broker about one delivery, whatever the broker: the one place
/// that maps idem's answer to an ack, a redelivery or a dead letter.
///
/// | idem answered | decision | RabbitMQ | NATS JetStream |
/// | --- | --- | --- | --- |
/// | the first run, or a duplicate replayed | [`Ack`](Decision::Ack) | `ack` | `ack` |
/// | [`Error::InProgress`] (another consumer runs it) | [`Redeliver`](Decision::Redeliver) after its hint | `nack` with requeue | `nak` with delay |
/// | [`Error::WaitTimeout`], [`Error::LeaseLost`], a temporary [`Error::Store`] | `Redeliver` after 1 s | `nack` with requeue | `nak` with delay |
/// | a permanent [`Error::Store`], [`Error::Config`], [`Error::Connect`], [`Error::InvalidOption`] (the consumer's setup, not the message) | `Redeliver` after 30 s | `nack` with requeue | `nak` with delay |
/// | [`Error::OutcomeUnknown`] (a step of the handler may or may not have taken effect) | [`Hold`](Decision::Hold) for 5 min | `nack` with requeue | `nak` with delay |
/// | [`Error::Step`] (a step written wrongly: the handler, not the message) | `Redeliver` after 30 s | `nack` with requeue | `nak` with delay |
/// | [`Error::KeyReuse`] (the id was used by another payload) | [`Reject`](Decision::Reject) | `reject`, no requeue (dead letter) | `term` |
/// | [`Error::InvalidKey`], [`Error::MissingKey`] (the message has no usable key) | `Reject` | `reject` | `term` |
/// | [`Error::Decode`], [`Error::Encode`] (a record this build cannot read, a result it could not store: the effect may have happened) | `Reject` | `reject` | `term` |
/// | the handler's own error, [retryable](HandlerError::is_retryable) | `Redeliver` after 1 s | `nack` with requeue | `nak` with delay |
/// | the handler's own error, not retryable | `Reject` | `reject` | `term` |
///
/// Nothing is acked that was not done, and nothing done is redelivered to run again: a
/// redelivery of a processed message is a duplicate, answered `Ack`.
///
/// ```
/// # use idem::{Fingerprint, Idem, Key, MemoryStore, dedup::Decision};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem::Error> {
/// let idem = Idem::new(MemoryStore::new());
/// let key = Key::new("mail.consumer", "order-confirmation:o-7:1")?;
/// let answer = idem.consume(key, Fingerprint::NONE).run(|| async { "sent".to_string() }).await;
/// assert_eq!(Decision::of(&answer), Decision::Ack);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Done (this delivery ran it, or an earlier one did): acknowledge the message.
    Ack,
    /// Not done, and a later attempt can do it: have the broker deliver it again after
    /// `after`.
    Redeliver {
        /// How long the broker should wait (a hint: RabbitMQ requeues at once).
        after: Duration,
    },
    /// Not done, and not to be tried again until someone finds out what happened: a step
    /// of the handler has an unknown outcome ([`Error::OutcomeUnknown`]) and the key is
    /// held. Keep the message (neither ack nor dead-letter it) and have the broker deliver
    /// it again after `after`: once the step is resolved (`idem resolve`, or the engine's
    /// reconcile hook) that delivery finishes the work, running only the steps not done.
    Hold {
        /// How long the broker should keep the message before delivering it again.
        after: Duration,
    },
    /// Not processable as it is, now or later: reject it without requeue, to the
    /// dead-letter queue or its broker's equivalent, where a person can look.
    Reject,
}

impl Decision {
    /// The pause before a redelivery that a retry soon can fix.
    pub const SOON: Duration = Duration::from_secs(1);
    /// The pause before a redelivery held up by the consumer's own setup (a store that
    /// refuses it, a bad option): long enough not to spin, short enough to recover.
    pub const LATER: Duration = Duration::from_secs(30);
    /// The pause before a held message is delivered again: a person or a reconcile hook
    /// has to find out what happened first.
    pub const HELD: Duration = Duration::from_secs(300);

    /// The decision for what a handler run through the engine answered, or
    /// [`Idem::mark_processed`]: `Ok` is done, first or duplicate; an error is classified
    /// as the table above says.
    pub fn of<T, E: HandlerError>(answer: &Result<T, E>) -> Decision {
        match answer {
            Ok(_) => Decision::Ack,
            Err(err) => Decision::of_error(err),
        }
    }

    /// The decision for an error: idem's own as the table says, the handler's by
    /// [`HandlerError::is_retryable`].
    pub fn of_error<E: HandlerError + ?Sized>(err: &E) -> Decision {
        let Some(err) = err.as_idem() else {
            return if err.is_retryable() {
                Decision::Redeliver {
                    after: Decision::SOON,
                }
            } else {
                Decision::Reject
            };
        };
        match err {
            Error::InProgress { retry_after, .. } => Decision::Redeliver {
                after: (*retry_after).max(Duration::from_millis(1)),
            },
            Error::WaitTimeout { .. } | Error::LeaseLost { .. } => Decision::Redeliver {
                after: Decision::SOON,
            },
            Error::Store { source, .. } if source.is_temporary() => Decision::Redeliver {
                after: Decision::SOON,
            },
            // Not held in the store either: redelivered soon, it could run the step again
            // once the claim's lease ends, so it waits as a held one does.
            Error::OutcomeUnknown { .. } | Error::OutcomeNotHeld { .. } => Decision::Hold {
                after: Decision::HELD,
            },
            Error::Store { .. }
            | Error::Step { .. }
            | Error::Config { .. }
            | Error::Connect { .. }
            | Error::InvalidOption { .. } => Decision::Redeliver {
                after: Decision::LATER,
            },
            Error::KeyReuse { .. }
            | Error::InvalidKey { .. }
            | Error::MissingKey { .. }
            | Error::Decode { .. }
            | Error::Encode { .. } => Decision::Reject,
        }
    }
}

/// A message handler's error, as [`Decision`] needs to see it: idem's own error when it is
/// one (a handler's error type wraps it, `From<idem::Error>`), and whether a redelivery can
/// succeed when it is the handler's.
///
/// ```
/// use idem::dedup::HandlerError;
///
/// #[derive(Debug)]
/// enum ShipError { Idem(idem::Error), CarrierDown, BadAddress }
///
/// impl HandlerError for ShipError {
///     fn as_idem(&self) -> Option<&idem::Error> {
///         match self { ShipError::Idem(e) => Some(e), _ => None }
///     }
///     fn is_retryable(&self) -> bool {
///         matches!(self, ShipError::CarrierDown)
///     }
/// }
/// ```
pub trait HandlerError {
    /// The idem error this is, if any (default none).
    fn as_idem(&self) -> Option<&Error> {
        None
    }

    /// Whether a redelivery of the message can succeed where this attempt failed. Asked
    /// only when [`as_idem`](Self::as_idem) is `None`.
    fn is_retryable(&self) -> bool;
}

impl HandlerError for Error {
    fn as_idem(&self) -> Option<&Error> {
        Some(self)
    }

    fn is_retryable(&self) -> bool {
        Error::is_retryable(self)
    }
}

/// A boxed error is idem's when it downcasts to one; any other is retried (the broker's
/// redelivery limit then dead-letters what keeps failing), since nothing says it is final.
impl HandlerError for BoxError {
    fn as_idem(&self) -> Option<&Error> {
        self.downcast_ref::<Error>()
    }

    fn is_retryable(&self) -> bool {
        true
    }
}

/// The id a publisher gives a message whose dedup key is `key` (NATS JetStream's
/// `Nats-Msg-Id`, an AMQP `message-id`), so that the broker's own duplicate window drops a
/// re-publish of it, and the consumer derives the same key on the other side: 32 hex
/// characters, a blake3 digest of the key (a fixed, documented format: publishers of one
/// release and consumers of another agree).
///
/// ```
/// let key = idem::Key::new("orders", "o-1")?;
/// let id = idem::dedup::message_id(&key);
/// assert_eq!(id.len(), 32);
/// assert_eq!(id, idem::dedup::message_id(&idem::Key::new("orders", "o-1")?));
/// # Ok::<(), idem::Error>(())
/// ```
pub fn message_id(key: &Key) -> String {
    crate::digest::digest_hex(&("idem message id v1", key.as_str()))
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
    /// Starts the call of a message handler under its dedup `key` and the message's
    /// `fingerprint` (`Fingerprint::of(&payload)`; [`Fingerprint::NONE`] to trust the key
    /// alone), answering an
    /// [`Outcome`](crate::Outcome) whose [`origin`](crate::Outcome::origin) tells the
    /// first delivery ([`Origin::Ran`]) from a duplicate ([`Origin::is_replay`]). Run it with
    /// [`run`](CallWithOutcome::run) or [`run_fallible`](CallWithOutcome::run_fallible): the handler runs once
    /// under a lease and its result is stored; a duplicate gets the stored result, and one
    /// arriving while the first still runs gets [`Error::InProgress`] (do not ack it:
    /// requeue it, or set [`in_progress`](CallWithOutcome::in_progress) to wait). A message that
    /// reuses a processed message's key with another payload (another fingerprint) is not
    /// a duplicate: [`Error::KeyReuse`], and [`Decision::of`] rejects it.
    ///
    /// ```
    /// # use idem::{Fingerprint, Idem, Key, MemoryStore, Origin};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem::Error> {
    /// let idem = Idem::new(MemoryStore::new());
    /// let key = Key::new("mail.consumer", "order-confirmation:o-7:1")?;
    /// let payload = br#"{"order_id":"o-7","email":"ada@example.com"}"#;
    /// let fp = Fingerprint::of(&payload[..]);
    /// let send = || async { "sent".to_string() };
    /// let first = idem.consume(key.clone(), fp).run(send).await?;
    /// let again = idem.consume(key.clone(), fp).run(send).await?;
    /// assert_eq!(first.origin(), Origin::Ran);
    /// assert_eq!(again.origin(), Origin::Store);
    /// // The same id with another payload is not the same message.
    /// let other = Fingerprint::of(&br#"{"order_id":"o-7","email":"eve@example.com"}"#[..]);
    /// let reused = idem.consume(key, other).run(send).await;
    /// assert!(matches!(reused, Err(idem::Error::KeyReuse { .. })));
    /// # Ok(()) }
    /// ```
    pub fn consume(&self, key: Key, fingerprint: Fingerprint) -> CallWithOutcome<'_> {
        self.call(key, fingerprint).with_outcome()
    }

    /// Marks `key` processed and says whether it already was: [`Origin::Ran`] when
    /// this call wrote the record, [`Origin::Store`] when one was there (written by
    /// this method, by [`consume`](Self::consume) with a `()` result, or by a SQL store's
    /// `mark_processed_in`; [`Origin::LocalCache`] instead of `Store` when the engine's
    /// local cache answered). The record lives for the engine's ttl.
    ///
    /// A key another call still holds (a [`consume`](Self::consume) running) answers
    /// [`Error::InProgress`]: neither first nor duplicate yet. `fingerprint` is the
    /// message's (`Fingerprint::of(&payload)`, or [`Fingerprint::NONE`] to trust the key
    /// alone): a key marked with another payload's is [`Error::KeyReuse`], not a
    /// duplicate.
    ///
    /// ```
    /// # use idem::{Fingerprint, Idem, Key, MemoryStore, Origin};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem::Error> {
    /// let idem = Idem::new(MemoryStore::new());
    /// let key = Key::new("audit.consumer", "msg-81c2")?;
    /// let fp = Fingerprint::of("user 7 logged in");
    /// assert_eq!(idem.mark_processed(key.clone(), fp).await?, Origin::Ran);
    /// assert_eq!(idem.mark_processed(key.clone(), fp).await?, Origin::Store);
    /// let reused = idem.mark_processed(key.clone(), Fingerprint::of("user 8 logged in")).await;
    /// assert!(matches!(reused, Err(idem::Error::KeyReuse { .. })));
    /// assert!(idem.is_processed(&key).await?);
    /// # Ok(()) }
    /// ```
    pub async fn mark_processed(
        &self,
        key: Key,
        fingerprint: Fingerprint,
    ) -> Result<Origin, Error> {
        // Always JSON, whatever the engine's codec: the record must read the same through
        // every path, the SQL stores' transactional one included.
        let outcome = self
            .call(key, fingerprint)
            .codec(Json)
            .with_outcome()
            .run(|| async {})
            .await?;
        Ok(outcome.origin())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DecodeError, StoreError};

    fn key() -> Key {
        Key::new("c", "m-1").unwrap()
    }

    fn store(temporary: bool) -> Error {
        Error::Store {
            key: key(),
            source: if temporary {
                StoreError::Unavailable {
                    backend: "test",
                    source: "refused".into(),
                }
            } else {
                StoreError::Backend {
                    backend: "test",
                    source: "permission denied".into(),
                }
            },
        }
    }

    #[derive(Debug)]
    enum Handler {
        Idem(Error),
        Flaky,
        Broken,
    }

    impl HandlerError for Handler {
        fn as_idem(&self) -> Option<&Error> {
            match self {
                Handler::Idem(e) => Some(e),
                _ => None,
            }
        }
        fn is_retryable(&self) -> bool {
            matches!(self, Handler::Flaky)
        }
    }

    #[test]
    fn every_answer_has_its_decision() {
        let soon = Decision::Redeliver {
            after: Decision::SOON,
        };
        let later = Decision::Redeliver {
            after: Decision::LATER,
        };
        let hint = Duration::from_millis(250);
        let cases: Vec<(Error, Decision)> = vec![
            (
                Error::InProgress {
                    key: key(),
                    retry_after: hint,
                },
                Decision::Redeliver { after: hint },
            ),
            (
                Error::WaitTimeout {
                    key: key(),
                    waited: hint,
                },
                soon,
            ),
            (Error::LeaseLost { key: key() }, soon),
            (store(true), soon),
            (store(false), later),
            (Error::KeyReuse { key: key() }, Decision::Reject),
            (Error::MissingKey { scope: "c".into() }, Decision::Reject),
            (
                Error::Decode {
                    key: key(),
                    source: DecodeError::NotAnEnvelope,
                },
                Decision::Reject,
            ),
        ];
        for (err, expected) in cases {
            assert_eq!(Decision::of_error(&err), expected, "{err}");
            // Wrapped in the handler's error type, or boxed, the same.
            let text = err.to_string();
            assert_eq!(Decision::of_error(&Handler::Idem(err)), expected, "{text}");
        }
        let boxed: BoxError = Box::new(Error::KeyReuse { key: key() });
        assert_eq!(Decision::of_error(&boxed), Decision::Reject);
        let other: BoxError = "smtp timeout".into();
        assert_eq!(Decision::of_error(&other), soon);
        assert_eq!(Decision::of_error(&Handler::Flaky), soon);
        assert_eq!(Decision::of_error(&Handler::Broken), Decision::Reject);
        assert_eq!(Decision::of::<_, Error>(&Ok(Origin::Store)), Decision::Ack);
    }

    #[test]
    fn a_message_id_is_a_stable_digest_of_the_key() {
        // A stored format: publishers and consumers of different releases must agree.
        assert_eq!(message_id(&key()), "166681d08b7d2813f8b45e41bdb100bb");
        assert_ne!(
            message_id(&key()),
            message_id(&Key::new("c", "m-2").unwrap())
        );
    }
}
