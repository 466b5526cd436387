//! SQLite store: the conformance suite, one fresh file and table per test, and what only a
//! file on disk can show: many tasks and two processes on one file, reopening, a missing
//! table, a junk row, a closed pool. Always runs (no server needed).
#![cfg(feature = "sqlite")]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use idem_core::{
    Capabilities, Claim, Error, Fingerprint, Idem, InProgress, Key, Record, Store, StoreError,
    Token,
};
use idem_stores::SqliteStore;
use tempfile::TempDir;

/// A store with the temporary directory that holds its file, removed when the test ends.
#[derive(Debug)]
struct InTempDir {
    store: SqliteStore,
    _dir: TempDir,
}

#[async_trait]
impl Store for InTempDir {
    async fn claim(
        &self,
        key: &Key,
        fp: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.store.claim(key, fp, token, lease).await
    }
    async fn complete(
        &self,
        key: &Key,
        token: Token,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.store.complete(key, token, payload, ttl).await
    }
    async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError> {
        self.store.release(key, token).await
    }
    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
        self.store.extend(key, token, lease).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.store.get(key).await
    }
    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        self.store.delete(key).await
    }
    async fn replace(
        &self,
        key: &Key,
        expected: &[u8],
        new: Option<(Bytes, Duration)>,
    ) -> Result<bool, StoreError> {
        self.store.replace(key, expected, new).await
    }
    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }
    fn backend(&self) -> &'static str {
        self.store.backend()
    }
}

static TABLES: AtomicU64 = AtomicU64::new(0);

/// A fresh file in a fresh directory, with a table of its own, migrated.
async fn fresh() -> InTempDir {
    let dir = tempfile::tempdir().unwrap();
    let table = format!("records_{}", TABLES.fetch_add(1, Ordering::Relaxed));
    let store = SqliteStore::open(dir.path().join("idem.db"))
        .await
        .unwrap()
        .with_table(&table)
        .unwrap();
    store.migrate().await.unwrap();
    InTempDir { store, _dir: dir }
}

idem_core::conformance_tests!(sqlite, async { Some(super::fresh().await) });

#[macro_use]
#[path = "support/sql.rs"]
mod sql_suite;

/// A store on a file of its own in a temporary directory (the guard), not migrated.
async fn unmigrated() -> Option<(SqliteStore, TempDir)> {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::builder()
        .migrate(false)
        .open(dir.path().join("idem.db"))
        .await
        .unwrap();
    Some((store, dir))
}

/// A URL of a file in a temporary directory (the guard).
async fn temporary_url() -> Option<(String, TempDir)> {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    Some((url, dir))
}

sql_store_tests!(
    SqliteStore,
    fresh = super::unmigrated(),
    url = super::temporary_url(),
);

fn key(id: &str) -> Key {
    Key::new("sqlite-tests", id).unwrap()
}

