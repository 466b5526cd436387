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
pub use idem_core::{
    codec, fence, step, BoxError, Call, CallWithOutcome, DecodeError, Error, Fence, Fingerprint,
    Idem, IdemBuilder, InProgress, Key, LeaseLoss, MissingKey, Origin, Outcome, DEFAULT_LEASE,
    DEFAULT_RETRY_AFTER, DEFAULT_STORE_TIMEOUT, DEFAULT_TTL, DEFAULT_WAIT_TIMEOUT,
};

/// What a [`Call`]'s run methods answer: its value ([`Bare`](call::Bare), the default) or,
/// after [`Call::with_outcome`], an [`Outcome`] ([`WithOutcome`](call::WithOutcome)).
pub mod call {
    pub use idem_core::{Answer, Bare, WithOutcome};
}

/// Steps: the side effects of one call, each run once across its attempts ([`step`] runs
/// one, [`Step`](steps::Step) sets how), and the resolution of those whose outcome is
/// unknown ([`Resolution`](steps::Resolution), the reconcile hook's [`Unresolved`](steps::Unresolved),
/// [`Idem::resolve`]). The guide's steps chapter walks through them.
pub mod steps {
    pub use idem_core::{
        step, step_key, step_record, Ambiguous, NeverUnknown, Resolution, Resolved, Step,
        StepRecord, Unresolved, MAX_STEP_NAME_LEN,
    };
}

/// The store contract, for those who write or wrap a store: the [`Store`](store::Store)
/// trait, what it answers, [`StoreWrapper`](store::StoreWrapper) to add behaviour around
/// another store, and the two foreign items its signatures name (`Bytes` payloads and the
/// `async_trait` attribute its methods are written with), at the versions it uses.
pub mod store {
    pub use idem_core::{
        async_trait, Bytes, Capabilities, Claim, Record, Store, StoreError, StoreWrapper, Token,
    };
}
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

// The attributes' references are Markdown files in src/docs/, whose examples run as this
// crate's doctests.
#[doc = include_str!("docs/idempotent.md")]
#[doc(inline)]
pub use idem_macros::idempotent;

#[doc = include_str!("docs/scoped.md")]
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
    connect_with(url, Idem::builder()).await
}

/// An engine built by `builder`, with its options and hooks, on the store a URL names:
/// [`connect`] with a builder of your own instead of every default. The URL's store
/// replaces any store the builder was given.
///
/// ```
/// use std::time::Duration;
/// use idem::{steps::Resolution, Idem};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem::Error> {
/// let builder = Idem::builder()
///     .ttl(Duration::from_secs(24 * 3600))
///     .reconcile(|unresolved| async move {
///         // Ask the provider what became of the step under `unresolved.step_key()`.
///         let _ = unresolved.step_key();
///         Some(Resolution::NotRan)
///     });
/// let idem = idem::connect_with("memory://", builder).await?;
/// # let _ = idem;
/// # Ok(()) }
/// ```
pub async fn connect_with(url: &str, builder: IdemBuilder) -> Result<Idem, Error> {
    let store = idem_stores::connect(url).await?;
    builder.shared_store(store).build()
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
