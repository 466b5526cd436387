//! The store operations of one resolution: one look at the step's record and the key's,
//! and the compare-and-set writes they call for (see [`resolve`](super::resolve)).

use std::future::Future;
use std::ops::ControlFlow;
use std::time::Duration;

use bytes::Bytes;

use super::observe::StoreClock;
use super::resolve::Resolved;
use super::store_op::{store_error, store_op};
use crate::envelope;
use crate::error::Error;
use crate::key::Key;
use crate::store::{Claim, Fingerprint, Record, Store, Token};

/// The holds a resolution is about (see `Idem::resolve_hold`).
pub(super) struct Pinned {
    pub(super) key: Option<Bytes>,
    pub(super) step: Option<Bytes>,
    /// Whether they were read (or given) yet.
    pub(super) read: bool,
}

impl Pinned {
    /// Pins the holds read now (`key`, `step`) on the first look; on a later one, whether
    /// they are still the ones this resolution is about: a newer one is another attempt's,
    /// whose step may have run since.
    fn still_about(&mut self, key: Option<Bytes>, step: Option<Bytes>) -> bool {
        if !self.read {
            *self = Pinned {
                key,
                step,
                read: true,
            };
            return true;
        }
        let newer_key = self.key.is_some() && key.is_some() && self.key != key;
        let asked_gone = self.key.is_some() && key.is_none() && self.step.is_none();
        let newer_step = match (&self.step, &step) {
            (Some(read), Some(now)) => read != now,
            (None, Some(_)) => self.key.is_some() && self.key != key,
            _ => false,
        };
        if newer_key || newer_step || asked_gone {
            return false;
        }
        if self.step.is_none() {
            self.step = step;
        }
        true
    }
}

/// The key's hold of the step being resolved: the key's record's fingerprint, the hold as
/// read, and whether the step's own record holds too.
type KeyHold = Option<(Fingerprint, Bytes, bool)>;

/// What a resolution did to the step's record.
enum Wrote {
    /// It replaced the step's hold, or wrote its value.
    Step,
    /// Nothing was there to write (not ran, no record).
    Nothing,
    /// Another resolution's value (or the step's own) was there, left as it was.
    Another,
}

/// The store operations of one resolution.
pub(super) struct Resolver<'s> {
    pub(super) store: &'s dyn Store,
    pub(super) clock: StoreClock,
    pub(super) limit: Duration,
    pub(super) lease: Duration,
    pub(super) ttl: Duration,
}

