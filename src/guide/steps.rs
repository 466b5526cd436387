//! # Steps: operations with several side effects
//!
//! An idempotent call runs its body to success once per key, and a body that fails gives its
//! claim back so that a retry runs it again. That is right for a body with one side effect,
//! and wrong for one with several: a checkout that charged the card and then failed to send
//! the receipt would, on its retry, charge the card a second time. [`step`](crate::step)
//! makes each side effect a unit of its own inside the call: a step's value is stored under
//! the call's key as soon as the step completes, and a later attempt of the key gets it from
//! the store instead of running the step again.
//!
//! ```
//! use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
//! use idem::{idempotent, Idem, MemoryStore};
//!
//! static CHARGES: AtomicU32 = AtomicU32::new(0);
//! static EMAILS: AtomicU32 = AtomicU32::new(0);
//!
//! #[derive(Debug)]
//! enum ShopError {
//!     MailDown,
//!     Idem(idem::Error),
//! }
//! impl From<idem::Error> for ShopError {
//!     fn from(e: idem::Error) -> Self { ShopError::Idem(e) }
//! }
//!
//! // `mail_up` stands for the mail server's state: not part of the request.
//! #[idempotent(key = order_id, skip(mail_up))]
//! async fn checkout(order_id: String, mail_up: bool) -> Result<String, ShopError> {
//!     // Runs once per order, however many attempts the call takes.
//!     let charge: String = idem::step("charge", || async {
//!         // The payment provider's own idempotency key, the same on every attempt.
//!         let provider_key = idem::step_key("charge")?;
//!         CHARGES.fetch_add(1, SeqCst);
//!         Ok::<_, ShopError>(format!("ch_{}", &provider_key[..8]))
//!     })
//!     .await?;
//!     idem::step("email", || async move {
//!         if !mail_up {
//!             return Err(ShopError::MailDown);
//!         }
//!         EMAILS.fetch_add(1, SeqCst);
//!         Ok(())
//!     })
//!     .await?;
//!     Ok(charge)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! idem::set_global(Idem::new(MemoryStore::new())).unwrap();
//! // Charged, then the email failed: the call's claim is given back, the charge's record kept.
//! assert!(matches!(checkout("o-1".into(), false).await, Err(ShopError::MailDown)));
//! // The retry gets the charge from its record and sends the email.
//! let charge = checkout("o-1".into(), true).await.unwrap();
//! assert_eq!((CHARGES.load(SeqCst), EMAILS.load(SeqCst)), (1, 1));
//! // And a later call is a replay of the stored result, as for any call.
//! assert_eq!(checkout("o-1".into(), true).await.unwrap(), charge);
//! # }
//! ```
//!
//! `examples/checkout.rs` (`cargo run --example checkout`) is a longer one: charge, reserve
//! and email, a retry after a failure, and the unknown outcomes below.
//!
//! ## What a step records, and when a retry resumes
//!
//! - A step claims a record of its own, under a key derived from the call's
//!   ([`Key::step`](crate::Key::step): `shop::checkout#step:charge/o-1`), runs, and
//!   completes that record with its value, encoded as JSON (so a step's value is
//!   `Serialize + DeserializeOwned`; a step of `()` stores `null`). The body gets the value
//!   decoded from that JSON, on the first run as on a replay. Step records are JSON at
//!   result version 0 whatever the call's `codec` and `version`: they live at most one
//!   `ttl`, between a failed attempt and the next, so a step's type changed by a deploy in
//!   between is read as JSON reads a changed type (its value, or [`Error::Decode`](crate::Error::Decode)).
//! - A later attempt of the same key replays every step that completed and runs the rest:
//!   after the body returned an `Err` that is not cached (the call's claim is given back), a
//!   panic, a dropped future, or a crash and the takeover of its lease by another caller.
//! - A step's record carries its call's fingerprint: a later attempt of the key with another
//!   payload (the amount changed between a failed attempt and its retry) is
//!   [`Error::KeyReuse`](crate::Error::KeyReuse) at its first step that has a record, and
//!   the call answers `KeyReuse` whatever its body returned; it never replays the other
//!   payload's steps. Code before that first step runs again, as any code outside steps
//!   does on every attempt.
//! - A step that returns an `Err` stores nothing: the next attempt runs it again. A step
//!   whose effect may have happened without its record being stored (its lease was lost, its
//!   value could not be encoded or stored) keeps the call's claim until its lease ends,
//!   rather than let a retry run it again at once: also when the body then returns an `Err`,
//!   panics or is dropped.
//! - A step starts only while its own claim and the call's lease are both live by the
//!   holder's clock: a store answer that came late (a claim, the check that an old attempt
//!   still holds its call) may describe a lease that has ended since, and then the step does
//!   not run and the attempt answers [`Error::LeaseLost`](crate::Error::LeaseLost). With
//!   `LeaseLoss::Cancel`, a body is dropped when its lease ends by its clock, even while an
//!   extend is still on its way.
//! - Once the call's result is stored, its step records are deleted (in the background); one
//!   left behind expires with the call's `ttl`, and no call reads it while the result lives.
//! - Two attempts never run one step at once: an attempt that finds a step's record claimed
//!   (its predecessor was taken over but still runs) waits for it.
//! - Each step of a body needs its own name (1 to 64 ASCII letters, digits, `_`, `-` or
//!   `.`), the same on every attempt; in a loop, number them (`email.0`, `email.1`). A step
//!   runs in the body's own task: in a task the body spawns, or outside any call, it is an
//!   [`Error::Step`](crate::Error::Step), as a repeated name is.
//! - [`step_key`](crate::step_key) gives the step's stable key as 32 hex digits, to send as
//!   the idempotency key of the system the step calls (Stripe's `Idempotency-Key`): if the
//!   process dies after the charge and before its record, the charge sent again on the next
//!   attempt is answered by the provider instead of repeated.
//!
//! An attempt resumed after a crash, step by step:
//!
#![doc = include_str!("diagrams/steps_resumed.svg")]
//!
//! <details><summary>mermaid source</summary>
//!
//! ```mermaid
#![doc = include_str!("diagrams/steps_resumed.mmd")]
//! ```
//!
//! </details>
//!
//! ## Unknown outcomes: hold the key until someone knows
//!
//! Some failures leave a step's outcome unknown: the gateway timed out after the request was
//! sent, the connection dropped before the answer. Running the charge again could charge
//! twice; not running it could ship an order nobody paid for.
//! [`Step::unknown_if`](crate::Step::unknown_if) marks those errors: the step's record and
//! the call's key are
//! then completed with a *hold* instead of a value, and every later call of the key answers
//! [`Error::OutcomeUnknown`](crate::Error::OutcomeUnknown) `{ key, step }` without running
//! the body, until the step is resolved:
//!
//! - by [`Idem::resolve`](crate::Idem::resolve)`(&key, "charge", Resolution::Ran(value))`
//!   (the step took effect, and later attempts get `value` as its result) or
//!   `Resolution::NotRan` (the next attempt runs it);
//! - by the engine's reconcile hook, [`IdemBuilder::reconcile`](crate::IdemBuilder::reconcile),
//!   which a call that finds its key held asks first (it gets the key, the step and the
//!   step's [`step_key`](crate::Unresolved::step_key), to ask the provider). In one process
//!   the hook runs once per held key at a time, and the key's other callers wait for its
//!   answer;
//! - or from a shell, by the admin command, on the service's store URL:
//!
//! ```sh
//! idem steps postgres://app@db/shop shop::checkout/o-2 charge email   # completed, held, running or none
//! idem resolve postgres://app@db/shop shop::checkout/o-2 charge --ran --value '"ch_1"'
//! idem resolve postgres://app@db/shop shop::checkout/o-2 charge --not-ran
//! ```
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), idem::Error> {
//! use idem::{Error, Fingerprint, Idem, Key, MemoryStore, Resolution, Step};
//!
//! #[derive(Debug)]
//! enum PayError { Timeout, Idem(Error) }
//! impl From<Error> for PayError {
//!     fn from(e: Error) -> Self { PayError::Idem(e) }
//! }
//!
//! let idem = Idem::new(MemoryStore::new());
//! let key = Key::new("shop::checkout", "o-2")?;
//! let pay = |timeout: bool| {
//!     idem.call(key.clone(), Fingerprint::NONE).run_fallible(move || async move {
//!         Step::new("charge")
//!             .unknown_if(|e: &PayError| matches!(e, PayError::Timeout))
//!             .run(|| async move {
//!                 match timeout {
//!                     true => Err(PayError::Timeout),
//!                     false => Ok("ch_2".to_string()),
//!                 }
//!             })
//!             .await
//!     })
//! };
//! // The charge timed out: the key is held, for this call and every later one.
//! assert!(matches!(pay(true).await, Err(PayError::Idem(Error::OutcomeUnknown { .. }))));
//! assert!(matches!(pay(false).await, Err(PayError::Idem(Error::OutcomeUnknown { .. }))));
//! // The provider says the charge went through, as `ch_1`.
//! idem.resolve(&key, "charge", Resolution::ran("ch_1").unwrap()).await?;
//! assert_eq!(pay(false).await.unwrap(), "ch_1");
//! # Ok(()) }
//! ```
//!
#![doc = include_str!("diagrams/steps_held.svg")]
//!
//! <details><summary>mermaid source</summary>
//!
//! ```mermaid
#![doc = include_str!("diagrams/steps_held.mmd")]
//! ```
//!
//! </details>
//!
//! A resolution writes the step's record, then lifts the key's hold, each only while it is
//! still the hold it read ([`Store::replace`](crate::Store::replace), a compare-and-set on
//! every built-in store). So resolutions racing each other (every caller's hook, an
//! operator at the same time) store one answer: [`Resolved::Resolved`](crate::Resolved) for
//! the one that wrote it, `NotHeld` or `AlreadyResolved` for the others; and a resolution
//! never touches the claim of an attempt that started after the key was released. A
//! resolution that cannot store its value is an error, and the key stays held: the store
//! failed, or the step's record is still claimed by the attempt that could not write its
//! hold (resolve again once that claim's lease has ended). A value that does not decode
//! into the step's type (a `--value` of the wrong shape) holds the key again at its next
//! call, naming the step: it is never read as "no record", which would run the step again.
//!
//! A hold waits for a person. It lives until it is resolved (or for
//! [`IdemBuilder::hold_ttl`](crate::IdemBuilder::hold_ttl), when one is set), not for the
//! call's `ttl`: a hold that expired would let the next call run the ambiguous step again.
//! Each call that finds a key held logs a warning with the key and the step, and with the
//! `metrics` feature counts `idem_held_total{scope,step}`: page on it. When the hold itself
//! cannot be written (the store refuses for as long as the claim's lease lasts), the call
//! answers [`Error::OutcomeNotHeld`](crate::Error::OutcomeNotHeld): the step's outcome is
//! unknown and nothing holds the key, so find out what the step did before retrying; the
//! claim is kept until its lease ends, and the call is counted as `outcome_not_held`.
//!
//! A held key is not an error to retry: [`Error::is_retryable`](crate::Error::is_retryable)
//! is false. The [HTTP layer](super::http) answers it 409 `urn:idem:problem:outcome-unknown`
//! with no `Retry-After` (the retrying client stops), and
//! [`dedup::Decision`](crate::dedup::Decision) holds such a message (`Hold`) rather than
//! acknowledging or redelivering it at once. `idem get` shows a held key's record as
//! `payload.kind: held` with the step that holds it.
//!
//! ## At most once: when a crash must not run a step again
//!
//! By default a step that was running when its process died runs again on the next
//! attempt: its record was claimed, not completed, and the takeover cannot tell whether its
//! effect happened. With [`step_key`](crate::step_key) handed to the provider that is safe.
//! Many systems take no key (an email, an SMS, a legacy API). For those,
//! [`Step::at_most_once`](crate::Step::at_most_once) records that the step *started* before
//! it runs: its record is completed with a hold first, and that hold is replaced by the
//! value when the step returns. An attempt that finds the hold (its predecessor died or was
//! cut off in between) does not run the step: the key is held, as for an ambiguous error,
//! until a person or the reconcile hook says whether it happened. An `Err` the step returns
//! that is not ambiguous clears the hold, so the next attempt runs it.
//!
//! The same for a whole call without steps: [`Call::at_most_once`](crate::Call::at_most_once),
//! `#[idempotent(at_most_once)]`. Before the body runs, the record of the step `call` says
//! it started; a takeover that finds it (the process died, or the result could not be stored
//! before the lease ended, as in a failover with the replicas cut off) holds the key, naming
//! the step `call`, instead of running the body again. Resolving `call` as ran, with the
//! body's result as JSON, stores that result for the key:
//! `idem resolve <url> <key> call --ran --value '"receipt-7"'`.
//!
//! | mode | a crash inside the step or body | costs per first run |
//! | --- | --- | --- |
//! | a step (default) | runs it again on the next attempt (hand on `step_key`) | a claim and a complete of the step's record |
//! | `Step::at_most_once` | holds the key until resolved | one round trip more (the hold, then its replacement) |
//! | `Call::at_most_once` | holds the key until resolved (step `call`) | two round trips more (claim and hold the mark), and its deletion in the background |
//!
//! Choose at most once where a second run is worse than a person's decision: money moved
//! without a key, a message a customer reads. Keep the default where the step can be asked
//! (its provider dedups by `step_key`) or where running it twice is harmless.
//!
//! ## Steps in your own transaction
//!
//! A step whose effect is a write to the same database as a SQL store can record its value
//! in that write's transaction, so that the write and the record commit or roll back as
//! one: exactly once for the write, with no window in which it committed and its record
//! did not (which a plain step has: a crash there runs the write again).
//! `SqlStore::completed_step_in(&mut *tx, name)` reads the step's record on the
//! transaction's connection (the value of an earlier attempt whose transaction committed),
//! and `SqlStore::record_step_in(&mut *tx, name, &value)` writes it beside your own write:
//!
//! ```ignore
//! let mut tx = store.pool().begin().await?;
//! let reservation: i64 = match store.completed_step_in(&mut *tx, "reserve").await? {
//!     Some(id) => id,
//!     None => {
//!         let id = sqlx::query_scalar("INSERT INTO reservations (order_id) VALUES ($1) RETURNING id")
//!             .bind(order_id)
//!             .fetch_one(&mut *tx)
//!             .await?;
//!         store.record_step_in(&mut *tx, "reserve", &id).await?
//!     }
//! };
//! tx.commit().await?;
//! ```
//!
//! A crash or a rollback before the commit leaves neither the write nor the record; the
//! next attempt writes once. Its cost is the transaction you already have, and one
//! statement more in it (two on MySQL, which reads the row back). On Postgres, SQLite and
//! MySQL/MariaDB; not for effects that leave the database (an email, a provider), which no
//! transaction can take back: those are ordinary or at-most-once steps.
//!
//! ## Calls inside calls
//!
//! An `#[idempotent]` function (or an `Idem::call`) called inside another call's body is a
//! call of its own: it keeps the key its own arguments give it, no key is derived from the
//! parent's, and the steps inside its body belong to it, not to the parent. A nested call is
//! its own operation, with its own record, replayed to whoever calls it with that key.
//!
//! - To make it a step of the parent (run once per parent key, its value recorded with the
//!   parent's steps), wrap it in a step:
//!   `idem::step("reserve", || reserve_stock(order_id)).await?`.
//! - To key it by the parent instead of by its own arguments, pass the parent's step key as
//!   its key: `reserve_stock(idem::step_key("reserve")?).await?` gives one key per parent
//!   key and step name, the same on every attempt of the parent.
//!
//! The two combine: a step whose body is a nested call keyed by that step's `step_key`.
//!
//! ## Steps in an HTTP handler
//!
//! Behind the [HTTP layer](super::http) the handler's body is the call's body: steps work
//! in an axum handler as in any idempotent call. What the handler answers after a partial
//! failure decides what the retry does:
//!
//! - A response the layer stores (any 2xx, 4xx or 5xx not listed below) ends the key: every
//!   retry gets that response, and no later step ever runs. A plain 500 after the charge is
//!   what the customer's retries get, forever: not what a partial failure wants.
//! - A response the layer does not store gives the key back, so the retry runs the handler
//!   again, which replays the completed steps and runs the rest: a status in
//!   `unstored_statuses` (401, 403, 408, 409, 429 by default) or a response carrying
//!   [`RetrySafe`](crate::http::RetrySafe) in its extensions. Answer a partial failure
//!   that a retry can finish with one of those, `503` with `RetrySafe` say.
//! - A step whose outcome is unknown answers 409 `outcome-unknown` whatever the handler
//!   returned, until it is resolved.
//!
//! ```ignore
//! async fn checkout(Json(order): Json<Order>) -> Response {
//!     let charge = idem::step("charge", || gateway.charge(&order, idem::step_key("charge")?)).await;
//!     let Ok(charge) = charge else {
//!         // Nothing charged for sure: the retry runs the handler again.
//!         return (StatusCode::SERVICE_UNAVAILABLE, RetrySafe).into_response();
//!     };
//!     if idem::step("email", || mailer.receipt(&order, &charge)).await.is_err() {
//!         // Charged, the email failed: the retry replays the charge and sends it.
//!         return (StatusCode::SERVICE_UNAVAILABLE, RetrySafe).into_response();
//!     }
//!     (StatusCode::CREATED, Json(charge)).into_response()
//! }
//! ```
