//! What holds for every SQL store beyond the conformance suite (which every store passes):
//! migrating, the table that is not there, a damaged row, purging, table names, and who
//! creates the table. Written once, stamped for each dialect by `sql_store_tests!`, as
//! `conformance_tests!` does for the suite.
//!
//! `fresh` is an async expression yielding `Option<(store, guard)>`: a store on a pool of
//! its own with a table no other test uses, NOT migrated (`guard` keeps what the store
//! needs alive, e.g. a temporary directory). `url` yields `Option<(url, guard)>` for the
//! store's own `connect`. The raw SQL here is what all three dialects read alike.

#[macro_export]
macro_rules! sql_store_tests {
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
                assert_eq!(versions, vec![1], "one version row however often migrate ran");
            }

            #[tokio::test]
            async fn a_table_migrated_by_a_newer_build_is_refused() {
                let Some((store, _guard)) = $fresh.await else { return };
                store.migrate().await.unwrap();
                sqlx::query(&format!("UPDATE {}_schema SET version = 99", store.table()))
                    .execute(store.pool())
                    .await
                    .unwrap();
                match store.migrate().await {
                    Err(StoreError::NotSetUp { message, .. }) => {
                        assert!(message.contains("newer"), "{message}")
                    }
                    other => panic!("expected NotSetUp, got {other:?}"),
                }
            }

            #[tokio::test]
            async fn a_missing_table_says_to_call_migrate_and_the_body_does_not_run() {
                let Some((store, _guard)) = $fresh.await else { return };
                let idem = Idem::new(store.clone());
                let runs = AtomicU64::new(0);
                let err = idem
                    .run(key("no-table"), Fingerprint::NONE, || async {
                        runs.fetch_add(1, Ordering::SeqCst)
                    })
                    .await
                    .unwrap_err();
                assert_eq!(runs.load(Ordering::SeqCst), 0);
                assert_not_set_up(&err, &store.table());
                assert!(store.get(&key("no-table")).await.is_err());
                store.migrate().await.unwrap();
                idem.run(key("no-table"), Fingerprint::NONE, || async { 1 })
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
                    .run(k.clone(), Fingerprint::NONE, || async { 1u8 })
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
                    assert!(matches!(err, Error::Connect { .. }), "{bad:?}: {err:?}");
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
                    .run(key("connected"), Fingerprint::NONE, || async { 7 })
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
                    .run(key("not-migrated"), Fingerprint::NONE, || async { 7u8 })
                    .await
                    .unwrap_err();
                assert_not_set_up(&err, &table);
            }
        }
    };
}
