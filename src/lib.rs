//! # idem: make async operations safe to retry
//!
//! Retries, replays and duplicate deliveries are guaranteed in a distributed system. A
//! payment endpoint retried after a timeout must not charge twice; a queue consumer that
//! gets a message again must not send the email twice. `idem` runs an operation at most
//! once per idempotency key and hands its stored result to every retry and duplicate.
//!
//! ```
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use idem::{Fingerprint, Idem, Key, MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), idem::Error> {
//! let idem = Idem::new(MemoryStore::new());
//! let charges = AtomicU32::new(0);
//! for _ in 0..3 {
//!     let key = Key::new("billing::charge", "order-42")?;
//!     let receipt: String = idem
//!         .call(key, Fingerprint::of(&1250u64))
//!         .run(|| async {
//!             charges.fetch_add(1, Ordering::SeqCst); // the side effect
//!             "receipt-1".to_string()
//!         })
//!         .await?;
//!     assert_eq!(receipt, "receipt-1");
//! }
//! assert_eq!(charges.load(Ordering::SeqCst), 1);
//! # Ok(()) }
//! ```
//!
//! The same key with another payload is refused rather than answered with the first
//! payload's result:
//!
//! ```
//! # use idem::{Error, Fingerprint, Idem, Key, MemoryStore};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! # let idem = Idem::new(MemoryStore::new());
//! let key = Key::new("billing::charge", "order-42").unwrap();
//! let _: u32 = idem.call(key.clone(), Fingerprint::of(&1250u64)).run(|| async { 1 }).await.unwrap();
//! let err = idem.call(key, Fingerprint::of(&9999u64)).run::<u32, _, _>(|| async { 2 }).await.unwrap_err();
//! assert!(matches!(err, Error::KeyReuse { .. }));
//! # }
//! ```
//!
//! ## Backends
//!
//! [`MemoryStore`] is always available. `sqlite`, `postgres`, `mysql`, `redis` and
//! `redis-cluster` are cargo features; [`connect`] picks a store from a URL. `postgres-tls`
//! and `redis-tls` add TLS (`sslmode=require`, `rediss://`) on rustls with ring.
//!
//! ## Operating
//!
//! Each call runs in one `idem.call` tracing span (fields `scope`, `key`, `outcome`,
//! `store_seconds`), entered around the body. Feature `metrics` reports
//! `idem_calls_total{scope,outcome}`, `idem_store_step_seconds{step,backend}` and
//! `idem_calls_in_progress` through the `metrics` facade. The guide's
//! [operating](guide::operating) chapter lists them, and the `idem` admin command (crate
//! `idem-cli`).
//!
//! ## HTTP
//!
//! Feature `http` adds `idem::http` (the crate `idem-http`): a tower layer that gives an
//! axum or tower service the `Idempotency-Key` header's semantics on any store. `http-axum`
//! adds its axum extractor and error responses, `http-client` the retrying reqwest client.
//!
//! ## The guide
//!
//! [`guide`] walks through the rest, one chapter at a time: a first function, what a call
//! does (in pictures), the full promise, keys, the engine API, steps (operations with
//! several side effects), failures, stores, durability, HTTP, consumers, and operating idem.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::sync::OnceLock;

pub use idem_core::dedup;
pub use idem_core::{async_trait, Bytes};
pub use idem_core::{
    codec, fence, BoxError, Call, CallWithOutcome, Capabilities, Claim, DecodeError, Error, Fence,
    Fingerprint, Idem, IdemBuilder, InProgress, Key, LeaseLoss, MissingKey, Origin, Outcome,
    Record, Store, StoreError, StoreWrapper, Token, DEFAULT_LEASE, DEFAULT_RETRY_AFTER,
    DEFAULT_STEP_TIMEOUT, DEFAULT_TTL, DEFAULT_WAIT_TIMEOUT,
};
pub use idem_core::{
    step, step_key, step_record, Ambiguous, NeverUnknown, Resolution, Resolved, Step, StepRecord,
    Unresolved, MAX_STEP_NAME_LEN,
};
pub use idem_stores::MemoryStore;

/// The `Idempotency-Key` HTTP header: a tower layer (axum-compatible), the axum extractor
/// (feature `http-axum`) and the retrying reqwest client (feature `http-client`). The crate
/// `idem-http`.
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http {
    #[doc(inline)]
    pub use idem_http::*;
}

/// Makes an `async fn` safe to retry: its body runs once per idempotency key, and every
/// later call with that key gets the stored result instead of running it again.
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use idem::idempotent;
///
/// static EMAILS_SENT: AtomicU32 = AtomicU32::new(0);
///
/// #[idempotent(key = user_id, ttl = "24h")]
/// async fn send_welcome_email(user_id: u64, address: String) -> String {
///     EMAILS_SENT.fetch_add(1, Ordering::SeqCst); // the side effect
///     format!("message to {address}")
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem::Error> {
/// idem::set_global(idem::Idem::new(idem::MemoryStore::new())).unwrap(); // once, at start-up
/// let first = send_welcome_email(7, "ada@example.com".into()).await?;
/// let retry = send_welcome_email(7, "ada@example.com".into()).await?; // replayed
/// assert_eq!(first, retry);
/// assert_eq!(EMAILS_SENT.load(Ordering::SeqCst), 1);
/// # Ok(()) }
/// ```
///
/// For each call the function derives a [`Key`] and a [`Fingerprint`] from its arguments,
/// claims the key in the store, runs the body, stores the serialized result and returns
/// it. A call whose key is already completed gets the stored result, decoded; one whose
/// key is held by a running call gets [`Error::InProgress`] (or waits, with
/// `in_progress = "wait"`); one whose key was first used with other arguments gets
/// [`Error::KeyReuse`]. An `Err`, a panic or a dropped future releases the claim, so a
/// retry runs the body again.
///
/// # Return types
///
/// - A function returning `Result<T, E>` keeps its signature. `T` is stored and replayed;
///   an `Err` is returned as is and releases the key (unless `cache_errors` says to store
///   it); idem's own failures become `E` through `From<idem::Error>`, which `E` must
///   implement. A return type whose last path segment is named `Result` or ends in
///   `Result` (`io::Result<T>`, `anyhow::Result<T>`, `AppResult<T>`) counts as a `Result`.
/// - Any other return type `T` (including `()`) becomes `Result<T, idem::Error>`.
/// - The stored type must be `Serialize + DeserializeOwned` (owned data, no `impl Trait`);
///   the compile error says so at the return type.
/// - To tell a first run from a replay, declare the stored type as [`Outcome<T>`]:
///   `-> idem::Outcome<T>` (which becomes `Result<idem::Outcome<T>, idem::Error>`) or
///   `-> Result<idem::Outcome<T>, E>`. The body still evaluates to `T` (or `Result<T, E>`);
///   the caller gets the value with its [`Origin`]: [`Origin::Ran`] for the call that ran
///   the body, [`Origin::Store`] or [`Origin::LocalCache`] for a replay. The macro knows
///   the type by its last path segment, `Outcome` with one type argument, as it knows
///   `Result`; a type of your own named `Outcome<T>` cannot be the stored type (rename it
///   in the signature with a `type` alias). It expands to the same call with
///   [`.with_outcome()`](Call::with_outcome) before `.run...(...)`.
///
/// ```
/// use idem::idempotent;
///
/// #[derive(Debug)]
/// enum PaymentError {
///     Declined,
///     Idem(idem::Error),
/// }
///
/// impl From<idem::Error> for PaymentError {
///     fn from(e: idem::Error) -> Self {
///         PaymentError::Idem(e)
///     }
/// }
///
/// // Keeps its signature.
/// #[idempotent]
/// async fn charge(order_id: String, amount_cents: u64) -> Result<String, PaymentError> {
///     if amount_cents == 0 {
///         return Err(PaymentError::Declined); // not stored: a retry runs again
///     }
///     Ok(format!("receipt for {order_id}"))
/// }
///
/// // Becomes `async fn count(...) -> Result<u64, idem::Error>`.
/// #[idempotent]
/// async fn count(items: Vec<u64>) -> u64 {
///     items.iter().sum()
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # idem::set_global(idem::Idem::new(idem::MemoryStore::new())).unwrap();
/// # assert_eq!(charge("o-1".into(), 100).await.unwrap(), "receipt for o-1");
/// # assert!(matches!(charge("o-2".into(), 0).await, Err(PaymentError::Declined)));
/// # let n: Result<u64, idem::Error> = count(vec![1, 2]).await;
/// # assert_eq!(n.unwrap(), 3);
/// # }
/// ```
///
/// ```
/// use idem::{idempotent, Origin, Outcome};
///
/// #[idempotent(key = order_id)]
/// async fn charge(order_id: String) -> Result<Outcome<u64>, idem::Error> {
///     Ok(1250) // the body returns the value; the caller gets it with its origin
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem::Error> {
/// # idem::set_global(idem::Idem::new(idem::MemoryStore::new())).unwrap();
/// let first = charge("o-7".into()).await?;
/// let retry = charge("o-7".into()).await?;
/// assert_eq!((first.origin(), retry.origin()), (Origin::Ran, Origin::Store));
/// assert_eq!(retry.into_value(), 1250);
/// # Ok(()) }
/// ```
///
/// # Keys and fingerprints
///
/// A key is a scope plus an id. Stored keys outlive the build that wrote them, so every
/// part of a key comes from what the source spells, never from what a compiler says of a
/// type (`std::any::type_name` may change with the toolchain):
///
/// - The scope of a free function is its module path and name (`my_crate::billing::charge`).
/// - A method's scope names its type, so that two types' methods of one name never share
///   keys: put [`#[idem::scoped]`](macro@scoped) on the impl block, and the scope of each
///   `#[idempotent]` method in it is `<module>::<Type>::<method>` (`my_crate::billing::Payments::charge`;
///   in a trait impl, `my_crate::billing::<Payments as Charge>::charge`), from the impl's
///   type as the source spells it, generic arguments left out. A method with a receiver and
///   neither `#[idem::scoped]` nor a `scope` is a compile error. Associated functions
///   without a receiver in an impl without `#[idem::scoped]` use the module path: give them
///   a `scope` when two types in one module have one of the same name.
/// - A generic function, or a method of a generic impl, needs an explicit `scope`: the
///   source cannot name its instantiations apart, so they share the scope you give, and
///   what tells them apart belongs in the key (`key = (T::KIND, id)`).
/// - `scope = "..."` overrides all of this, and keeps the keys when the function moves or
///   is renamed.
///
/// The id is the `key = <expr>` value: a value that serializes as a string or an integer
/// (`&str`, `String`, any integer type, a `#[serde(transparent)]` newtype of one) stays
/// readable (`order-42`), any other `Serialize` value becomes a 128-bit digest (a `Uuid`
/// too: its compact form is bytes). A key that is an `Option` is its
/// value when `Some`; when `None` the call has no key, and answers [`Error::MissingKey`]
/// without running the body (or, with `missing_key = "run"`, runs it without
/// idempotency), so that requests without an id never share one key. Without `key`, the
/// id is the digest of every argument that is not skipped. The fingerprint, which tells a
/// retry from a different request under the same key, is the digest of every argument that
/// is not skipped. Receivers (`self`) are never part of either, nor an argument that is the
/// engine (`store = idem`, `store = &*idem`). Both are computed from the
/// arguments as they were passed, before the body runs. Digests follow a fixed, documented
/// encoding (struct fields in the order of their names, map entries in any order, enum
/// variants by name), so reordering a struct's fields or renaming a type keeps its keys.
///
/// # Options
///
/// | option | value | default |
/// |---|---|---|
/// | `key` | any expression of the arguments: a string, an integer or a `Serialize` value | digest of the arguments |
/// | `scope` | a string literal without `/` | module path and function name |
/// | `store` | the engine: an expression of type `Idem`, or `&`, `&mut`, `Arc`, `Rc` or `Box` of one (another pointer as `&*ptr`); not a bare store, which is a compile error saying so | the global engine ([`set_global`]) |
/// | `ttl` | how long a result is kept: `"24h"` or a `Duration` expression | the engine's (24 hours) |
/// | `lease` | how long a claim holds the key before another caller may take it over | the engine's (30 seconds) |
/// | `in_progress` | `"reject"` or `"wait"`: what a duplicate does while the first call runs | the engine's (`"reject"`) |
/// | `wait_timeout` | how long `"wait"` waits | the engine's (10 seconds) |
/// | `lease_loss` | `"cancel"` or `"finish"`: what the body does if its lease is lost while it runs ([`LeaseLoss`]) | the engine's (`"cancel"`) |
/// | `at_most_once` | alone: the body runs at most once per key even across a crash; a takeover that finds it started with no result holds the key ([`Error::OutcomeUnknown`] naming the step `call`) until it is resolved ([`Call::at_most_once`]) | a takeover runs the body again |
/// | `fingerprint` | a `Serialize` value to digest, a [`Fingerprint`], or `none` | digest of the arguments |
/// | `skip(a, b)` | arguments left out of the key and the fingerprint | none skipped |
/// | `cache_errors` | alone: store every `Err`; `= <predicate>`: store the `Err`s for which `Fn(&E) -> bool` is true | no error stored |
/// | `codec` | a [`Codec`](codec::Codec) value for the stored result | the engine's (JSON) |
/// | `version` | an integer written into every stored record; records of another version are refused | `0` |
/// | `missing_key` | `"error"` or `"run"`: what a call whose key is `None` does | `"error"` ([`Error::MissingKey`]) |
/// | `clone_cached` | alone: the engine's local cache keeps the result decoded and answers a hit with a clone (the type must be `Clone + Send + Sync + 'static`) | a hit decodes the cached bytes |
/// | `crate` | the path of the `idem` crate, as a string, when it is renamed | `"::idem"` |
///
/// Durations are string literals, checked at compile time (a whole number and one of
/// `ms`, `s`, `m`, `h`, `d`: `"250ms"`, `"30s"`, `"5m"`, `"24h"`, `"7d"`), or any
/// expression of type `Duration`.
///
/// ## `key`
///
/// ```
/// # use idem::idempotent;
/// # #[derive(serde::Serialize)] struct ChargeRequest { order_id: String, amount_cents: u64 }
/// // The id is "order-42": readable in the store, next to the scope.
/// #[idempotent(key = req.order_id)]
/// async fn charge(req: ChargeRequest) -> u64 {
///     req.amount_cents
/// }
///
/// // A tuple (or any `Serialize` value) is digested. A tuple's items are borrowed, so
/// // the body still owns `tenant`.
/// #[idempotent(key = (tenant, invoice_no))]
/// async fn issue_invoice(tenant: String, invoice_no: u32, lines: Vec<String>) -> usize {
///     lines.len()
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # idem::set_global(idem::Idem::new(idem::MemoryStore::new())).unwrap();
/// # let req = ChargeRequest { order_id: "order-42".into(), amount_cents: 5 };
/// # assert_eq!(charge(req).await.unwrap(), 5);
/// # let key = idem::Key::new(concat!(module_path!(), "::charge"), "order-42").unwrap();
/// # assert!(idem::global().unwrap().store().get(&key).await.unwrap().is_some());
/// # assert_eq!(issue_invoice("t".into(), 1, vec![]).await.unwrap(), 0);
/// # }
/// ```
///
/// ## `scope`
///
/// ```
/// # use idem::idempotent;
/// // Keeps the keys when the function moves to another module or is renamed, and lets
/// // two functions share keys on purpose.
/// #[idempotent(key = order_id, scope = "billing::charge::v2")]
/// async fn charge(order_id: String) -> bool {
///     true
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # idem::set_global(idem::Idem::new(idem::MemoryStore::new())).unwrap();
/// # assert!(charge("o-1".into()).await.unwrap());
/// # let key = idem::Key::new("billing::charge::v2", "o-1").unwrap();
/// # assert!(idem::global().unwrap().store().get(&key).await.unwrap().is_some());
/// # }
/// ```
///
/// ## `store`
///
/// ```
/// use std::sync::Arc;
/// use idem::{idempotent, Idem, MemoryStore};
///
/// struct Mailer {
///     idem: Arc<Idem>,
/// }
///
/// #[idem::scoped] // the method's scope is `<module>::Mailer::send`
/// impl Mailer {
///     // An expression evaluated on each call; it may use `self` and the arguments.
///     #[idempotent(key = user_id, store = self.idem)]
///     async fn send(&self, user_id: u64) -> String {
///         format!("sent to {user_id}")
///     }
/// }
///
/// // An engine passed as an argument is left out of the key and the fingerprint by
/// // itself: it is not part of the request.
/// #[idempotent(key = user_id, store = idem)]
/// async fn notify(idem: &Idem, user_id: u64) -> String {
///     format!("notified {user_id}")
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let mailer = Mailer { idem: Arc::new(Idem::new(MemoryStore::new())) };
/// assert_eq!(mailer.send(7).await.unwrap(), "sent to 7");
/// assert_eq!(notify(&mailer.idem, 7).await.unwrap(), "notified 7");
/// # }
/// ```
///
/// Without `store`, the function runs on the process's global engine, the one given to
/// [`set_global`] at start-up (a test sets one on a [`MemoryStore`]). When none is set, a
/// call fails with [`Error::Config`] naming the function and both fixes, and its body does
/// not run: see [`set_global`].
///
/// ## `ttl`, `lease`, `in_progress`, `wait_timeout`, `lease_loss`
///
/// ```
/// # use idem::idempotent;
/// use std::time::Duration;
///
/// const JOB_LEASE: Duration = Duration::from_secs(120);
///
/// #[idempotent(
///     key = job_id,
///     ttl = "7d",                // results are kept a week
///     lease = JOB_LEASE,         // a crashed worker's claim is taken over after 2 minutes
///     in_progress = "wait",      // a duplicate waits for the first run's result...
///     wait_timeout = "30s",      // ...for up to 30 seconds, then gets Error::WaitTimeout
///     lease_loss = "finish",     // a body whose lease is lost runs to its end (not stored)
/// )]
/// async fn render_report(job_id: u64) -> Vec<u8> {
///     vec![0; 16]
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # idem::set_global(idem::Idem::new(idem::MemoryStore::new())).unwrap();
/// # assert_eq!(render_report(1).await.unwrap().len(), 16); }
/// ```
///
/// ## `fingerprint`
///
/// ```
/// # use idem::idempotent;
/// // Only the amount and currency tell a retry from another request; the note may change.
/// #[idempotent(key = order_id, fingerprint = (amount_cents, &currency))]
/// async fn charge(order_id: String, amount_cents: u64, currency: String, note: String) -> u64 {
///     amount_cents
/// }
///
/// // No check at all: the first result answers every call with this key.
/// #[idempotent(key = event_id, fingerprint = none)]
/// async fn on_event(event_id: String, payload: Vec<u8>) -> usize {
///     payload.len()
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # idem::set_global(idem::Idem::new(idem::MemoryStore::new())).unwrap();
/// # assert_eq!(charge("o-9".into(), 5, "EUR".into(), "a".into()).await.unwrap(), 5);
/// # assert_eq!(charge("o-9".into(), 5, "EUR".into(), "b".into()).await.unwrap(), 5);
/// # assert!(matches!(charge("o-9".into(), 6, "EUR".into(), "a".into()).await, Err(idem::Error::KeyReuse { .. })));
/// # assert_eq!(on_event("e-1".into(), vec![1]).await.unwrap(), 1);
/// # assert_eq!(on_event("e-1".into(), vec![1, 2]).await.unwrap(), 1);
/// # }
/// ```
///
/// ## `skip`
///
/// ```
/// # use idem::idempotent;
/// pub struct HttpClient;
///
/// // A client, a connection or a trace id is not part of the request: skip it, as in
/// // `tracing::instrument`. An argument that is not `Serialize` must be skipped.
/// #[idempotent(skip(client, trace_id))]
/// async fn fetch_rates(client: &HttpClient, trace_id: u128, currency: String) -> f64 {
///     1.0
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # idem::set_global(idem::Idem::new(idem::MemoryStore::new())).unwrap();
/// # assert_eq!(fetch_rates(&HttpClient, 1, "EUR".into()).await.unwrap(), 1.0); }
/// ```
///
/// ## `cache_errors`
///
/// ```
/// # use idem::idempotent;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, Serialize, Deserialize)]
/// enum PaymentError {
///     Declined { reason: String },
///     GatewayTimeout,
///     Idem(String),
/// }
///
/// impl From<idem::Error> for PaymentError {
///     fn from(e: idem::Error) -> Self {
///         PaymentError::Idem(e.to_string())
///     }
/// }
///
/// // A declined card stays declined for this order: the error is stored and replayed.
/// // A gateway timeout is not: it releases the key, and a retry charges again.
/// #[idempotent(key = order_id, cache_errors = |e| matches!(e, PaymentError::Declined { .. }))]
/// async fn charge(order_id: String, amount_cents: u64) -> Result<String, PaymentError> {
///     Err(PaymentError::Declined { reason: "insufficient funds".into() })
/// }
///
/// // Alone, `cache_errors` stores every `Err`.
/// #[idempotent(key = order_id, cache_errors)]
/// async fn validate(order_id: String) -> Result<(), PaymentError> {
///     Ok(())
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # idem::set_global(idem::Idem::new(idem::MemoryStore::new())).unwrap();
/// # assert!(matches!(charge("o-1".into(), 5).await, Err(PaymentError::Declined { .. })));
/// # validate("o-1".into()).await.unwrap();
/// # }
/// ```
///
/// With `cache_errors`, `E` must be `Serialize + DeserializeOwned` as well.
///
/// ## `codec`
///
/// ```
/// # use idem::idempotent;
/// // Any `idem::codec::Codec`; JSON is the default. With the `postcard` feature,
/// // `codec = idem::codec::Postcard` stores compact bytes.
/// #[idempotent(key = id, codec = idem::codec::Json)]
/// async fn lookup(id: u64) -> Vec<u64> {
///     vec![id]
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # idem::set_global(idem::Idem::new(idem::MemoryStore::new())).unwrap();
/// # assert_eq!(lookup(3).await.unwrap(), vec![3]); }
/// ```
///
/// ## `version`
///
/// ```
/// # use idem::idempotent;
/// # #[derive(serde::Serialize, serde::Deserialize)] pub struct Quote { cents: u64 }
/// // `Quote` once held euros as a float; records written before the change must not be
/// // read as cents. A record of another version is refused with `Error::Decode` (never
/// // decoded into the new type) until it expires. A compatible change, such as a new
/// // `#[serde(default)]` field with JSON, needs no new version.
/// #[idempotent(key = order_id, version = 2)]
/// async fn quote(order_id: String) -> Quote {
///     Quote { cents: 1250 }
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # idem::set_global(idem::Idem::new(idem::MemoryStore::new())).unwrap();
/// # assert_eq!(quote("o-1".into()).await.unwrap().cents, 1250); }
/// ```
///
/// ## `missing_key`
///
/// ```
/// # use idem::idempotent;
/// # #[derive(serde::Serialize)] pub struct Signup { request_id: Option<String>, email: String }
/// // Requests without an id are not deduplicated, but run (and a `warn` event says so);
/// // by default they would get `Error::MissingKey` and not run.
/// #[idempotent(key = req.request_id, missing_key = "run")]
/// async fn sign_up(req: Signup) -> String {
///     format!("welcome {}", req.email)
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # idem::set_global(idem::Idem::new(idem::MemoryStore::new())).unwrap();
/// # let req = || Signup { request_id: None, email: "a@b".into() };
/// # assert_eq!(sign_up(req()).await.unwrap(), "welcome a@b");
/// # assert_eq!(sign_up(req()).await.unwrap(), "welcome a@b");
/// # }
/// ```
///
/// ## `clone_cached`
///
/// With a local cache on the engine ([`IdemBuilder::local_cache`]), a hit decodes the
/// cached record like a replay from the store. `clone_cached` keeps the decoded value
/// beside it instead, and answers each hit with a clone: the same value, since only a value
/// that came back unchanged through its codec is kept. The payload is still checked, and a
/// record of another `version` or codec is still refused. The clone must be a value of its
/// own: a type whose `Clone` shares state (an `Arc<Mutex<_>>` inside) would let one
/// caller's change reach every later hit; leave `clone_cached` off for such a type.
///
/// ```
/// # use std::time::Duration;
/// # use idem::{idempotent, Idem, MemoryStore};
/// #[derive(Clone, serde::Serialize, serde::Deserialize)]
/// pub struct Quote { cents: u64 }
///
/// #[idempotent(key = order_id, store = idem, skip(idem), clone_cached)]
/// async fn quote(idem: &Idem, order_id: String) -> Quote {
///     Quote { cents: 1250 }
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let idem = Idem::builder()
///     .store(MemoryStore::new())
///     .local_cache(10_000, Duration::from_secs(60))
///     .build()
///     .unwrap();
/// quote(&idem, "o-1".into()).await.unwrap();
/// // A clone of the value the cache kept, not a decode.
/// assert_eq!(quote(&idem, "o-1".into()).await.unwrap().cents, 1250);
/// # }
/// ```
///
/// ## `crate`
///
/// ```
/// // As with `payments_idem = { package = "idemkit", ... }` in Cargo.toml:
/// use ::idem as payments_idem;
///
/// #[payments_idem::idempotent(key = id, crate = "payments_idem")]
/// async fn lookup(id: u64) -> u64 {
///     id
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # payments_idem::set_global(payments_idem::Idem::new(payments_idem::MemoryStore::new())).unwrap();
/// # assert_eq!(lookup(3).await.unwrap(), 3); }
/// ```
///
/// # Methods, generics, patterns, `#[async_trait]`
///
/// The attribute works on free functions and methods (`&self`, `&mut self`,
/// `self: Arc<Self>`; with `#[idem::scoped]` on their impl block, or a `scope`), generic
/// functions with where-clauses and `impl Trait` arguments (with a `scope`), and
/// destructuring argument patterns (each binding is digested and can be skipped). The
/// signature, attributes, docs and visibility are kept; only the body is rewritten.
///
/// In an `#[async_trait]` impl, put `#[async_trait]` on the impl and `#[idempotent]` on the
/// method, as below: `#[async_trait]` expands first, and `#[idempotent]` then rewrites the
/// boxed future it produced. The trait's signature cannot change, so such a method must
/// return `Result<T, E>` with `E: From<idem::Error>`. In an impl of a trait with native
/// `async fn`, the same holds.
///
/// ```
/// use idem::{async_trait, idempotent, Idem, MemoryStore};
///
/// #[async_trait]
/// trait Payments {
///     async fn charge(&self, order_id: String, amount_cents: u64) -> Result<u64, idem::Error>;
/// }
///
/// struct Service {
///     idem: Idem,
/// }
///
/// #[async_trait]
/// #[idem::scoped] // scope: `<module>::<Service as Payments>::charge`
/// impl Payments for Service {
///     #[idempotent(key = order_id, store = self.idem)]
///     async fn charge(&self, order_id: String, amount_cents: u64) -> Result<u64, idem::Error> {
///         Ok(amount_cents)
///     }
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # let s = Service { idem: Idem::new(MemoryStore::new()) };
/// # assert_eq!(s.charge("o".into(), 1).await.unwrap(), 1);
/// # }
/// ```
///
/// With another attribute that rewrites the body, such as `#[tracing::instrument]`, put
/// `#[idempotent]` first (above it): the span then covers the store round trips too.
///
/// # What it expands to
///
/// This function:
///
/// ```
/// # use idem::idempotent;
/// # #[derive(Debug, serde::Serialize, serde::Deserialize)] pub struct Receipt;
/// # #[derive(Debug)] pub struct PaymentError;
/// # impl From<idem::Error> for PaymentError { fn from(_: idem::Error) -> Self { PaymentError } }
/// # #[derive(serde::Serialize)] pub struct ChargeRequest { order_id: String }
/// # pub struct Gateway;
/// # impl Gateway { async fn charge(&self, _: &ChargeRequest) -> Result<Receipt, PaymentError> { Ok(Receipt) } }
/// pub struct Payments {
///     idem: idem::Idem,
///     gateway: Gateway,
/// }
///
/// #[idem::scoped]
/// impl Payments {
///     #[idempotent(key = req.order_id, store = self.idem, ttl = "24h")]
///     pub async fn charge(&self, req: ChargeRequest) -> Result<Receipt, PaymentError> {
///         self.gateway.charge(&req).await
///     }
/// }
/// ```
///
/// is, written by hand with the public API (the expansion itself goes through hidden
/// helpers in `idem::__private`, which add the compile-time messages):
///
/// ```
/// # #[derive(Debug, serde::Serialize, serde::Deserialize)] pub struct Receipt;
/// # #[derive(Debug)] pub struct PaymentError;
/// # impl From<idem::Error> for PaymentError { fn from(_: idem::Error) -> Self { PaymentError } }
/// # #[derive(serde::Serialize)] pub struct ChargeRequest { order_id: String }
/// # pub struct Gateway;
/// # impl Gateway { async fn charge(&self, _: &ChargeRequest) -> Result<Receipt, PaymentError> { Ok(Receipt) } }
/// # pub struct Payments { idem: idem::Idem, gateway: Gateway }
/// use std::time::Duration;
/// use idem::{Fingerprint, Idem, Key};
///
/// impl Payments {
///     pub async fn charge(&self, req: ChargeRequest) -> Result<Receipt, PaymentError> {
///         // `store = self.idem`: an `Idem`, or a reference or pointer to one.
///         let engine: Idem = self.idem.clone();
///         // Key and fingerprint come first, from the arguments as passed.
///         // `key = req.order_id`: a string stays readable; the scope is the module path,
///         // the impl's type as `#[idem::scoped]` read it, and the method's name.
///         // An invalid key is returned as an error, before the store.
///         let key = Key::new(concat!(module_path!(), "::", "Payments", "::", "charge"), &req.order_id)?;
///         // The fingerprint digests every argument that is not skipped (`self` never is).
///         let fingerprint = Fingerprint::of(&(&req,));
///         engine
///             .call(key, fingerprint)
///             .ttl(Duration::from_millis(86_400_000)) // "24h", checked at compile time
///             // A `Result` body: `Ok` is stored, `Err` releases the key, and idem's own
///             // errors become `PaymentError` through `From<idem::Error>`.
///             .run_fallible(move || async move { self.gateway.charge(&req).await })
///             .await
///     }
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # let p = Payments { idem: idem::Idem::new(idem::MemoryStore::new()), gateway: Gateway };
/// # p.charge(ChargeRequest { order_id: "o".into() }).await.unwrap();
/// # }
/// ```
///
/// A function that returns a plain `T` calls `.run(...)` instead and returns
/// `Result<T, idem::Error>`; `cache_errors` calls `.run_caching_errors(predicate, ...)`.
///
/// ## A body with steps
///
/// The attribute does not rewrite the [`step`]s in a body: the body, steps and all, becomes
/// the closure the call runs, and each step finds its call at run time (the call's key,
/// lease and ttl, in a task-local of the body's task). So this function:
///
/// ```
/// # #[derive(Debug)] pub struct ShopError;
/// # impl From<idem::Error> for ShopError { fn from(_: idem::Error) -> Self { ShopError } }
/// # async fn charge_card(_: &str, _: &str) -> Result<String, ShopError> { Ok("ch_1".into()) }
/// # async fn send_receipt(_: &str) -> Result<(), ShopError> { Ok(()) }
/// #[idem::idempotent(key = order_id, store = idem)]
/// async fn checkout(idem: &idem::Idem, order_id: String) -> Result<String, ShopError> {
///     let charge = idem::step("charge", || async {
///         charge_card(&order_id, &idem::step_key("charge")?).await
///     })
///     .await?;
///     idem::step("email", || send_receipt(&charge)).await?;
///     Ok(charge)
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # let idem = idem::Idem::new(idem::MemoryStore::new());
/// # assert_eq!(checkout(&idem, "o-1".into()).await.unwrap(), "ch_1");
/// # }
/// ```
///
/// is, by hand (`store = idem` names an argument, which is then left out of the
/// fingerprint as `self` is):
///
/// ```
/// # #[derive(Debug)] pub struct ShopError;
/// # impl From<idem::Error> for ShopError { fn from(_: idem::Error) -> Self { ShopError } }
/// # async fn charge_card(_: &str, _: &str) -> Result<String, ShopError> { Ok("ch_1".into()) }
/// # async fn send_receipt(_: &str) -> Result<(), ShopError> { Ok(()) }
/// use idem::{Fingerprint, Key};
///
/// async fn checkout(idem: &idem::Idem, order_id: String) -> Result<String, ShopError> {
///     let key = Key::new(concat!(module_path!(), "::", "checkout"), &order_id)?;
///     let fingerprint = Fingerprint::of(&(&order_id,));
///     idem.call(key, fingerprint)
///         .run_fallible(move || async move {
///             // The body as written. Each step claims its own record under the call's
///             // key (`<scope>#step:charge/<order_id>`); on a later attempt of the key
///             // (after an `Err`, a panic or a takeover) a completed step answers its
///             // recorded value instead of running again.
///             let charge = idem::step("charge", || async {
///                 charge_card(&order_id, &idem::step_key("charge")?).await
///             })
///             .await?;
///             idem::step("email", || send_receipt(&charge)).await?;
///             Ok(charge)
///         })
///         .await
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # let idem = idem::Idem::new(idem::MemoryStore::new());
/// # assert_eq!(checkout(&idem, "o-1".into()).await.unwrap(), "ch_1");
/// # }
/// ```
///
/// An `#[idempotent]` function called in that body is a call of its own, with its own key
/// and its own steps; wrap it in a step to make it one of the parent's, and give it
/// [`step_key`] as its key to derive its key from the parent's. The guide's chapter on
/// steps says more.
///
/// # Compile errors
///
/// Mistakes are reported at the offending token: an unknown option (with the list of
/// valid ones), a duplicated option, a bad duration literal, an unknown `in_progress`
/// value, a `skip` that names no argument, `cache_errors` on a function without a
/// `Result`, a function that is not `async` (or is `const` or `extern`), a result type
/// that cannot be stored (at the return type), a key that cannot be a key (at the key
/// expression), an argument that cannot be digested (at the argument, suggesting `skip`),
/// a method without `#[idem::scoped]` or `scope` (at `self`), a generic function without
/// `scope` (at the type parameter).
/// Each is the only message: beside the errors, the function is still emitted with the
/// signature the attribute gives it and its body type-checked (never run), so its callers,
/// its arguments and the imports the attribute names raise no error or warning of their own.
///
/// ```compile_fail
/// use idem::idempotent;
///
/// pub struct Connection;
///
/// // error: argument of type `&Connection` is not `Serialize`, so it cannot be part of
/// // the idempotency key and fingerprint; leave it out with `skip(conn)`.
/// #[idempotent]
/// async fn insert(conn: &Connection, row: String) -> u64 {
///     1
/// }
/// ```
#[doc(inline)]
pub use idem_macros::idempotent;

/// On an impl block: gives each `#[idempotent]` method in it without a `scope` the default
/// scope `<module>::<Type>::<method>` (`<module>::<Type as Trait>::<method>` in a trait
/// impl), from the impl's type as the source spells it, generic arguments left out.
///
/// ```
/// use idem::idempotent;
///
/// pub struct Orders;
/// pub struct Users;
///
/// #[idem::scoped]
/// impl Orders {
///     #[idempotent(key = id)]
///     pub async fn create(&self, id: u64) -> u64 { id }
/// }
///
/// #[idem::scoped]
/// impl Users {
///     // Same module, same method name: another scope, so other keys.
///     #[idempotent(key = id)]
///     pub async fn create(&self, id: u64) -> u64 { id + 1000 }
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # idem::set_global(idem::Idem::new(idem::MemoryStore::new())).unwrap();
/// assert_eq!(Orders.create(1).await.unwrap(), 1);
/// assert_eq!(Users.create(1).await.unwrap(), 1001);
/// let key = idem::Key::new(concat!(module_path!(), "::Orders::create"), "1").unwrap();
/// assert!(idem::global().unwrap().store().get(&key).await.unwrap().is_some());
/// # }
/// ```
///
/// Without it, an `#[idempotent]` method with a receiver needs its own `scope = "..."`. A
/// generic impl's methods always do (see [`idempotent`](macro@idempotent), "Keys and
/// fingerprints").
#[doc(inline)]
pub use idem_macros::scoped;

/// The conformance suite every store backend passes (feature `testing`).
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub use idem_core::testing;

/// Stamps the conformance suite (one `#[tokio::test]` per behaviour) for a store, in a
/// module named by its first argument (feature `testing`; needs `tokio` with `macros` and
/// `rt-multi-thread` among the dev-dependencies, see [`testing`]).
///
/// ```text
/// idem::conformance_tests!(my_store, async { Some(MyStore::connect().await) });
/// ```
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub use idem_core::conformance_tests;

/// Store backends: the memory store and those whose cargo feature is on.
pub mod stores {
    pub use idem_stores::*;
}

// Only in the docs: the guide has no items, and a build that uses idem gains nothing from
// it. Its examples name sqlx, redis and axum as a user writes them, so they run as doctests
// of idem-integration (its src/lib.rs), whose dev-dependencies those are: here, they would
// make `cargo run --example quickstart` build them too. (rustdoc sets `doc` when it collects
// doctests as well.)
#[cfg(all(doc, not(doctest)))]
pub mod guide;

static GLOBAL: OnceLock<Idem> = OnceLock::new();

/// Sets the process's global engine: the one `#[idempotent]` functions without
/// `store = ...` run on. It can be set once; a second call returns the engine back as `Err`.
///
/// This is the one place that chooses where such functions keep their records, as
/// `tracing::subscriber::set_global_default` is the one place that chooses where events go.
/// Until it is set, a call of such a function fails closed: [`Error::Config`] naming the
/// function, `store = ...` and this function, and the body does not run. There is no
/// implicit default, because the only one idem could pick is an in-process memory store,
/// which a service of several instances must not have (it shares nothing between them);
/// nor does building an engine anywhere else change what these functions do.
///
/// In a service, set the shared engine at start-up; in tests, the memory store:
///
/// ```
/// use idem::{idempotent, Idem, MemoryStore};
///
/// #[idempotent(key = id)]
/// async fn charge(id: u64) -> u64 { id }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // Without a global engine, the call is refused and the body does not run.
/// assert!(matches!(charge(1).await, Err(idem::Error::Config { .. })));
/// idem::set_global(Idem::new(MemoryStore::new())).unwrap();
/// assert_eq!(charge(1).await.unwrap(), 1);
/// // Set once: tests sharing a binary may each try, `let _ = idem::set_global(...)`.
/// assert!(idem::set_global(Idem::new(MemoryStore::new())).is_err());
/// # }
/// ```
pub fn set_global(idem: Idem) -> Result<(), Idem> {
    GLOBAL.set(idem)
}

/// The global engine, once [`set_global`] has set it.
pub fn global() -> Option<&'static Idem> {
    GLOBAL.get()
}

/// The key of a call of a function without `store = ...`, or the error that refuses it
/// while no global engine is set.
fn global_key(scope: &str, key: Result<Key, Error>) -> Result<Key, Error> {
    if GLOBAL.get().is_some() {
        return key;
    }
    Err(Error::Config {
        message: format!(
            "`{scope}` has no `store = ...` and no global engine is set: give its #[idempotent] a `store = <your Idem>`, or set the process's engine at startup with idem::set_global(Idem::new(store)) (in tests, a MemoryStore)"
        ),
        source: None,
    })
}

/// An engine with every default on the store a URL names (`memory://`, `sqlite://...`,
/// `postgres://...`, `mysql://...`, `redis://...`, `redis+cluster://...`). A scheme whose
/// cargo feature is off answers with an error that names the feature; an unknown scheme or
/// a malformed URL, with an [`Error::Config`] that says so. No error shows the URL's
/// password (see [`stores::connect`]). A SQL store creates its table when it is missing, as
/// the store's own `connect` does.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem::Error> {
/// let idem = idem::connect("memory://").await?;
/// # let _ = idem;
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Idem, Error> {
    let store = idem_stores::connect(url).await?;
    Idem::builder().shared_store(store).build()
}

#[doc(hidden)]
pub mod __private {
    pub use idem_core::private::*;

    /// The engine of a function without `store = ...`: the global one, or, while none is
    /// set, an engine that is never reached (its calls fail first, see [`implicit_global`]).
    pub fn global() -> &'static idem_core::Idem {
        static UNSET: std::sync::OnceLock<idem_core::Idem> = std::sync::OnceLock::new();
        crate::global().unwrap_or_else(|| {
            UNSET.get_or_init(|| idem_core::Idem::new(crate::MemoryStore::new()))
        })
    }

    /// The key of a call on the engine of a function without `store = ...`, or the
    /// configuration error that refuses it (see [`set_global`](crate::set_global)).
    pub fn implicit_global(
        scope: &str,
        key: Result<idem_core::Key, idem_core::Error>,
    ) -> Result<idem_core::Key, idem_core::Error> {
        crate::global_key(scope, key)
    }
}