/// The child half of `two_processes_on_one_file_have_one_winner_per_key`: does nothing
/// unless started by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn child_process_claims() {
    let Ok(path) = std::env::var("IDEM_SQLITE_CHILD_FILE") else {
        return;
    };
    let start: u64 = std::env::var("IDEM_SQLITE_CHILD_START")
        .unwrap()
        .parse()
        .unwrap();
    let store = SqliteStore::open(&path).await.unwrap();
    let idem = Idem::builder()
        .store(store)
        .in_progress(InProgress::Wait)
        .wait_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    // Both children start at the same wall-clock instant, so their claims overlap.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    tokio::time::sleep(Duration::from_millis(start.saturating_sub(now))).await;
    let pid = std::process::id();
    let tasks: Vec<_> = (0..40)
        .map(|k| {
            let idem = idem.clone();
            tokio::spawn(async move {
                let v: String = idem
                    .call(key(&format!("k{k}")), Fingerprint::NONE)
                    .run(|| async move {
                        println!("IDEM-RAN k{k}");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        format!("{pid}")
                    })
                    .await
                    .unwrap();
                println!("IDEM-ANSWER k{k} {v}");
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_one_file_have_one_winner_per_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    SqliteStore::open(&path)
        .await
        .unwrap()
        .migrate()
        .await
        .unwrap();
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 1500;
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..2)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([
                    "child_process_claims",
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("IDEM_SQLITE_CHILD_FILE", &path)
                .env("IDEM_SQLITE_CHILD_START", start.to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut ran: HashMap<String, u32> = HashMap::new();
    let mut answers: HashMap<String, Vec<String>> = HashMap::new();
    let mut ran_per_child = Vec::new();
    for child in children {
        let out = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut mine = 0;
        for line in stdout.lines() {
            // The harness prints `test child_process_claims ... ` before the first line.
            let line = line.find("IDEM-").map_or(line, |at| &line[at..]);
            if let Some(k) = line.strip_prefix("IDEM-RAN ") {
                *ran.entry(k.to_owned()).or_default() += 1;
                mine += 1;
            } else if let Some(rest) = line.strip_prefix("IDEM-ANSWER ") {
                let (k, v) = rest.split_once(' ').unwrap();
                answers.entry(k.to_owned()).or_default().push(v.to_owned());
            }
        }
        ran_per_child.push(mine);
    }
    assert_eq!(ran.len(), 40, "every key ran: {ran:?}");
    assert!(
        ran.values().all(|n| *n == 1),
        "a key ran in both processes: {ran:?}"
    );
    assert_eq!(answers.len(), 40);
    for (k, vs) in &answers {
        assert_eq!(vs.len(), 2, "{k}: both processes answer");
        assert_eq!(vs[0], vs[1], "{k}: the two processes got different answers");
    }
    eprintln!("executions per process: {ran_per_child:?}");
}

#[tokio::test]
async fn a_reopened_file_replays_the_stored_result() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("sub-created.db").display());
    let runs = AtomicU64::new(0);
    for _ in 0..2 {
        // connect() creates the file and the table.
        let idem = Idem::builder()
            .shared_store(idem_stores::connect(&url).await.unwrap())
            .build()
            .unwrap();
        let v: String = idem
            .call(key("reopen"), Fingerprint::NONE)
            .run(|| async {
                runs.fetch_add(1, Ordering::SeqCst);
                "first".to_string()
            })
            .await
            .unwrap();
        assert_eq!(v, "first");
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the second open replayed from the file"
    );
}

/// Keys are bound, never spliced, and stored as they are (TEXT holds NUL).
#[tokio::test]
async fn keys_are_bound_parameters_stored_verbatim() {
    let s = fresh().await;
    let ids = sql_suite::awkward_ids();
    let keys = sql_suite::complete_each(&s, "sqlite-tests", &ids).await;
    let stored: Vec<String> =
        sqlx::query_scalar(&format!("SELECT key FROM {} ORDER BY key", s.store.table()))
            .fetch_all(s.store.pool())
            .await
            .unwrap();
    let mut expected: Vec<String> = keys.iter().map(|k| k.as_str().to_owned()).collect();
    expected.sort();
    assert_eq!(stored, expected);
}

#[tokio::test]
async fn a_closed_pool_is_a_store_error_and_the_body_does_not_run() {
    let s = fresh().await;
    s.store.pool().close().await;
    let idem = Idem::new(s);
    let runs = AtomicU64::new(0);
    let err = idem
        .call(key("closed"), Fingerprint::NONE)
        .run(|| async { runs.fetch_add(1, Ordering::SeqCst) })
        .await
        .unwrap_err();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the body ran without a store"
    );
    match &err {
        Error::Store { source, .. } => {
            assert!(source.is_temporary(), "{source:?}");
            let inner = std::error::Error::source(source).expect("the sqlx error is kept");
            assert!(inner.downcast_ref::<sqlx::Error>().is_some(), "{inner:?}");
        }
        other => panic!("expected Error::Store, got {other:?}"),
    }
}

/// A replay is a read: it answers while another connection holds the write lock.
#[tokio::test]
async fn a_replay_does_not_wait_for_a_writer() {
    let s = fresh().await;
    let k = key("replay-reads");
    sql_suite::complete(&s, &k, Bytes::from_static(b"v")).await;
    let mut writer = s.store.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query(&format!(
        "UPDATE {} SET token = token WHERE key = 'other'",
        s.store.table()
    ))
    .execute(&mut *writer)
    .await
    .unwrap();
    sql_suite::claims_answer_without_waiting(&s, &k, None, Duration::from_secs(2)).await;
    writer.rollback().await.unwrap();
}

// ---- a file locked by another writer: bounded, temporary -------------------------------

const STEP: Duration = Duration::from_millis(400);
/// Slack on top of a bound for a loaded machine; far below SQLite's old 5 s busy wait.
const MARGIN: Duration = Duration::from_secs(2);

/// Holds SQLite's write lock on `store`'s file from a connection of its own pool, as
/// another process's open write transaction does.
async fn lock_file(store: &SqliteStore) -> sqlx::Transaction<'static, sqlx::Sqlite> {
    let mut writer = store.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query(&format!(
        "UPDATE {} SET token = token WHERE key = 'nothing'",
        store.table()
    ))
    .execute(&mut *writer)
    .await
    .unwrap();
    writer
}

fn temporary(err: &Error) -> &StoreError {
    match err {
        Error::Store { source, .. } if source.is_temporary() => source,
        other => panic!("expected a temporary store error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_file_ends_a_claim_at_the_store_timeout() {
    let s = fresh().await;
    let writer = lock_file(&s.store).await;
    let idem = Idem::builder()
        .store(s.store.clone())
        .store_timeout(STEP)
        .build()
        .unwrap();
    let runs = AtomicU64::new(0);
    let started = std::time::Instant::now();
    let err = idem
        .call(key("locked"), Fingerprint::NONE)
        .run(|| async { runs.fetch_add(1, Ordering::SeqCst) })
        .await
        .unwrap_err();
    let took = started.elapsed();
    eprintln!("sqlite claim on a locked file: answered in {took:?} (step timeout {STEP:?}): {err}");
    assert!(took < STEP + MARGIN, "took {took:?}");
    match temporary(&err) {
        StoreError::Timeout { backend, step, .. } => {
            assert_eq!((*backend, *step), ("sqlite", "claim"))
        }
        other => panic!("the 2 s busy timeout outlasts the step: {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    writer.rollback().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_timeout_below_the_store_timeout_says_the_database_is_locked() {
    let dir = tempfile::tempdir().unwrap();
    let busy = Duration::from_millis(150);
    let store = SqliteStore::builder()
        .busy_timeout(busy)
        .open(dir.path().join("idem.db"))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let writer = lock_file(&store).await;
    // A step timeout far above the busy timeout, so that on a loaded machine it is surely
    // SQLite's busy handler that answers, not the engine's timer.
    let idem = Idem::builder()
        .store(store.clone())
        .store_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let err = idem
        .call(key("busy"), Fingerprint::NONE)
        .run(|| async { 1u8 })
        .await
        .unwrap_err();
    let took = started.elapsed();
    eprintln!("sqlite claim with a {busy:?} busy timeout: answered in {took:?}: {err}");
    assert!(took < busy + MARGIN, "took {took:?}");
    let source = temporary(&err);
    assert!(
        matches!(source, StoreError::Unavailable { .. }),
        "{source:?}"
    );
    let inner = std::error::Error::source(source).expect("the sqlx error is kept");
    assert!(inner.to_string().contains("database is locked"), "{inner}");
    writer.rollback().await.unwrap();
    // The lock is gone: the same store claims again.
    assert_eq!(
        idem.call(key("busy"), Fingerprint::NONE)
            .run(|| async { 2u8 })
            .await
            .unwrap(),
        2
    );
}
