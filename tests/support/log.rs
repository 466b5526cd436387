//! Tracing output captured in memory, for the tests that read what idem logs. Each such
//! test lives in a binary of its own: tracing caches callsite interest process-wide.

use std::sync::{Arc, Mutex};

/// The formatted lines written so far; `events.0.lock()` reads them.
#[derive(Clone, Default)]
pub struct Events(pub Arc<Mutex<Vec<String>>>);

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

/// Captures events up to `level` on this thread until the guard drops.
pub fn capture(level: tracing::Level) -> (Events, tracing::subscriber::DefaultGuard) {
    let events = Events::default();
    let sink = events.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    (events, tracing::subscriber::set_default(subscriber))
}
