//! Not published: what the facade's root package cannot hold without `cargo run --example
//! quickstart` building it too (cargo builds all of a package's dev-dependencies for any
//! of its examples): the examples on real servers, brokers and HTTP stacks (`examples/`),
//! the tests that need those or heavy crates (`tests/`), and the benchmarks (`benches/`).
//!
//! The library itself is empty. It exists for the guide (the facade's `src/guide/`, on
//! docs.rs as `idem::guide`): its examples name sqlx, redis and axum as a user writes them,
//! so they run here as doctests, against this package's dev-dependencies:
//! `cargo test -p idem-integration --all-features --doc guide`.
#![deny(missing_docs)]

#[cfg(doctest)]
#[path = "../../src/guide/mod.rs"]
pub mod guide;
