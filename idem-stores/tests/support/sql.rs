//! What holds for every SQL store beyond the conformance suite (which every store passes):
//! migrating, the table that is not there, a damaged row, purging, table names, and who
//! creates the table. Written once, stamped for each dialect by `sql_store_tests!`, as
//! `conformance_tests!` does for the suite.
//!
//! `fresh` is an async expression yielding `Option<(store, guard)>`: a store on a pool of
//! its own with a table no other test uses, NOT migrated (`guard` keeps what the store
//! needs alive, e.g. a temporary directory). `url` yields `Option<(url, guard)>` for the
//! store's own `connect`. With `wire = <wire::Protocol>` it also counts the round trips
//! of a first call and a replay on the wire. The raw SQL here is what all three dialects
//! read alike.

// Each test crate that includes this module uses a part of the helpers below.
#![allow(dead_code)]

#[macro_export]
macro_rules! sql_store_tests {
    ($store:ty, fresh = $fresh:expr, url = $url:expr, wire = $protocol:expr $(,)?) => {
        $crate::sql_store_tests!($store, fresh = $fresh, url = $url);

        mod sql_store_wire {
        #[allow(unused_imports)]
        use super::*;

        /// Round trips counted on the wire (the test crate declares `mod wire` from
        /// `support/wire.rs`): the store's own constructor, then one warm connection.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn round_trips_of_a_first_call_and_a_replay() {
            let Some((fresh, _guard)) = $fresh.await else { return };
            let Some((url, _url_guard)) = $url.await else { return };
            let (proxy, through) = wire::Proxy::to_server_of(&url, $protocol).await;
            let table = format!("{}_w", fresh.table());
            // Through the proxy (it creates the table). Its pool has several connections,
            // each of which prepares a statement the first time it runs it.
            let store = <$store>::builder().table(&table).connect(&through).await.unwrap();
            let pool = store.pool().clone();
            let what = stringify!($store);
            let idem = idem_core::Idem::new(store);
            wire::assert_first_call_and_replay(&proxy, $protocol, &idem, &pool, "a", what).await;

            let one = sqlx::pool::PoolOptions::new()
                .max_connections(1)
                .test_before_acquire(false)
                .connect(&through)
                .await
                .unwrap();
            let idem = idem_core::Idem::new(<$store>::new(one.clone()).with_table(&table).unwrap());
            wire::assert_one_exchange_per_step(&proxy, $protocol, &idem, &one).await;
        }
        }
    };
    ($store:ty, fresh = $fresh:expr, url = $url:expr $(,)?) => {
        mod sql_store {
            use std::sync::atomic::{AtomicU64, Ordering};
            use std::time::Duration;

            use idem_core::{Bytes, Claim, Error, Fingerprint, Idem, Key, Store, StoreError, Token};

            #[allow(unused_imports)]
            use super::*;

            fn key(id: &str) -> Key {
                Key::new("sql-store-tests", id).unwrap()
            }

            async fn acquire(store: &$store, k: &Key, lease: Duration) -> Token {
                match store
                    .claim(k, &Fingerprint::NONE, Token::random(), lease)
                    .await
                    .unwrap()
                {
                    Claim::Acquired { token, .. } => token,
                    other => panic!("{k}: {other:?}"),
                }
            }

            fn assert_not_set_up(err: &Error, table: &str) {
                match err {
                    Error::Store {
                        source: StoreError::NotSetUp { message, .. },
                        ..
                    } => assert!(
                        message.contains("migrate()") && message.contains(table),
                        "{message}"
                    ),
                    other => panic!("expected a NotSetUp store error, got {other:?}"),
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn migrate_twice_and_concurrently() {
                let Some((store, _guard)) = $fresh.await else { return };
                let runs: Vec<_> = (0..5)
                    .map(|_| {
                        let s = store.clone();
                        tokio::spawn(async move { s.migrate().await })
                    })
                    .collect();
                for r in runs {
                    r.await.unwrap().unwrap();
                }
                store.migrate().await.unwrap();
                let versions: Vec<i32> = sqlx::query_scalar(&format!(
                    "SELECT version FROM {}_schema",
                    store.table()
                ))
                .fetch_all(store.pool())
                .await
                .unwrap();
                assert_eq!(versions, vec![1, 2], "one row per version however often migrate ran");
            }

            /// Two engines on two pools share one table: 300 calls over 30 keys, one run
            /// per key, one answer per key.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn two_pools_on_one_table_run_each_key_once() {
                use std::collections::HashMap;
                use std::sync::Arc;
                let Some((a, _guard)) = $fresh.await else { return };
                a.migrate().await.unwrap();
                // A second pool with the first one's options: the same database (or file).
                let options = (*a.pool().connect_options()).clone();
                let b = <$store>::new(sqlx::pool::PoolOptions::new().connect_lazy_with(options))
                    .with_table(&a.table())
                    .unwrap();
                let engines = [a, b].map(|s| {
                    Idem::builder()
                        .store(s)
                        .in_progress(idem_core::InProgress::Wait)
                        .wait_timeout(Duration::from_secs(30))
                        .build()
                        .unwrap()
                });
                const KEYS: usize = 30;
                let runs: Arc<Vec<AtomicU64>> =
                    Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
                let mut tasks = Vec::new();
                for i in 0..KEYS * 10 {
                    let (idem, runs, k) = (engines[i % 2].clone(), runs.clone(), i % KEYS);
                    tasks.push(tokio::spawn(async move {
                        let v: usize = idem
                            .call(key(&format!("k{k}")), Fingerprint::of(&k)).run(|| async move {
                                runs[k].fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                i
                            })
                            .await
                            .unwrap();
                        (k, v)
                    }));
                }
                let mut answers: HashMap<usize, usize> = HashMap::new();
                for t in tasks {
                    let (k, v) = t.await.unwrap();
                    assert_eq!(*answers.entry(k).or_insert(v), v, "key {k} answered two values");
                }
                let runs: Vec<u64> = runs.iter().map(|n| n.load(Ordering::SeqCst)).collect();
                assert_eq!(runs, vec![1; KEYS], "executions per key across both engines");
            }

            /// Leaves the table's schema table saying version `v` alone (version 1's row,
            /// renumbered), as a build that wrote version `v` would leave it.
            async fn newest_version_is(store: &$store, v: i64) {
                for sql in [
                    format!("DELETE FROM {}_schema WHERE version <> 1", store.table()),
                    format!("UPDATE {}_schema SET version = {v}", store.table()),
                ] {
                    sqlx::query(&sql).execute(store.pool()).await.unwrap();
                }
            }

            /// A table the build before fences made (schema version 1, no `fence` column),
            /// with its rows: a store that did not migrate refuses it at its first step
            /// (saying to migrate), `migrate` adds the column, and the old rows read: a
            /// stored result replays, an ended claim is taken over with a fence from the
            /// clock (its own reads as 0).
            #[tokio::test]
            async fn a_table_of_version_1_is_migrated_and_its_rows_still_read() {
                let Some((store, _guard)) = $fresh.await else { return };
                store.migrate().await.unwrap();
                let (ended, done) = (key("v1-ended"), key("v1-done"));
                acquire(&store, &ended, Duration::from_millis(50)).await;
                let t = acquire(&store, &done, Duration::from_secs(30)).await;
                store
                    .complete(&done, t, Bytes::from_static(b"v1 result"), Duration::from_secs(60))
                    .await
                    .unwrap();
                // Back to version 1: the rows are as the old build wrote them.
                sqlx::query(&format!("ALTER TABLE {} DROP COLUMN fence", store.table()))
                    .execute(store.pool())
                    .await
                    .unwrap();
                newest_version_is(&store, 1).await;
                tokio::time::sleep(Duration::from_millis(200)).await;

                let unmigrated = <$store>::new(store.pool().clone())
                    .with_table(&store.table())
                    .unwrap();
                match unmigrated.claim(&ended, &Fingerprint::NONE, Token::random(), Duration::from_secs(30)).await {
                    Err(StoreError::NotSetUp { message, .. }) => assert!(
                        message.contains("schema version 1, older than this build's 2")
                            && message.contains("migrate"),
                        "{message}"
                    ),
                    other => panic!("expected NotSetUp on a version 1 table, got {other:?}"),
                }

                unmigrated.migrate().await.unwrap();
                match unmigrated.claim(&done, &Fingerprint::NONE, Token::random(), Duration::from_secs(30)).await.unwrap() {
                    Claim::Completed { payload, .. } => assert_eq!(&payload[..], b"v1 result"),
                    other => panic!("the old result: {other:?}"),
                }
                let before = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_micros() as u64;
                match unmigrated.claim(&ended, &Fingerprint::NONE, Token::random(), Duration::from_secs(30)).await.unwrap() {
                    Claim::Acquired { recovered, fence, .. } => {
                        assert!(recovered, "the old row's ended claim is taken over");
                        // From the clock (servers and this machine agree within minutes).
                        let minutes = 10 * 60 * 1_000_000;
                        assert!(
                            fence.get() + minutes > before && fence.get() < before + minutes,
                            "{fence:?} is not the clock in microseconds ({before})"
                        );
                    }
                    other => panic!("the old ended claim: {other:?}"),
                }
            }

            #[tokio::test]
            async fn a_table_migrated_by_a_newer_build_is_refused() {
                let Some((store, _guard)) = $fresh.await else { return };
                store.migrate().await.unwrap();
                newest_version_is(&store, 99).await;
                match store.migrate().await {
                    Err(StoreError::NotSetUp { message, .. }) => {
                        assert!(message.contains("newer"), "{message}")
                    }
                    other => panic!("expected NotSetUp, got {other:?}"),
                }
            }

            /// A store that never migrated (on your pool, or `migrate(false)`) checks the
            /// schema version at its first step: a newer one is refused there, naming both.
            #[tokio::test]
            async fn a_newer_schema_is_refused_at_the_first_step_without_migrate() {
                let Some((store, _guard)) = $fresh.await else { return };
                store.migrate().await.unwrap();
                newest_version_is(&store, 99).await;
                let other = <$store>::new(store.pool().clone())
                    .with_table(&store.table())
                    .unwrap();
                let k = key("newer-schema");
                let err = other
                    .claim(&k, &Fingerprint::NONE, Token::random(), Duration::from_secs(30))
                    .await
                    .unwrap_err();
                match &err {
                    StoreError::NotSetUp { message, .. } => assert!(
                        message.contains("schema version 99")
                            && message.contains("newer than this build's 2")
                            && message.contains(&store.table()),
                        "{message}"
                    ),
                    other => panic!("expected NotSetUp, got {other:?}"),
                }
                assert!(
                    matches!(other.get(&k).await, Err(StoreError::NotSetUp { .. })),
                    "a later step went on"
                );
            }

            #[tokio::test]
            async fn a_missing_table_says_to_call_migrate_and_the_body_does_not_run() {
                let Some((store, _guard)) = $fresh.await else { return };
                let idem = Idem::new(store.clone());
                let runs = AtomicU64::new(0);
                let err = idem
                    .call(key("no-table"), Fingerprint::NONE).run(|| async {
                        runs.fetch_add(1, Ordering::SeqCst)
                    })
                    .await
                    .unwrap_err();
                assert_eq!(runs.load(Ordering::SeqCst), 0);
                assert_not_set_up(&err, &store.table());
                assert!(store.get(&key("no-table")).await.is_err());
                store.migrate().await.unwrap();
                idem.call(key("no-table"), Fingerprint::NONE).run(|| async { 1 })
                    .await
                    .unwrap();
            }

            /// A fingerprint column that is not 16 bytes is a damaged row: `Error::Decode`
            /// naming the key, never a value.
            #[tokio::test]
            async fn a_damaged_fingerprint_is_a_decode_error_naming_the_key() {
                let Some((store, _guard)) = $fresh.await else { return };
                store.migrate().await.unwrap();
                let k = key("junk-fingerprint");
                let t = acquire(&store, &k, Duration::from_secs(30)).await;
                store
                    .complete(&k, t, Bytes::from_static(b"abc"), Duration::from_secs(60))
                    .await
                    .unwrap();
                sqlx::query(&format!("UPDATE {} SET fingerprint = payload", store.table()))
                    .execute(store.pool())
                    .await
                    .unwrap();
                let err = Idem::new(store)
                    .call(k.clone(), Fingerprint::NONE).run(|| async { 1u8 })
                    .await
                    .unwrap_err();
                assert!(matches!(&err, Error::Decode { key, .. } if *key == k), "{err:?}");
                assert!(err.to_string().contains(k.as_str()), "{err}");
            }

            #[tokio::test]
            async fn purge_expired_deletes_ended_records_in_batches() {
                let Some((store, _guard)) = $fresh.await else { return };
                store.migrate().await.unwrap();
                for i in 0..25 {
                    let k = key(&format!("short{i}"));
                    let token = acquire(&store, &k, Duration::from_secs(30)).await;
                    store
                        .complete(&k, token, Bytes::new(), Duration::from_millis(50))
                        .await
                        .unwrap();
                }
                for i in 0..5 {
                    acquire(&store, &key(&format!("ended-lease{i}")), Duration::from_millis(50))
                        .await;
                    acquire(&store, &key(&format!("live{i}")), Duration::from_secs(30)).await;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                assert_eq!(store.purge_expired(7).await.unwrap(), 30);
                let left: i64 =
                    sqlx::query_scalar(&format!("SELECT count(*) FROM {}", store.table()))
                        .fetch_one(store.pool())
                        .await
                        .unwrap();
                assert_eq!(left, 5, "only the live claims are left");
                assert_eq!(store.purge_expired(7).await.unwrap(), 0);
            }

            #[tokio::test]
            async fn table_names_are_checked() {
                let Some((store, _guard)) = $fresh.await else { return };
                for bad in ["x; DROP TABLE y", "a\"b", "a`b", "", "a.b.c", "1x", "x y"] {
                    let err = store.clone().with_table(bad).unwrap_err();
                    assert!(matches!(err, Error::Config { .. }), "{bad:?}: {err:?}");
                    assert!(err.to_string().contains("table name"), "{err}");
                }
            }

            /// The rule: a store that opens its own pool creates its table (unless told
            /// `migrate(false)`); a store on your pool touches nothing (above: the missing
            /// table).
            #[tokio::test]
            async fn connect_creates_the_table_unless_told_not_to() {
                let Some((fresh, _guard)) = $fresh.await else { return };
                let Some((url, _url_guard)) = $url.await else { return };
                let table = format!("{}_c", fresh.table());
                let store = <$store>::builder().table(&table).connect(&url).await.unwrap();
                assert_eq!(store.table(), table);
                let v: u8 = Idem::new(store)
                    .call(key("connected"), Fingerprint::NONE).run(|| async { 7 })
                    .await
                    .unwrap();
                assert_eq!(v, 7);

                let table = format!("{}_n", fresh.table());
                let store = <$store>::builder()
                    .table(&table)
                    .migrate(false)
                    .connect(&url)
                    .await
                    .unwrap();
                let err = Idem::new(store)
                    .call(key("not-migrated"), Fingerprint::NONE).run(|| async { 7u8 })
                    .await
                    .unwrap_err();
                assert_not_set_up(&err, &table);
            }
        }
    };
}

use std::time::Duration;

use idem_core::{Bytes, Claim, Fingerprint, Key, Record, Store, StoreError, Token};

/// Ids a SQL store must keep apart and never splice: quotes, wildcards, placeholders, a
/// statement, NUL, case, trailing space, unicode, 1 KiB.
pub fn awkward_ids() -> Vec<String> {
    let mut ids: Vec<String> = [
        "it's",
        "\"quoted\"",
        "`tick`",
        "100%",
        "%",
        "_",
        "?",
        "$1",
        "a%00b",
        "a\0b",
        "\0",
        "a",
        "a ",
        "A",
        "ünïcödé 🦀",
        "Ünïcödé 🦀",
        "'; DROP TABLE idem_records; --",
    ]
    .map(String::from)
    .to_vec();
    ids.push("k".repeat(1024));
    ids
}

/// Claims and completes `scope/id` for each id, with the id as its payload, then reads
/// each back: every key reached a record of its own.
pub async fn complete_each(store: &dyn Store, scope: &str, ids: &[String]) -> Vec<Key> {
    let keys: Vec<Key> = ids.iter().map(|id| Key::new(scope, id).unwrap()).collect();
    for (k, id) in keys.iter().zip(ids) {
        complete(store, k, Bytes::from(id.clone())).await;
    }
    for (k, id) in keys.iter().zip(ids) {
        match store.get(k).await.unwrap() {
            Some(Record::Completed { payload, .. }) => {
                assert_eq!(payload, Bytes::from(id.clone()), "{id:?}")
            }
            other => panic!("{id:?}: {other:?}"),
        }
    }
    keys
}

/// Seconds since the Unix epoch: test tables and schemas are named with it, so that a run
/// can drop what runs older than an hour left.
pub fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A table or schema name no other test, process or run uses: `idem_t_<secs>_<pid>_<n>`.
pub fn fresh_name() -> String {
    static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("idem_t_{}_{}_{n}", unix_secs(), std::process::id())
}

/// Whether `name`, made by [`fresh_name`], is from a run older than an hour: what a test
/// drops on its way, so the test server does not fill up.
pub fn is_stale(name: &str) -> bool {
    let born: u64 = name
        .split('_')
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    born + 3600 < unix_secs()
}

/// A pool of at most `max` connections on the test server, without a ping before each
/// statement.
pub async fn pool<DB: sqlx::Database>(url: &str, max: u32) -> sqlx::Pool<DB> {
    sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(max)
        .test_before_acquire(false)
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect to the test server: {e}"))
}

/// A claim of `k` as another caller takes it: no fingerprint, a fresh token, 30 s.
async fn claim_30s(store: &dyn Store, k: &Key) -> Result<Claim, StoreError> {
    let lease = Duration::from_secs(30);
    store
        .claim(k, &Fingerprint::NONE, Token::random(), lease)
        .await
}

/// Claims `k` and completes it with `payload`.
pub async fn complete(store: &dyn Store, k: &Key, payload: Bytes) {
    let token = match claim_30s(store, k).await.unwrap() {
        Claim::Acquired { token, .. } => token,
        other => panic!("{k} not acquired: {other:?}"),
    };
    store
        .complete(k, token, payload, Duration::from_secs(60))
        .await
        .unwrap();
}

/// A key with a stored result and a key with a live claim (30 s), in `scope`.
pub async fn completed_and_held(store: &dyn Store, scope: &str) -> (Key, Key) {
    let completed = Key::new(scope, "replay-reads").unwrap();
    complete(store, &completed, Bytes::from_static(b"v")).await;
    let held = Key::new(scope, "held-elsewhere").unwrap();
    claim_30s(store, &held).await.unwrap();
    (completed, held)
}

/// A claim of `completed` (a stored result) and one of `held` (a live claim), each within
/// `bound` while the test holds a lock on their rows: a claim that finds a live record
/// reads and takes no lock.
pub async fn claims_answer_without_waiting(
    store: &dyn Store,
    completed: &Key,
    held: Option<&Key>,
    bound: Duration,
) {
    let claim = |k: Key| async move {
        tokio::time::timeout(bound, claim_30s(store, &k))
            .await
            .unwrap_or_else(|_| panic!("the claim of {k} waited for a lock"))
            .unwrap()
    };
    let replay = claim(completed.clone()).await;
    assert!(matches!(replay, Claim::Completed { .. }), "{replay:?}");
    if let Some(held) = held {
        let busy = claim(held.clone()).await;
        assert!(matches!(busy, Claim::InProgress { .. }), "{busy:?}");
    }
}