impl Resolver<'_> {
    async fn run<T>(
        &self,
        key: &Key,
        name: &'static str,
        call: impl Future<Output = Result<T, crate::StoreError>>,
    ) -> Result<T, Error> {
        store_op(self.store, &self.clock, name, self.limit, call)
            .await
            .map_err(|source| store_error(key, source))
    }

    /// One look at the step's record and the key's, and the writes they call for: `None`
    /// when a record changed between the look and a write (look again).
    pub(super) async fn attempt(
        &self,
        key: &Key,
        record_key: &Key,
        step: &str,
        pinned: &mut Pinned,
        value: &Option<Bytes>,
    ) -> Result<Option<Resolved>, Error> {
        let store = self.store;
        let step_record = self.run(record_key, "get", store.get(record_key)).await?;
        let key_record = self.run(key, "get", store.get(key)).await?;
        if let Some(Record::InProgress {
            lease_remaining, ..
        }) = &key_record
        {
            // An attempt runs now: its step or body may yet finish, and a resolution would
            // answer for what it has not seen.
            return Err(Error::Step {
                key: Some(key.clone()),
                step: step.to_owned(),
                reason: format!(
                    "an attempt of the key is running (its claim has {lease_remaining:?} left); resolve once it has ended and the key is held"
                ),
            });
        }
        let key_hold = match key_record {
            Some(Record::Completed {
                fingerprint,
                payload,
            }) => match envelope::read_hold(&payload) {
                Some(hold) if hold.step == step => Some((fingerprint, payload, hold.step_record)),
                _ => None,
            },
            _ => None,
        };
        let step_hold = match &step_record {
            Some(Record::Completed { payload, .. }) if envelope::held_step(payload).is_some() => {
                Some(payload.clone())
            }
            _ => None,
        };
        let key_bytes = key_hold.as_ref().map(|(_, hold, _)| hold.clone());
        if !pinned.still_about(key_bytes, step_hold) {
            return Ok(Some(Resolved::NotHeld));
        }
        let written = self.write_step(key, (record_key, step_record), step, &key_hold, value);
        let wrote = match written.await? {
            ControlFlow::Continue(wrote) => wrote,
            ControlFlow::Break(answer) => return Ok(answer),
        };
        let lifted = match &key_hold {
            Some((_, hold, _)) => {
                let replace = store.replace(key, hold, None);
                self.run(key, "replace", replace).await?
            }
            None => false,
        };
        Ok(Some(match (wrote, lifted) {
            (Wrote::Step, _) | (Wrote::Nothing, true) => Resolved::Resolved,
            (Wrote::Another, true) => Resolved::AlreadyResolved,
            (_, false) => Resolved::NotHeld,
        }))
    }

    /// Writes the step's record (`record_key`, read as `step_record`) as `value` says, given
    /// the key's hold of the step (`key_hold`), if any. `Continue` with what it did to the
    /// record: wrote it, found nothing to write (not ran, and no record: lifting the key's
    /// hold is the whole resolution), or found another resolution's value (or a run's),
    /// which it leaves; `Break` with the attempt's answer when there is nothing more to do
    /// (`None`: a record changed, look again).
    async fn write_step(
        &self,
        key: &Key,
        (record_key, step_record): (&Key, Option<Record>),
        step: &str,
        key_hold: &KeyHold,
        value: &Option<Bytes>,
    ) -> Result<ControlFlow<Option<Resolved>, Wrote>, Error> {
        let store = self.store;
        let answer = match step_record {
            Some(Record::Completed { payload, .. }) if envelope::held_step(&payload).is_some() => {
                let new = value.clone().map(|v| (v, self.ttl));
                let replace = store.replace(record_key, &payload, new);
                if !self.run(record_key, "replace", replace).await? {
                    return Ok(ControlFlow::Break(None));
                }
                Wrote::Step
            }
            // A value: the step ran, or another resolution wrote it. Never overwritten.
            Some(Record::Completed { .. }) => Wrote::Another,
            Some(Record::InProgress {
                lease_remaining, ..
            }) => {
                if key_hold.is_none() {
                    // An attempt runs the step now: nothing is held.
                    return Ok(ControlFlow::Break(Some(Resolved::NotHeld)));
                }
                return Err(Error::Step {
                    key: Some(key.clone()),
                    step: step.to_owned(),
                    reason: format!(
                        "its record is still claimed, for {lease_remaining:?}, by the attempt whose outcome is unknown (it could not write its hold there); the key stays held: resolve again once that claim has ended"
                    ),
                });
            }
            None => match (value, key_hold) {
                (_, None) => return Ok(ControlFlow::Break(Some(Resolved::NotHeld))),
                // Not ran, and no record to delete: the key's hold is all there is.
                (None, Some(_)) => Wrote::Nothing,
                // The step's hold was there and is gone: another resolution (as not ran)
                // deleted it and has yet to lift the key's hold. Its answer stands.
                (Some(_), Some((_, _, true))) => Wrote::Another,
                // The step's record never got its hold: the value is written here.
                (Some(value), Some((fingerprint, _, false))) => {
                    let token = Token::random();
                    let claim = store.claim(record_key, fingerprint, token, self.lease);
                    match self.run(record_key, "claim", claim).await? {
                        Claim::Acquired { .. } => {
                            let complete =
                                store.complete(record_key, token, value.clone(), self.ttl);
                            self.run(record_key, "complete", complete).await?;
                            Wrote::Step
                        }
                        Claim::Completed { .. } | Claim::InProgress { .. } => {
                            return Ok(ControlFlow::Break(None))
                        }
                    }
                }
            },
        };
        Ok(ControlFlow::Continue(answer))
    }
}
