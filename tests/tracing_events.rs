//! The engine's tracing events. In a test binary of its own: tracing caches whether a
//! callsite is wanted process-wide, and a sibling test thread without a subscriber that
//! reaches a callsite first would hide it from the subscriber this test installs.

mod support;

use support::stores::ClaimFresh;

use std::time::Duration;

use idem::{Fingerprint, Idem, Key, MemoryStore};

fn key(id: &str) -> Key {
    Key::new("engine-tests", id).unwrap()
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
enum PayError {
    Timeout,
    Idem(String),
}

impl From<idem::Error> for PayError {
    fn from(e: idem::Error) -> Self {
        PayError::Idem(e.to_string())
    }
}

#[tokio::test(start_paused = true)]
async fn tracing_events_mark_claim_replay_complete_release_and_takeover() {
    let (events, _guard) = support::log::capture(tracing::Level::TRACE);

    let store = MemoryStore::new();
    let idem = Idem::new(store.clone());
    let _: u8 = idem
        .call(key("t1"), Fingerprint::NONE)
        .run(|| async { 1 })
        .await
        .unwrap();
    let _: u8 = idem
        .call(key("t1"), Fingerprint::NONE)
        .run(|| async { 1 })
        .await
        .unwrap();
    let _: Result<u8, PayError> = idem
        .call(key("t2"), Fingerprint::NONE)
        .run_fallible(|| async { Err(PayError::Timeout) })
        .await;
    // A holder that vanished: its lease ends and the next call takes over.
    store
        .claim_fresh(&key("t3"), Duration::from_secs(1))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(2)).await;
    let _: u8 = idem
        .call(key("t3"), Fingerprint::NONE)
        .run(|| async { 3 })
        .await
        .unwrap();

    // A client-chosen id with a newline and a terminal escape cannot forge a log line.
    let forged = Key::new(
        "engine-tests",
        "t4\n2026-11-29T00:00:00Z  INFO idem: forged\u{1b}[2J",
    )
    .unwrap();
    let _: u8 = idem
        .call(forged, Fingerprint::NONE)
        .run(|| async { 4 })
        .await
        .unwrap();
    // A call without a key, told to run anyway, says so.
    // (A missing key, as `#[idempotent]` passes it on through its hidden helper.)
    let no_key = Err(idem::Error::MissingKey {
        scope: "engine-tests::no_key".into(),
    });
    let _: u8 = idem::__private::call(&idem, no_key, Fingerprint::NONE)
        .missing_key(idem::MissingKey::Run)
        .run(|| async { 5 })
        .await
        .unwrap();

    let log = events.0.lock().unwrap().concat();
    for needle in ["claimed", "replay", "completed", "released", "took over"] {
        assert!(log.contains(needle), "no `{needle}` event in:\n{log}");
    }
    assert!(
        log.contains("engine-tests/t3"),
        "events name the key:\n{log}"
    );
    assert!(
        log.contains("engine-tests/t4\\n2026-11-29T00:00:00Z  INFO idem: forged\\u{1b}[2J"),
        "the id is escaped:\n{log}"
    );
    assert!(
        !log.lines()
            .any(|line| line.starts_with("2026-11-29T00:00:00Z")),
        "no line starts where the id tried to start one:\n{log}"
    );
    assert!(
        !log.contains('\u{1b}'),
        "no escape sequence reaches the log"
    );
    assert!(
        log.lines().any(|line| line.contains("WARN")
            && line.contains("without idempotency")
            && line.contains("engine-tests::no_key")),
        "a call run without a key is a warning naming its scope:\n{log}"
    );
}
