//! MySqlStore against a MySQL or MariaDB server: the conformance suite, the SQL stores'
//! shared tests, keys as bytes, and round trips counted on the wire. Each test uses a table
//! of its own. Runs when `IDEM_TEST_MYSQL_URL` is set
//! (`mysql://root@127.0.0.1:3306/test`), and fails instead of skipping when
//! `IDEM_REQUIRE_BACKENDS=1`.
#![cfg(feature = "mysql")]

use std::time::Duration;

use idem_core::{Bytes, Key, Record, Store};
use idem_stores::MySqlStore;
use sqlx::mysql::MySqlPool;

/// The server, from `IDEM_TEST_MYSQL_URL` (skip or fail as `backend_url` says).
fn url() -> Option<String> {
    idem_core::testing::backend_url("IDEM_TEST_MYSQL_URL")
}

/// A table name no other test or run uses; drops the tables (and claim procedures) of test
/// runs older than an hour.
async fn fresh_table(pool: &MySqlPool) -> String {
    let old: Vec<(String, String)> = sqlx::query_as(
        "SELECT CAST(table_name AS CHAR), 'TABLE' FROM information_schema.tables
           WHERE table_schema = DATABASE() AND table_name LIKE 'idem\\_t\\_%'
         UNION ALL
         SELECT CAST(routine_name AS CHAR), 'PROCEDURE' FROM information_schema.routines
           WHERE routine_schema = DATABASE() AND routine_name LIKE 'idem\\_t\\_%'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    for (name, kind) in old.iter().filter(|(name, _)| sql_suite::is_stale(name)) {
        let _ = sqlx::raw_sql(&format!("DROP {kind} IF EXISTS `{name}`"))
            .execute(pool)
            .await;
    }
    sql_suite::fresh_name()
}

fn key(id: &str) -> Key {
    Key::new("mysql-tests", id).unwrap()
}

/// A store on a pool of its own, on a table of its own, not migrated.
async fn unmigrated_on(url: &str, max: u32) -> MySqlStore {
    let pool = sql_suite::pool::<sqlx::MySql>(url, max).await;
    let table = fresh_table(&pool).await;
    MySqlStore::new(pool).with_table(&table).unwrap()
}

async fn unmigrated() -> Option<(MySqlStore, ())> {
    Some((unmigrated_on(&url()?, 6).await, ()))
}

/// A migrated store on its own pool, on a table of its own.
async fn fresh() -> Option<MySqlStore> {
    let store = unmigrated_on(&url()?, 6).await;
    store.migrate().await.unwrap();
    Some(store)
}

idem_core::conformance_tests!(mysql, super::fresh());

#[macro_use]
#[path = "support/sql.rs"]
mod sql_suite;

sql_store_tests!(
    MySqlStore,
    fresh = super::unmigrated(),
    url = async { super::url().map(|u| (u, ())) },
    wire = wire::Protocol::MySql,
);

/// Keys are bound, never spliced, and stored as their bytes: NUL, case and trailing
/// spaces all reach rows of their own, and the column holds exactly `scope/id`.
#[tokio::test]
async fn keys_are_bound_parameters_stored_as_their_bytes() {
    let Some(store) = fresh().await else { return };
    let ids = sql_suite::awkward_ids();
    let keys = sql_suite::complete_each(&store, "mysql-tests", &ids).await;
    let mut stored: Vec<Vec<u8>> =
        sqlx::query_scalar(&format!("SELECT `key` FROM {}", store.table()))
            .fetch_all(store.pool())
            .await
            .unwrap();
    stored.sort();
    let mut expected: Vec<Vec<u8>> = keys
        .iter()
        .map(|k| k.as_str().as_bytes().to_vec())
        .collect();
    expected.sort();
    assert_eq!(stored, expected);
    for k in &keys {
        assert!(store.delete(k).await.unwrap(), "{k}");
    }
}

#[path = "support/wire.rs"]
mod wire;

/// Payloads of 1 MiB and 8 MiB (under the default `max_allowed_packet` of 16 MiB) come
/// back byte for byte.
#[tokio::test]
async fn payloads_up_to_the_servers_packet_limit_round_trip() {
    let Some(store) = fresh().await else { return };
    for size in [1usize << 20, 8 << 20] {
        let k = key(&format!("big{size}"));
        let payload: Bytes = (0..size)
            .map(|n| (n % 251) as u8)
            .collect::<Vec<u8>>()
            .into();
        sql_suite::complete(&store, &k, payload.clone()).await;
        match store.get(&k).await.unwrap() {
            Some(Record::Completed { payload: got, .. }) => {
                assert!(got == payload, "{size} bytes changed")
            }
            other => panic!("{other:?}"),
        }
    }
}

/// The claim reads without a lock: a replay, and the answer for a live claim, come while
/// another transaction holds both rows `FOR UPDATE`, and change neither row.
#[tokio::test]
async fn a_replay_takes_no_row_lock() {
    let Some(store) = fresh().await else { return };
    let (k, held) = sql_suite::completed_and_held(&store, "mysql-tests").await;
    let rows = format!(
        "SELECT `key`, token, ends_at FROM {} ORDER BY `key`",
        store.table()
    );
    let before: Vec<(Vec<u8>, i64, i64)> =
        sqlx::query_as(&rows).fetch_all(store.pool()).await.unwrap();

    let mut locker = store.pool().begin().await.unwrap();
    sqlx::query(&format!("SELECT 1 FROM {} FOR UPDATE", store.table()))
        .execute(&mut *locker)
        .await
        .unwrap();
    sql_suite::claims_answer_without_waiting(&store, &k, Some(&held), Duration::from_secs(3)).await;
    locker.rollback().await.unwrap();
    let after: Vec<(Vec<u8>, i64, i64)> =
        sqlx::query_as(&rows).fetch_all(store.pool()).await.unwrap();
    assert_eq!(before, after, "a replay or an in-progress answer wrote");
}

/// Claims that InnoDB picks as deadlock victims are claimed again, not answered as store
/// errors. Two claims wait on a third transaction's uncommitted insert of their key; when
/// it rolls back, both hold a shared lock on the row and each needs the other's to insert:
/// InnoDB rolls one back with error 1213. Both claims answer, and one of them acquires.
#[tokio::test]
async fn a_claim_chosen_as_a_deadlock_victim_is_claimed_again() {
    let Some(store) = fresh().await else { return };
    let store = std::sync::Arc::new(store);
    for i in 0..5 {
        let k = key(&format!("deadlock-{i}"));
        let mut inserter = store.pool().begin().await.unwrap();
        sqlx::query(&format!(
            "INSERT INTO {} (`key`, fingerprint, token, completed, payload, ends_at, fence)
               VALUES (?, ?, 1, FALSE, NULL, 0, 0)",
            store.table()
        ))
        .bind(k.as_str().as_bytes())
        .bind(&idem_core::Fingerprint::NONE.as_bytes()[..])
        .execute(&mut *inserter)
        .await
        .unwrap();
        let claims: Vec<_> = (0..2)
            .map(|_| {
                let (store, k) = (store.clone(), k.clone());
                tokio::spawn(async move {
                    let lease = Duration::from_secs(30);
                    let fp = idem_core::Fingerprint::NONE;
                    store
                        .claim(&k, &fp, idem_core::Token::random(), lease)
                        .await
                })
            })
            .collect();
        // Both claims reach the insert and wait on the uncommitted row's lock.
        tokio::time::sleep(Duration::from_millis(300)).await;
        inserter.rollback().await.unwrap();
        let mut acquired = 0;
        for claim in claims {
            match claim.await.unwrap() {
                Ok(idem_core::Claim::Acquired { .. }) => acquired += 1,
                Ok(idem_core::Claim::InProgress { .. }) => {}
                other => panic!("key {k}: a claim answered {other:?}"),
            }
        }
        assert_eq!(acquired, 1, "key {k}: {acquired} claims acquired it");
    }
}

/// `GET_LOCK` answers 0 when its timeout runs out: migrate then fails, saying another
/// connection holds the lock, and creates nothing (it never goes on unlocked).
#[tokio::test]
async fn migrate_fails_when_another_connection_holds_its_lock() {
    let Some(url) = url() else { return };
    let store = unmigrated_on(&url, 2)
        .await
        .with_migrate_lock_timeout(Duration::from_secs(1));
    let holder = sql_suite::pool::<sqlx::MySql>(&url, 1).await;
    let mut conn = holder.acquire().await.unwrap();
    let lock = format!("idem.migrate:{}", store.table());
    let taken: i64 = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
        .bind(&lock)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(taken, 1);
    let started = std::time::Instant::now();
    let err = store.migrate().await.unwrap_err();
    let shown = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(
        shown.contains("migration lock") && shown.contains(&store.table()),
        "{shown}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "waited {:?}",
        started.elapsed()
    );
    let tables: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?",
    )
    .bind(store.table())
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert_eq!(tables, 0, "migrated without its lock");
    // Released, the lock is taken and the table created.
    let _: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
        .bind(&lock)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    store.migrate().await.unwrap();
}
