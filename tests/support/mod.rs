//! What the facade's test files share: store wrappers that count, fail, hang or rename
//! (`stores`), the engine tests' fixtures (`engine`) and captured tracing output (`log`).
//! Each test file is a crate of its own that uses part of this: hence `allow(dead_code)`.
#![allow(dead_code)]

pub mod engine;
pub mod log;
pub mod stores;
