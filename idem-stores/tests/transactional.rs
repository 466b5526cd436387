//! Transactional dedup (`SqlStore::mark_processed_in`, `save_result_in`) on Postgres
//! (`IDEM_TEST_POSTGRES_URL`) and MySQL/MariaDB (`IDEM_TEST_MYSQL_URL`), each skipped with a
//! message when unset and a failure when `IDEM_REQUIRE_BACKENDS=1`, and SQLite (a temporary
//! file, always). Each test has a table of its own (Postgres: a schema of its own, dropped
//! at the end; MySQL: tables of their own, dropped at the end). The same tests are stamped
//! for every dialect by `transactional_tests!`.
#![cfg(all(feature = "postgres", feature = "sqlite", feature = "mysql"))]

mod support;

use support::tx::{self, Fixture};
use support::ClaimFresh;

macro_rules! transactional_tests {
    ($backend:ident, $fresh:expr, $db:ty) => {
        mod $backend {
            use std::sync::Arc;
            use std::time::Duration;

            use idem_core::{Claim, Error, Fingerprint, Idem, Key, Origin, Store};

            use super::ClaimFresh;

            const DAY: Duration = Duration::from_secs(24 * 3600);

            fn key(id: &str) -> Key {
                Key::new("consumer.tx", id).unwrap()
            }

            /// Marks `k` processed (no fingerprint, kept a day) in `tx`.
            async fn mark(
                f: &super::Fixture<$db>,
                tx: &mut sqlx::Transaction<'_, $db>,
                k: &Key,
            ) -> Origin {
                f.store
                    .mark_processed_in(&mut **tx, k, Fingerprint::NONE, DAY)
                    .await
                    .unwrap()
            }

            #[tokio::test]
            async fn consumer_tx_commit_is_first_then_duplicate_on_both_paths() {
                let Some(f) = $fresh.await else { return };
                let k = key("orders:0:1");
                let mut tx = f.store.pool().begin().await.unwrap();
                let first = mark(&f, &mut tx, &k).await;
                assert_eq!(first, Origin::Ran);
                // Within the same transaction the record is already there.
                let again = mark(&f, &mut tx, &k).await;
                assert_eq!(again, Origin::Store);
                tx.commit().await.unwrap();

                let mut tx = f.store.pool().begin().await.unwrap();
                let later = mark(&f, &mut tx, &k).await;
                assert_eq!(later, Origin::Store);
                tx.rollback().await.unwrap();

                // The lease-based path reads the same record.
                let idem = Idem::new(f.store.clone());
                assert!(idem.is_processed(&k).await.unwrap());
                assert_eq!(
                    idem.mark_processed(k.clone(), Fingerprint::NONE)
                        .await
                        .unwrap(),
                    Origin::Store
                );
                let ran = idem
                    .consume(k, Fingerprint::NONE)
                    .run(|| async {})
                    .await
                    .unwrap();
                assert_eq!(ran.origin(), Origin::Store);
            }

            /// A reused id with another payload is `KeyReuse` in the transaction, and across
            /// paths: the lease-based one refuses what the transaction marked, and back.
            #[tokio::test]
            async fn consumer_tx_refuses_a_reused_id_with_another_payload() {
                let Some(f) = $fresh.await else { return };
                let (a, b) = (Fingerprint::of("payload a"), Fingerprint::of("payload b"));
                let k = key("orders:0:reuse");
                let mut tx = f.store.pool().begin().await.unwrap();
                assert_eq!(
                    f.store
                        .mark_processed_in(&mut *tx, &k, a, DAY)
                        .await
                        .unwrap(),
                    Origin::Ran
                );
                tx.commit().await.unwrap();
                let mut tx = f.store.pool().begin().await.unwrap();
                assert_eq!(
                    f.store
                        .mark_processed_in(&mut *tx, &k, a, DAY)
                        .await
                        .unwrap(),
                    Origin::Store
                );
                let reused = f.store.mark_processed_in(&mut *tx, &k, b, DAY).await;
                assert!(matches!(reused, Err(Error::KeyReuse { .. })), "{reused:?}");
                tx.rollback().await.unwrap();
                let idem = Idem::new(f.store.clone());
                assert!(matches!(
                    idem.mark_processed(k.clone(), b).await,
                    Err(Error::KeyReuse { .. })
                ));
                let other = key("orders:0:reuse-2");
                idem.mark_processed(other.clone(), a).await.unwrap();
                let mut tx = f.store.pool().begin().await.unwrap();
                let reused = f.store.mark_processed_in(&mut *tx, &other, b, DAY).await;
                assert!(matches!(reused, Err(Error::KeyReuse { .. })), "{reused:?}");
                tx.rollback().await.unwrap();
            }

            #[tokio::test]
            async fn consumer_tx_rollback_leaves_no_record() {
                let Some(f) = $fresh.await else { return };
                let k = key("orders:0:2");
                let mut tx = f.store.pool().begin().await.unwrap();
                let first = mark(&f, &mut tx, &k).await;
                assert_eq!(first, Origin::Ran);
                tx.rollback().await.unwrap();

                let idem = Idem::new(f.store.clone());
                assert!(!idem.is_processed(&k).await.unwrap());
                // The redelivery does the work.
                let mut tx = f.store.pool().begin().await.unwrap();
                let redelivered = mark(&f, &mut tx, &k).await;
                assert_eq!(redelivered, Origin::Ran);
                tx.commit().await.unwrap();
                assert!(idem.is_processed(&k).await.unwrap());
            }

            #[tokio::test]
            async fn consumer_tx_sees_lease_path_records() {
                let Some(f) = $fresh.await else { return };
                let idem = Idem::new(f.store.clone());
                let marked = key("msg-marked");
                assert_eq!(
                    idem.mark_processed(marked.clone(), Fingerprint::NONE)
                        .await
                        .unwrap(),
                    Origin::Ran
                );
                let handled = key("msg-handled");
                let ran = idem
                    .consume(handled.clone(), Fingerprint::NONE)
                    .run(|| async {})
                    .await
                    .unwrap();
                assert_eq!(ran.origin(), Origin::Ran);
                // A claim still held by a lease-based call is neither: in progress. (Taken
                // before the transaction begins: SQLite has one writer at a time.)
                let held = key("msg-held");
                let claim = f
                    .store
                    .claim_fresh(&held, Duration::from_secs(30),
                    )
                    .await
                    .unwrap();
                assert!(matches!(claim, Claim::Acquired { .. }), "{claim:?}");
                let mut tx = f.store.pool().begin().await.unwrap();
                for k in [&marked, &handled] {
                    let seen = f
                        .store
                        .mark_processed_in(&mut *tx, k, Fingerprint::NONE, DAY)
                        .await
                        .unwrap();
                    assert_eq!(seen, Origin::Store, "{k}");
                }
                let err = f
                    .store
                    .mark_processed_in(&mut *tx, &held, Fingerprint::NONE, DAY)
                    .await
                    .unwrap_err();
                match err {
                    // The 30 s lease's remainder, bounded to a short hint.
                    Error::InProgress { retry_after, .. } => assert!(
                        retry_after > Duration::ZERO
                            && retry_after <= idem_core::DEFAULT_RETRY_AFTER,
                        "{retry_after:?}"
                    ),
                    other => panic!("expected InProgress, got {other:?}"),
                }
                tx.rollback().await.unwrap();
            }

            #[tokio::test]
            async fn consumer_tx_saved_result_replays_through_the_engine() {
                let Some(f) = $fresh.await else { return };
                let k = key("invoice-7");
                let fp = Fingerprint::of(&("invoice", 7u32));
                let receipt = "receipt-7".to_string();
                let mut tx = f.store.pool().begin().await.unwrap();
                let saved = f
                    .store
                    .save_result_in(&mut *tx, &k, fp, &receipt, DAY)
                    .await
                    .unwrap();
                assert_eq!(
                    (saved.origin(), saved.value().as_str()),
                    (Origin::Ran, "receipt-7")
                );
                tx.commit().await.unwrap();

                let idem = Idem::new(f.store.clone());
                let replayed: String = idem
                    .call(k.clone(), fp)
                    .run(|| async { panic!("the engine must replay the saved result") })
                    .await
                    .unwrap();
                assert_eq!(replayed, "receipt-7");
                let mut tx = f.store.pool().begin().await.unwrap();
                let other = "receipt-8".to_string();
                let again = f
                    .store
                    .save_result_in(&mut *tx, &k, fp, &other, DAY)
                    .await
                    .unwrap();
                assert_eq!(
                    (again.origin(), again.value().as_str()),
                    (Origin::Store, "receipt-7")
                );
                let reuse = f
                    .store
                    .save_result_in(&mut *tx, &k, Fingerprint::of(&8u8), &other, DAY)
                    .await
                    .unwrap_err();
                assert!(matches!(reuse, Error::KeyReuse { .. }), "{reuse:?}");
                tx.rollback().await.unwrap();
            }

            /// Eight transactions on one key at once, each writing its effect only when it
            /// is the first: one first, one effect row.
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn consumer_tx_concurrent_transactions_write_one_effect() {
                let Some(f) = $fresh.await else { return };
                let f = Arc::new(f);
                let k = key("orders:1:99");
                let barrier = Arc::new(tokio::sync::Barrier::new(8));
                let mut tasks = Vec::new();
                for i in 0..8 {
                    let (f, k, barrier) = (f.clone(), k.clone(), barrier.clone());
                    tasks.push(tokio::spawn(async move {
                        let mut conn = f.store.pool().acquire().await.unwrap();
                        barrier.wait().await;
                        let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
                        let d = mark(&f, &mut tx, &k).await;
                        if d == Origin::Ran {
                            sqlx::query(&format!(
                                "INSERT INTO {} (message, body) VALUES ('orders:1:99', 'by {i}')",
                                f.effects
                            ))
                            .execute(&mut *tx)
                            .await
                            .unwrap();
                        }
                        tx.commit().await.unwrap();
                        d
                    }));
                }
                let mut firsts = 0;
                for t in tasks {
                    if t.await.unwrap() == Origin::Ran {
                        firsts += 1;
                    }
                }
                assert_eq!(firsts, 1);
                let rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {}", f.effects))
                    .fetch_one(f.store.pool())
                    .await
                    .unwrap();
                assert_eq!(rows, 1);
            }

            /// How a checkout attempt's body ends, after its write to the shop's own table.
            #[derive(Clone, Copy, PartialEq)]
            enum End {
                /// Dropped before the commit (a crash between the write and its commit).
                RollBack,
                /// Committed, then failed (the attempt's claim is given back).
                CommitThenFail,
                Commit,
            }

            /// One attempt of a call whose body reserves stock in the shop's own table as
            /// a transactional step (`completed_step_in`, the write, `record_step_in`, in
            /// one transaction), then ends as `end` says.
            async fn attempt(
                f: &super::Fixture<$db>,
                idem: &Idem,
                k: &Key,
                end: End,
            ) -> Result<String, Error> {
                idem.call(k.clone(), Fingerprint::of(&"order"))
                    .run_fallible(|| async move {
                        let mut tx = f.store.pool().begin().await.unwrap();
                        let reserved: String =
                            match f.store.completed_step_in(&mut *tx, "reserve").await? {
                                Some(r) => r,
                                None => {
                                    sqlx::query(&format!(
                                        "INSERT INTO {} (message, body) VALUES ('{}', 'reserved')",
                                        f.effects,
                                        k.id()
                                    ))
                                    .execute(&mut *tx)
                                    .await
                                    .unwrap();
                                    f.store
                                        .record_step_in(&mut *tx, "reserve", &String::from("r-1"))
                                        .await?
                                }
                            };
                        match end {
                            End::RollBack => {
                                drop(tx);
                                Err(Error::Config {
                                    message: "crashed before the commit".into(),
                                    source: None,
                                })
                            }
                            End::CommitThenFail => {
                                tx.commit().await.unwrap();
                                Err(Error::Config {
                                    message: "failed after the commit".into(),
                                    source: None,
                                })
                            }
                            End::Commit => {
                                tx.commit().await.unwrap();
                                Ok(reserved)
                            }
                        }
                    })
                    .await
            }

            async fn rows(f: &super::Fixture<$db>, k: &Key) -> i64 {
                sqlx::query_scalar(&format!(
                    "SELECT count(*) FROM {} WHERE message LIKE '{}%'",
                    f.effects,
                    k.id()
                ))
                .fetch_one(f.store.pool())
                .await
                .unwrap()
            }

            /// A transactional step's write and its record commit as one: a crash before the
            /// commit leaves neither (the retry writes once), a failure after it replays the
            /// recorded value (the retry writes nothing).
            #[tokio::test]
            async fn transactional_step_writes_once_across_a_crash_before_and_a_failure_after_its_commit() {
                let Some(f) = $fresh.await else { return };
                let idem = Idem::new(f.store.clone());
                let k = key("checkout-tx-step");
                assert!(attempt(&f, &idem, &k, End::RollBack).await.is_err());
                assert_eq!(rows(&f, &k).await, 0, "the rolled-back write");
                let record = k.step("reserve").unwrap();
                assert!(
                    f.store.get(&record).await.unwrap().is_none(),
                    "a rolled-back transaction left the step's record"
                );
                assert!(attempt(&f, &idem, &k, End::CommitThenFail).await.is_err());
                assert_eq!(rows(&f, &k).await, 1);
                // Another payload of the key is refused at the step's record.
                let other = idem
                    .call(k.clone(), Fingerprint::of(&"another order"))
                    .run_fallible(|| async {
                        let mut conn = f.store.pool().acquire().await.unwrap();
                        f.store
                            .completed_step_in::<String>(&mut *conn, "reserve")
                            .await
                    })
                    .await;
                assert!(matches!(other, Err(Error::KeyReuse { .. })), "{other:?}");
                assert_eq!(attempt(&f, &idem, &k, End::Commit).await.unwrap(), "r-1");
                assert_eq!(rows(&f, &k).await, 1, "the retry wrote again");

            }

            /// Without the transaction (the write committed, then the step's record stored
            /// separately by `idem::step`), a failure between the two runs the write again:
            /// what a transactional step closes.
            #[tokio::test]
            async fn transactional_step_control_a_separate_record_lets_the_write_run_twice() {
                let Some(f) = $fresh.await else { return };
                let idem = Idem::new(f.store.clone());
                let k = key("checkout-separate");
                for n in 0..2 {
                    let _ = idem
                        .call(k.clone(), Fingerprint::NONE)
                        .run_fallible(|| async {
                            idem_core::step("reserve", || async {
                                sqlx::query(&format!(
                                    "INSERT INTO {} (message, body) VALUES ('{}.{n}', 'reserved')",
                                    f.effects,
                                    k.id()
                                ))
                                .execute(f.store.pool())
                                .await
                                .unwrap();
                                // The process dies here: the write committed, the record not.
                                Err::<(), _>(Error::Config {
                                    message: "crashed before the step's record".into(),
                                    source: None,
                                })
                            })
                            .await
                        })
                        .await;
                }
                assert_eq!(rows(&f, &k).await, 2);
            }
        }
    };
}

transactional_tests!(
    postgres,
    super::tx::postgres("idem_tx", "message text PRIMARY KEY"),
    sqlx::Postgres
);
transactional_tests!(sqlite, super::tx::sqlite(), sqlx::Sqlite);
transactional_tests!(mysql, super::tx::mysql("idem_tx"), sqlx::MySql);
