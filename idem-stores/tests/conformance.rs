//! The conformance suite, once per backend. `cargo test -p idem-stores memory` runs one.

use idem_stores::MemoryStore;

// The memory store keeps tokio's time: on a paused clock its leases and ttls end exactly
// when the suite's sleeps say, with no real waiting and no race with a busy machine.
idem_core::conformance_tests!(memory, paused, async { Some(MemoryStore::new()) });
