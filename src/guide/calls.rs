//! # What a call does
//!
//! Four sequence diagrams of one key, `billing::charge/order-42`, between a caller, the
//! engine (what `#[idempotent]` expands to) and the store. Each picture is drawn from the
//! mermaid source below it (`src/guide/diagrams/*.mmd`) by `tools/seqdiag/seqdiag.py`,
//! which writes the SVG shown here, so the docs need no JavaScript.
//!
//! ## A first call
//!
//! The claim is one atomic step: no record under the key, so the store writes one held by
//! this call's fencing token `T1` for the length of a lease. The body runs while the
//! engine extends the lease in the background; its result is encoded, stored under the
//! same token, and only then returned.
//!
#![doc = include_str!("diagrams/first_call.svg")]
//!
//! <details><summary>mermaid source</summary>
//!
//! ```mermaid
#![doc = include_str!("diagrams/first_call.mmd")]
//! ```
//!
//! </details>
//!
//! ## A replay
//!
//! A retry (or a second delivery) finds the completed record. The store answers it with
//! the claim itself, so a replay costs one step and writes nothing. The engine compares
//! fingerprints: the same key with another payload is [`Error::KeyReuse`](crate::Error),
//! never the first payload's result.
//!
#![doc = include_str!("diagrams/replay.svg")]
//!
//! <details><summary>mermaid source</summary>
//!
//! ```mermaid
#![doc = include_str!("diagrams/replay.mmd")]
//! ```
//!
//! </details>
//!
//! ## A concurrent duplicate: reject, or wait
//!
//! A duplicate that arrives while the first call still runs finds a live lease held by
//! another token. With `in_progress = "reject"` (the default) it gets
//! [`Error::InProgress`](crate::Error) at once, with a hint of when to retry. With
//! `in_progress = "wait"` it waits for the record to change (the memory store wakes it;
//! remote stores are polled with capped backoff), bounded by `wait_timeout`, then claims
//! again and gets the first call's result.
//!
#![doc = include_str!("diagrams/concurrent.svg")]
//!
//! <details><summary>mermaid source</summary>
//!
//! ```mermaid
#![doc = include_str!("diagrams/concurrent.mmd")]
//! ```
//!
//! </details>
//!
//! ## A crash, a takeover, and fencing
//!
//! A holder that crashes sends no more extends, so its lease ends and the next claim takes
//! the key over (`recovered: true` where the store reports it). A holder that only stalled
//! may come back later and try to store its result: the store takes `complete`, `extend`
//! and `release` only from the current token, so the stale step is fenced and cannot
//! overwrite its successor's result. A holder whose own heartbeat sees the lease lost is
//! cancelled at its next `.await` (see [the promise](super::promise)). The successor's
//! claim also carries a larger fence than the stale holder's, for the writes the body makes
//! outside the store (see [fencing your own writes](super::failures#fencing-your-own-writes)).
//!
#![doc = include_str!("diagrams/takeover.svg")]
//!
//! <details><summary>mermaid source</summary>
//!
//! ```mermaid
#![doc = include_str!("diagrams/takeover.mmd")]
//! ```
//!
//! </details>
