//! The runtime of [idem](https://docs.rs/idemkit): the [`Store`] contract, the [`Idem`]
//! engine, keys, fingerprints, codecs, the record envelope and the errors.
//!
//! Most users depend on the `idem` crate, which re-exports all of this together with the
//! `#[idempotent]` attribute and the store backends. Depend on `idem-core` directly to
//! write a store backend; its conformance suite is in the module `testing` (feature `testing`).
#![deny(missing_docs)]
// No unsafe code in what users build (the workspace's lints deny it; here it is forbidden).
// The conformance suite (feature `testing`, for test binaries only) has one `atexit` call,
// to report skipped tests after libtest's summary.
#![cfg_attr(not(feature = "testing"), forbid(unsafe_code))]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod cache;
pub mod codec;
pub mod dedup;
mod digest;
mod engine;
pub mod envelope;
mod error;
mod key;
mod store;
mod wrapper;

#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

#[doc(hidden)]
pub mod private;

pub use async_trait::async_trait;
pub use bytes::Bytes;
pub use codec::{BuiltinCodec, Codec, Json};
pub use digest::digest_hex;
pub use engine::{
    fence, step, step_key, step_record, Ambiguous, Answer, Bare, Call, CallWithOutcome, Idem,
    IdemBuilder, InProgress, LeaseLoss, MissingKey, NeverUnknown, Origin, Outcome, Resolution,
    Resolved, Step, StepRecord, Unresolved, WithOutcome, DEFAULT_LEASE, DEFAULT_RETRY_AFTER,
    DEFAULT_STORE_TIMEOUT, DEFAULT_TTL, DEFAULT_WAIT_TIMEOUT, MAX_DURATION,
};
pub use error::{BoxError, DecodeError, Error, StoreError};
pub use key::{Key, MAX_ID_LEN, MAX_SCOPE_LEN, MAX_STEP_NAME_LEN};
pub use store::{Capabilities, Claim, Fence, Fingerprint, Record, Store, Token};
pub use wrapper::StoreWrapper;
