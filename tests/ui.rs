//! Compile-time behaviour of `#[idempotent]`: what compiles (`tests/ui/pass`) and the
//! errors for each misuse, at the offending token (`tests/ui/fail/*.stderr`).
//!
//! Regenerate the expected errors with `TRYBUILD=overwrite cargo test -p idemkit --test ui`,
//! then read every changed `.stderr`: the message and its span are what is under test.
//!
//! The expected errors are rustc's wording on the stable toolchain CI runs; a beta or
//! nightly compiler words some of them differently, so there the fail cases are ignored
//! (as tracing-attributes does) rather than failing a build of the workspace.

#[test]
fn pass() {
    trybuild::TestCases::new().pass("tests/ui/pass/*.rs");
}

#[rustversion::attr(not(stable), ignore = "rustc's wording is checked on stable only")]
#[test]
fn compile_fail() {
    trybuild::TestCases::new().compile_fail("tests/ui/fail/*.rs");
}
