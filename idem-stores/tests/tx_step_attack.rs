//! Hostile review of transactional steps (`completed_step_in`, `record_step_in`).
#![cfg(all(feature = "postgres", feature = "sqlite", feature = "mysql"))]

mod support;

use support::tx::{self, unique, Fixture};

macro_rules! attacks {
    ($backend:ident, $fresh:expr, $db:ty) => {
        mod $backend {
            use std::time::Duration;
            use idem_core::{Error, Fingerprint, Idem, Key, Step};

            fn key(id: &str) -> Key {
                Key::new("tx.attack", id).unwrap()
            }

            async fn rows(f: &super::Fixture<$db>) -> i64 {
                sqlx::query_scalar(&format!("SELECT count(*) FROM {}", f.effects))
                    .fetch_one(f.store.pool()).await.unwrap()
            }

            /// Outside a call: an error, never a panic, never a record.
            #[tokio::test]
            async fn t1_completed_step_in_outside_a_call() {
                let Some(f) = $fresh.await else { return };
                let mut conn = f.store.pool().acquire().await.unwrap();
                let out = f.store.completed_step_in::<String>(&mut *conn, "reserve").await;
                eprintln!("outside: {out:?}");
                assert!(matches!(out, Err(Error::Step { .. })), "{out:?}");
                let out = f.store.record_step_in(&mut *conn, "reserve", &1u32).await;
                assert!(matches!(out, Err(Error::Step { .. })), "{out:?}");
            }

            /// Two transactions of one body record the same step: the one that commits
            /// second must not commit its write (it answers InProgress, and it rolls back).
            #[tokio::test]
            async fn t2_two_concurrent_transactions_record_the_same_step() {
                let Some(f) = $fresh.await else { return };
                let idem = Idem::new(f.store.clone());
                let k = key(&super::unique("t2"));
                let f = &f;
                let out = idem
                    .call(k.clone(), Fingerprint::NONE)
                    .run_fallible(|| async move {
                        let one = |i: u32, before: u64, hold: u64| async move {
                            tokio::time::sleep(Duration::from_millis(before)).await;
                            let mut tx = f.store.pool().begin().await.unwrap();
                            let r = match f.store.completed_step_in::<u32>(&mut *tx, "reserve").await {
                                Ok(Some(v)) => Ok(v),
                                Ok(None) => {
                                    let ins = sqlx::query(&format!(
                                        "INSERT INTO {} (message, body) VALUES ('m', 'by {i}')",
                                        f.effects
                                    ))
                                    .execute(&mut *tx)
                                    .await;
                                    match ins {
                                        Err(e) => Err(Error::Config { message: format!("insert: {e}"), source: None }),
                                        Ok(_) => f.store.record_step_in(&mut *tx, "reserve", &i).await,
                                    }
                                }
                                Err(e) => Err(e),
                            };
                            tokio::time::sleep(Duration::from_millis(hold)).await;
                            match r {
                                Ok(v) => { tx.commit().await.map_err(|e| Error::Config { message: format!("commit: {e}"), source: None })?; Ok(v) }
                                Err(e) => { let _ = tx.rollback().await; Err(e) }
                            }
                        };
                        let (a, b) = tokio::join!(one(1, 0, 300), one(2, 50, 0));
                        eprintln!("tx1 {a:?} / tx2 {b:?}");
                        if stringify!($backend) != "sqlite" {
                            assert!(
                                // MySQL's loser reads back from its own snapshot and
                                // answers a store error instead (documented): either way it
                                // must not commit.
                                matches!(b, Err(Error::InProgress { .. } | Error::Store { .. })),
                                "the loser of record_step_in must fail (InProgress, or a store error on MySQL), got {b:?}"
                            );
                        }
                        Ok::<_, Error>((a.ok(), b.ok()))
                    })
                    .await;
                eprintln!("call: {out:?}");
                assert_eq!(rows(f).await, 1, "the effect was written twice");
            }

            /// KeyReuse: a transactional step's record, then the same key with another
            /// payload reads it: refused, the effect not written.
            #[tokio::test]
            async fn t3_key_reuse_record_step_in() {
                let Some(f) = $fresh.await else { return };
                let idem = Idem::new(f.store.clone());
                let k = key(&super::unique("t3"));
                let f = &f;
                let go = |fp: &'static str| idem.call(k.clone(), Fingerprint::of(&fp)).run_fallible(move || async move {
                    let mut tx = f.store.pool().begin().await.unwrap();
                    let v = match f.store.completed_step_in::<String>(&mut *tx, "reserve").await? {
                        Some(v) => v,
                        None => {
                            sqlx::query(&format!("INSERT INTO {} (message, body) VALUES ('m', '{fp}')", f.effects))
                                .execute(&mut *tx).await.unwrap();
                            f.store.record_step_in(&mut *tx, "reserve", &fp.to_string()).await?
                        }
                    };
                    tx.commit().await.unwrap();
                    Err::<String, Error>(Error::Config { message: format!("after {v}"), source: None })
                });
                let _ = go("a").await;
                let out = go("b").await;
                eprintln!("other payload: {out:?}");
                assert!(matches!(out, Err(Error::KeyReuse { .. })), "{out:?}");
                assert_eq!(rows(f).await, 1);
            }

            /// A transactional step and an at-most-once engine step of the same name (a
            /// refactor): the engine's hold is read by completed_step_in.
            #[tokio::test]
            async fn t4_completed_step_in_over_an_at_most_once_hold() {
                let Some(f) = $fresh.await else { return };
                let idem = Idem::builder().store(f.store.clone()).lease(Duration::from_secs(1)).build().unwrap();
                let k = key(&super::unique("t4"));
                let f = &f;
                let hang = idem.call(k.clone(), Fingerprint::NONE).run_fallible(|| async {
                    Step::new("reserve").at_most_once().run(|| async {
                        std::future::pending::<()>().await;
                        Ok::<_, Error>(String::from("x"))
                    }).await
                });
                assert!(tokio::time::timeout(Duration::from_millis(300), hang).await.is_err());
                tokio::time::sleep(Duration::from_millis(1500)).await;
                let out = idem.call(k.clone(), Fingerprint::NONE).run_fallible(|| async move {
                    let mut tx = f.store.pool().begin().await.unwrap();
                    let v = match f.store.completed_step_in::<String>(&mut *tx, "reserve").await? {
                        Some(v) => v,
                        None => {
                            sqlx::query(&format!("INSERT INTO {} (message, body) VALUES ('m', 'x')", f.effects))
                                .execute(&mut *tx).await.unwrap();
                            f.store.record_step_in(&mut *tx, "reserve", &String::from("y")).await?
                        }
                    };
                    tx.commit().await.unwrap();
                    Ok::<_, Error>(v)
                }).await;
                eprintln!("tx step over an at-most-once hold: {out:?}");
                assert_eq!(rows(f).await, 0, "the write ran over a held at-most-once step");
            }

            /// Eight transactions of one body race to record the same step (MySQL: lock
            /// waits, deadlocks): exactly one effect commits; the others end in an error.
            #[tokio::test]
            async fn t5_eight_transactions_race_one_step() {
                let Some(f) = $fresh.await else { return };
                let idem = Idem::new(f.store.clone());
                let k = key(&super::unique("t5"));
                let f = &f;
                let out = idem
                    .call(k.clone(), Fingerprint::NONE)
                    .run_fallible(|| async move {
                        let barrier = &tokio::sync::Barrier::new(8);
                        let one = |i: u32| async move {
                            let mut tx = f.store.pool().begin().await.unwrap();
                            let r = async {
                                let seen = f.store.completed_step_in::<u32>(&mut *tx, "reserve").await;
                                barrier.wait().await;
                                match seen? {
                                    Some(v) => Ok::<_, Error>(v),
                                    None => {
                                        sqlx::query(&format!(
                                            "INSERT INTO {} (message, body) VALUES ('m', 'by {i}')",
                                            f.effects
                                        ))
                                        .execute(&mut *tx)
                                        .await
                                        .map_err(|e| Error::Config { message: format!("insert: {e}"), source: None })?;
                                        f.store.record_step_in(&mut *tx, "reserve", &i).await
                                    }
                                }
                            }
                            .await;
                            match r {
                                Ok(v) => match tx.commit().await {
                                    Ok(()) => Ok(v),
                                    Err(e) => Err(format!("commit: {e}")),
                                },
                                Err(e) => {
                                    let _ = tx.rollback().await;
                                    Err(format!("{e:?}"))
                                }
                            }
                        };
                        let all = futures_util::future::join_all((0..8).map(one)).await;
                        Ok::<_, Error>(all)
                    })
                    .await
                    .unwrap();
                for o in &out {
                    eprintln!("  {o:?}");
                }
                let oks: Vec<_> = out.iter().filter_map(|o| o.as_ref().ok()).collect();
                assert_eq!(rows(f).await, 1, "effects written: {out:?}");
                // Every Ok must agree with the one recorded value.
                assert!(oks.windows(2).all(|w| w[0] == w[1]), "{oks:?}");
            }

            /// Rollback after record_step_in, then a new transaction in the same attempt: the
            /// step runs again (nothing committed) and its record is the second's.
            #[tokio::test]
            async fn t6_rollback_after_record_then_again() {
                let Some(f) = $fresh.await else { return };
                let idem = Idem::new(f.store.clone());
                let k = key(&super::unique("t6"));
                let f = &f;
                let out = idem.call(k.clone(), Fingerprint::NONE).run_fallible(|| async move {
                    let mut tx = f.store.pool().begin().await.unwrap();
                    assert!(f.store.completed_step_in::<u32>(&mut *tx, "reserve").await?.is_none());
                    f.store.record_step_in(&mut *tx, "reserve", &1u32).await?;
                    tx.rollback().await.unwrap();
                    let mut tx = f.store.pool().begin().await.unwrap();
                    let got = f.store.completed_step_in::<u32>(&mut *tx, "reserve").await?;
                    assert!(got.is_none(), "a rolled-back record is read: {got:?}");
                    let v = f.store.record_step_in(&mut *tx, "reserve", &2u32).await?;
                    tx.commit().await.unwrap();
                    Ok::<_, Error>(v)
                }).await;
                assert_eq!(out.unwrap(), 2);
                let again = idem.call(k.clone(), Fingerprint::NONE).run_fallible(|| async { Ok::<_, Error>(0u32) }).await;
                assert_eq!(again.unwrap(), 2);
            }
        }
    };
}

attacks!(
    postgres,
    super::tx::postgres("idem_txa", "message text NOT NULL"),
    sqlx::Postgres
);
attacks!(sqlite, super::tx::sqlite(), sqlx::Sqlite);
attacks!(mysql, super::tx::mysql("idem_txa"), sqlx::MySql);
