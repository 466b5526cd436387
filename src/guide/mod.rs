//! # The idem guide
//!
//! The README shows one function; this guide is the rest, in the order a new user meets
//! it. Every Rust example here is a doctest: `cargo test -p idem-integration --all-features
//! --doc guide` compiles and runs them on the memory store. Those that need a server
//! (Postgres, MySQL, Redis) are compiled with their feature and not run.
//!
//! 1. [First steps](first_steps): `#[idempotent]` on a function and on a method, the
//!    global engine, return types, telling a replay from a first run.
//! 2. [What a call does](calls): a first call, a replay, a concurrent duplicate, a crash
//!    and its takeover with fencing, as sequence diagrams.
//! 3. [The promise](promise): what "idempotent" guarantees, and what is refused.
//! 4. [Keys and records](keys): scopes, ids, digests, the stored envelope, codecs.
//! 5. [The engine API](engine): `Idem::call` without the macro, outcomes, options.
//! 6. [Steps](steps): operations with several side effects, each run once per key; a
//!    retry resumes after the last completed step; unknown outcomes held until resolved;
//!    calls inside calls.
//! 7. [Failures and timeouts](failures): step timeouts, and what an outage looks like to a
//!    caller.
//! 8. [Stores](stores): choosing one, your own store, the SQL stores, Redis.
//! 9. [Durability](durability): how durable a stored result is across a failover.
//! 10. [HTTP](http): the `Idempotency-Key` header as a tower layer, and a retrying client.
//! 11. [Jobs and consumers](consumers): at-least-once delivery made effective once, and
//!     dedup inside a database transaction.
//! 12. [Operating idem](operating): the `idem.call` span, metrics, TLS, the `idem` command.
//!
//! Contributors: `CONTRIBUTING.md` in the repository says how to run the backend tests,
//! the reliability suite, the benchmarks and the fuzzers.

pub mod calls;
pub mod consumers;
pub mod durability;
pub mod engine;
pub mod failures;
pub mod first_steps;
pub mod http;
pub mod keys;
pub mod operating;
pub mod promise;
pub mod steps;
pub mod stores;
