//! The conformance suite, once per backend. `cargo test -p idem-stores memory` runs one.

use idem_stores::MemoryStore;

idem_core::conformance_tests!(memory, async { Some(MemoryStore::new()) });
