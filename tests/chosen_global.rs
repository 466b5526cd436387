//! `idem::set_global` with the memory store: a choice made in plain sight, which neither
//! warns nor is refused beside a shared store. In a binary of its own: the global engine
//! is process-wide.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use idem::{idempotent, Idem, MemoryStore, StoreWrapper};

static RUNS: AtomicU32 = AtomicU32::new(0);

#[idempotent(key = id, scope = "chosen_global::charge")]
async fn charge(id: u32) -> u32 {
    RUNS.fetch_add(1, Ordering::SeqCst);
    id
}

#[derive(Debug, Default)]
struct Shared(MemoryStore);

impl StoreWrapper for Shared {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.0
    }
    fn backend(&self) -> &'static str {
        "redis"
    }
}

#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<String>>>);

impl std::io::Write for Events {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let line = String::from_utf8_lossy(buf).into_owned();
        self.0.lock().unwrap().push(line);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_global_engine_chosen_with_set_global_runs_beside_a_shared_store_without_warning() {
    let events = Events::default();
    let sink = events.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    idem::set_global(Idem::new(MemoryStore::new())).unwrap();
    let _redis = Idem::new(Shared::default());
    assert_eq!(charge(1).await.unwrap(), 1);
    assert_eq!(charge(1).await.unwrap(), 1);
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
    let events = events.0.lock().unwrap();
    assert!(events.is_empty(), "{events:?}");
}
