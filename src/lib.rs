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
//!         .run(key, Fingerprint::of(&1250u64), || async {
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
//! let _: u32 = idem.run(key.clone(), Fingerprint::of(&1250u64), || async { 1 }).await.unwrap();
//! let err = idem.run::<u32, _, _>(key, Fingerprint::of(&9999u64), || async { 2 }).await.unwrap_err();
//! assert!(matches!(err, Error::KeyReuse { .. }));
//! # }
//! ```
//!
//! ## Backends
//!
//! [`MemoryStore`] is always available. `sqlite`, `postgres`, `redis` and `redis-cluster`
//! are cargo features; [`connect`] picks a store from a URL.
#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::sync::OnceLock;

pub use idem_core::{
    codec, BoxError, BuiltinCodec, Call, Capabilities, Claim, Codec, DecodeError, Error,
    Fingerprint, Idem, IdemBuilder, InProgress, Json, Key, ReadableKeyId, Record, Store,
    StoreError, Token, DEFAULT_LEASE, DEFAULT_TTL, DEFAULT_WAIT_TIMEOUT,
};
pub use idem_core::{async_trait, digest_hex, Bytes};
pub use idem_stores::MemoryStore;

#[doc(inline)]
pub use idem_macros::idempotent;

/// The conformance suite every store backend passes (feature `testing`).
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub use idem_core::testing;

/// Store backends: the memory store and those whose cargo feature is on.
pub mod stores {
    pub use idem_stores::*;
}

static GLOBAL: OnceLock<Idem> = OnceLock::new();

/// Sets the engine that `#[idempotent]` functions without `store = ...` use. It can be set
/// once, before the first such call; afterwards it returns the engine back as `Err`.
/// Without it, the global engine is an in-memory store with every default.
pub fn set_global(idem: Idem) -> Result<(), Idem> {
    GLOBAL.set(idem)
}

/// The global engine: the one given to [`set_global`], or else an in-memory one.
pub fn global() -> &'static Idem {
    GLOBAL.get_or_init(|| Idem::new(MemoryStore::new()))
}

/// An engine with every default on the store a URL names (`memory://`, `sqlite://...`,
/// `postgres://...`, `redis://...`, `redis+cluster://...`). A scheme whose cargo feature is
/// off answers with an error that names the feature.
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

    /// The engine of a function without `store = ...`.
    pub fn global() -> &'static idem_core::Idem {
        crate::global()
    }
}
