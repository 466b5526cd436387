//! Compile-time behaviour of `#[idempotent]`: what compiles (`tests/ui/pass`) and the
//! errors for each misuse, at the offending token (`tests/ui/fail/*.stderr`).
//!
//! Regenerate the expected errors with `TRYBUILD=overwrite cargo test -p idem --test ui`,
//! then read every changed `.stderr`: the message and its span are what is under test.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
