//! Postgres store against a real server (`IDEM_TEST_POSTGRES_URL`; skipped with a message
//! when unset, a failure when `IDEM_REQUIRE_BACKENDS=1`). Every test works in a schema of
//! its own, so tests run in parallel; schemas older than an hour are dropped on the way.
//!
//! Round trips are counted on the wire: a small proxy between the pool and the server reads
//! the client's protocol messages and tells statements, prepares and pings apart.
#![cfg(feature = "postgres")]

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::testing::backend_url;
use idem_core::{Error, Fingerprint, Idem, Key, Store};
use idem_stores::{PostgresStore, SynchronousCommit};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

fn url() -> Option<String> {
    backend_url("IDEM_TEST_POSTGRES_URL")
}

/// A new schema for one test; drops the schemas of test runs older than an hour.
async fn fresh_schema(pool: &PgPool) -> String {
    let old: Vec<String> = sqlx::query_scalar(
        "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'idem\\_t\\_%'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    for schema in old.iter().filter(|s| sql_suite::is_stale(s)) {
        let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
            .execute(pool)
            .await;
    }
    let schema = sql_suite::fresh_name();
    sqlx::query(&format!("CREATE SCHEMA \"{schema}\""))
        .execute(pool)
        .await
        .unwrap();
    schema
}

/// A migrated store on its own pool, in a fresh schema.
async fn fresh_on(url: &str, max: u32) -> PostgresStore {
    let pool = sql_suite::pool::<sqlx::Postgres>(url, max).await;
    let schema = fresh_schema(&pool).await;
    let store = PostgresStore::new(pool)
        .with_table(&format!("{schema}.idem_records"))
        .unwrap();
    store.migrate().await.unwrap();
    store
}

async fn fresh() -> Option<PostgresStore> {
    Some(fresh_on(&url()?, 6).await)
}

idem_core::conformance_tests!(postgres, super::fresh());

/// A store whose writes set a commit level (each writing statement carries it): every
/// behaviour again. On a server without synchronous standbys no level waits for one.
async fn fresh_at_remote_apply() -> Option<PostgresStore> {
    Some(
        fresh()
            .await?
            .with_synchronous_commit(SynchronousCommit::RemoteApply),
    )
}

idem_core::conformance_tests!(postgres_remote_apply, super::fresh_at_remote_apply());

#[macro_use]
#[path = "support/sql.rs"]
mod sql_suite;

/// A store on a pool of its own, in a fresh schema, not migrated.
async fn unmigrated() -> Option<(PostgresStore, ())> {
    let pool = sql_suite::pool::<sqlx::Postgres>(&url()?, 6).await;
    let schema = fresh_schema(&pool).await;
    let store = PostgresStore::new(pool)
        .with_table(&format!("{schema}.idem_records"))
        .unwrap();
    Some((store, ()))
}

sql_store_tests!(
    PostgresStore,
    fresh = super::unmigrated(),
    url = async { super::url().map(|u| (u, ())) },
    wire = wire::Protocol::Postgres,
);

fn key(id: &str) -> Key {
    Key::new("postgres-tests", id).unwrap()
}

// ---- round trips, counted on the wire ------------------------------------------------
// (first call 3: read, claim, complete; replay 1: `round_trips_of_a_first_call_and_a_replay`,
// stamped above)

#[path = "support/wire.rs"]
mod wire;

/// What a pool with sqlx's defaults costs: a ping before every statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_tests_before_acquire_pings_before_every_statement() {
    use wire::Exchange::{Ping, Statement};
    let Some(store) = fresh().await else { return };
    let url = url().unwrap();
    let (proxy, through) = wire::Proxy::to_server_of(&url, wire::Protocol::Postgres).await;
    let table = store.table();
    let default_pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&through)
        .await
        .unwrap();
    let idem = Idem::new(
        PostgresStore::new(default_pool.clone())
            .with_table(&table)
            .unwrap(),
    );
    wire::exchanges(&proxy, &idem, &default_pool, "b").await;
    let replay = wire::exchanges(&proxy, &idem, &default_pool, "b").await;
    eprintln!("replay on a pool with sqlx's default test_before_acquire: {replay:?}");
    assert_eq!(replay, [Ping, Statement, Ping]);
}

// ---- setup and failures ------------------------------------------------------------------

/// Keys are bound, never spliced, and kept as they are but for `%` and NUL, which are
/// percent-encoded (Postgres text cannot hold NUL): every key still reaches its own row.
#[tokio::test]
async fn keys_are_bound_parameters_stored_with_percent_and_nul_escaped() {
    let Some(store) = fresh().await else { return };
    let ids = sql_suite::awkward_ids();
    let keys = sql_suite::complete_each(&store, "postgres-tests", &ids).await;
    let stored: Vec<String> =
        sqlx::query_scalar(&format!("SELECT key FROM {} ORDER BY key", store.table()))
            .fetch_all(store.pool())
            .await
            .unwrap();
    let mut expected: Vec<String> = keys
        .iter()
        .map(|k| k.as_str().replace('%', "%25").replace('\0', "%00"))
        .collect();
    expected.sort();
    assert_eq!(stored, expected);
    for k in &keys {
        assert!(store.delete(k).await.unwrap(), "{k}");
    }
    let left: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {}", store.table()))
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(left, 0, "delete reached every key's own row");
}

fn assert_store_error_with_source(err: &Error) {
    match err {
        Error::Store { source, .. } => {
            assert!(
                source.is_temporary(),
                "a lost connection is temporary: {source:?}"
            );
            let inner = std::error::Error::source(source).expect("the sqlx error is kept");
            assert!(inner.downcast_ref::<sqlx::Error>().is_some(), "{inner:?}");
        }
        other => panic!("expected Error::Store, got {other:?}"),
    }
}

#[tokio::test]
async fn a_terminated_connection_is_a_store_error_and_the_body_does_not_run() {
    let Some(url) = url() else { return };
    // Two: one holds a row lock while the other terminates the store's connection.
    let admin = sql_suite::pool::<sqlx::Postgres>(&url, 2).await;
    let schema = fresh_schema(&admin).await;
    let name = format!("idem-lost-{schema}");
    let options = PgConnectOptions::from_str(&url)
        .unwrap()
        .application_name(&name);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect_with(options)
        .await
        .unwrap();
    let store = PostgresStore::new(pool)
        .with_table(&format!("{schema}.idem_records"))
        .unwrap();
    store.migrate().await.unwrap();
    let idem = Idem::new(store);
    let runs = AtomicU64::new(0);
    idem.call(key("before"), Fingerprint::NONE)
        .run(|| async { runs.fetch_add(1, Ordering::SeqCst) })
        .await
        .unwrap();

    // The connection must die while a claim is on it: between two calls, sqlx may notice a
    // terminated connection by itself and open a new one, and the claim would then simply
    // succeed. So another transaction holds an uncommitted row under the key, the claim's
    // insert waits for it, and the connection is terminated while it waits.
    let mut holder = admin.begin().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO {schema}.idem_records (key, fingerprint, token, completed, payload, ends_at)
         VALUES ($1, $2, 1, false, NULL, now() + interval '1 minute')"
    ))
    .bind(key("after").as_str())
    .bind(&[0u8; 16][..])
    .execute(&mut *holder)
    .await
    .unwrap();
    let call = idem
        .call(key("after"), Fingerprint::NONE)
        .run(|| async { runs.fetch_add(1, Ordering::SeqCst) });
    let terminate = async {
        // Until the store's connection waits on the held row, then terminate it.
        let waiting = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE application_name = $1 AND wait_event_type = 'Lock'";
        for _ in 0..200 {
            let killed: Vec<bool> = sqlx::query_scalar(waiting)
                .bind(&name)
                .fetch_all(&admin)
                .await
                .unwrap();
            if !killed.is_empty() {
                assert_eq!(
                    killed,
                    vec![true],
                    "the store's one connection was terminated"
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the claim never waited on the held row");
    };
    let (res, ()) = tokio::join!(call, terminate);
    holder.rollback().await.unwrap();
    let err = res.unwrap_err();
    assert_store_error_with_source(&err);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the body ran without a claim"
    );
    // The pool replaces the dead connection: the next call works.
    tokio::time::sleep(Duration::from_millis(100)).await;
    idem.call(key("after"), Fingerprint::NONE)
        .run(|| async { runs.fetch_add(1, Ordering::SeqCst) })
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_server_that_is_down_is_a_store_error_and_the_body_does_not_run() {
    let Some(url) = url() else { return };
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let options = PgConnectOptions::from_str(&url)
        .unwrap()
        .host("127.0.0.1")
        .port(closed);
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy_with(options);
    let idem = Idem::new(PostgresStore::new(pool));
    let runs = AtomicU64::new(0);
    let err = idem
        .call(key("down"), Fingerprint::NONE)
        .run(|| async { runs.fetch_add(1, Ordering::SeqCst) })
        .await
        .unwrap_err();
    assert_store_error_with_source(&err);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the body ran without a store"
    );
}

/// Claims bring their own token, so `migrate` no longer creates a token sequence; one that
/// an earlier build created is left alone, and the table works with or without it.
#[tokio::test]
async fn migrate_creates_no_token_sequence_and_leaves_an_old_one_alone() {
    let Some(url) = url() else { return };
    let store = fresh_on(&url, 2).await;
    let sequence = format!("{}_token_seq", store.table());
    let exists = |name: String| {
        let pool = store.pool().clone();
        async move {
            sqlx::query_scalar::<_, bool>("SELECT to_regclass($1) IS NOT NULL")
                .bind(name)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert!(!exists(sequence.clone()).await, "migrate made {sequence}");

    // A table from an earlier build: schema version 1 with its sequence.
    let old = PostgresStore::new(sql_suite::pool::<sqlx::Postgres>(&url, 2).await)
        .with_table(&format!("{}_old", store.table()))
        .unwrap();
    let old_sequence = format!("{}_token_seq", old.table());
    sqlx::query(&format!("CREATE SEQUENCE {old_sequence}"))
        .execute(old.pool())
        .await
        .unwrap();
    old.migrate().await.unwrap();
    old.migrate().await.unwrap();
    assert!(
        exists(old_sequence.clone()).await,
        "{old_sequence} was dropped"
    );
    let idem = Idem::new(old);
    let v: u8 = idem
        .call(key("old-table"), Fingerprint::NONE)
        .run(|| async { 3 })
        .await
        .unwrap();
    assert_eq!(v, 3);
}

/// A replay reads: it answers while another transaction holds the record's row lock, and
/// it leaves the row as it was (same row version).
#[tokio::test]
async fn a_replay_takes_no_row_lock_and_writes_nothing() {
    let Some(store) = fresh().await else { return };
    let (k, held) = sql_suite::completed_and_held(&store, "postgres-tests").await;

    let version = |k: Key| {
        let (pool, table) = (store.pool().clone(), store.table());
        async move {
            sqlx::query_scalar::<_, String>(&format!(
                "SELECT ctid::text || '/' || xmin::text FROM {table} WHERE key = $1"
            ))
            .bind(k.as_str())
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let before = (version(k.clone()).await, version(held.clone()).await);

    let mut locker = store.pool().begin().await.unwrap();
    sqlx::query(&format!(
        "SELECT 1 FROM {} WHERE key = ANY($1) FOR UPDATE",
        store.table()
    ))
    .bind(vec![k.as_str().to_owned(), held.as_str().to_owned()])
    .execute(&mut *locker)
    .await
    .unwrap();
    sql_suite::claims_answer_without_waiting(&store, &k, Some(&held), Duration::from_secs(3)).await;
    locker.rollback().await.unwrap();

    assert_eq!(
        (version(k).await, version(held).await),
        before,
        "a replay rewrote the row"
    );
}

// ---- outages: every step bounded, through a proxy that black-holes or cuts -----------------

mod support;

/// A migrated table reached two ways: through a proxy of the test's own, and directly.
async fn behind_proxy(url: &str) -> (support::TcpProxy, Arc<dyn Store>, Arc<dyn Store>) {
    let options = PgConnectOptions::from_str(url).unwrap();
    let upstream = tokio::net::lookup_host((options.get_host(), options.get_port()))
        .await
        .unwrap()
        .next()
        .unwrap();
    let proxy = support::TcpProxy::start(upstream).await;
    let direct = fresh_on(url, 4).await;
    let proxied = PostgresStore::connect(&wire::through(url, proxy.port(), "sslmode=disable"))
        .await
        .unwrap()
        .with_table(&direct.table())
        .unwrap();
    (proxy, Arc::new(proxied), Arc::new(direct))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_holed_claim_answers_within_the_store_timeout() {
    let Some(url) = url() else { return };
    let (proxy, store, _) = behind_proxy(&url).await;
    support::claim_when_black_holed(store, &proxy, key("bh-claim")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_holed_release_answers_within_the_store_timeout() {
    let Some(url) = url() else { return };
    let (proxy, store, _) = behind_proxy(&url).await;
    support::release_when_black_holed(store, &proxy, key("bh-release")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_holed_extends_and_complete_answer_within_the_store_timeout() {
    let Some(url) = url() else { return };
    let (proxy, store, _) = behind_proxy(&url).await;
    support::extend_and_complete_when_black_holed(store, &proxy, key("bh-extend")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_black_holed_after_the_body_never_runs_it_twice_within_the_lease() {
    let Some(url) = url() else { return };
    let (proxy, store, direct) = behind_proxy(&url).await;
    support::complete_black_holed_after_the_body(store, direct, &proxy, key("bh-complete")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_connections_fail_fast_and_the_pool_recovers() {
    let Some(url) = url() else { return };
    let (proxy, store, _) = behind_proxy(&url).await;
    support::cut_connections_recover(store, &proxy, "postgres-cut").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_through_a_black_hole_ends_at_the_connect_timeout() {
    let Some(url) = url() else { return };
    let options = PgConnectOptions::from_str(&url).unwrap();
    let upstream = tokio::net::lookup_host((options.get_host(), options.get_port()))
        .await
        .unwrap()
        .next()
        .unwrap();
    let proxy = support::TcpProxy::start(upstream).await;
    proxy.black_hole();
    let timeout = Duration::from_millis(300);
    let started = std::time::Instant::now();
    let err = PostgresStore::builder()
        .connect_timeout(timeout)
        .connect(&wire::through(&url, proxy.port(), "sslmode=disable"))
        .await
        .unwrap_err();
    support::assert_within("postgres connect", started.elapsed(), timeout);
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert!(err.to_string().contains("within"), "{err}");
}

// ---- the commit level ------------------------------------------------------------------

/// The level is set inside each writing statement, for its own transaction: the pool's
/// connection keeps the server's setting, and the store costs no more round trips.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_level_is_the_statements_own_and_costs_no_round_trip() {
    let Some(url) = url() else { return };
    let store = fresh_on(&url, 1).await;
    let pool = store.pool().clone();
    let server_level: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&pool)
        .await
        .unwrap();
    // `off` differs from every server default worth running tests on.
    let store = store.with_synchronous_commit(SynchronousCommit::Off);
    assert_eq!(store.synchronous_commit(), Some(SynchronousCommit::Off));
    let idem = Idem::new(store.clone());
    let runs = AtomicU64::new(0);
    for _ in 0..2 {
        let v = idem
            .call(key("level"), Fingerprint::NONE)
            .run(|| async {
                runs.fetch_add(1, Ordering::SeqCst);
                5u8
            })
            .await
            .unwrap();
        assert_eq!(v, 5);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(store.delete(&key("level")).await.unwrap());
    let after: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        after, server_level,
        "the level leaked into the pool's session"
    );

    // The same exchanges on the wire as without a level.
    let table = store.table();
    let mut seen = Vec::new();
    for (level, id) in [
        (None, "wired"),
        (Some(SynchronousCommit::RemoteApply), "wired-level"),
    ] {
        let (proxy, through) = wire::Proxy::to_server_of(&url, wire::Protocol::Postgres).await;
        let through_pool = sql_suite::pool::<sqlx::Postgres>(&through, 1).await;
        let mut store = PostgresStore::new(through_pool.clone())
            .with_table(&table)
            .unwrap();
        if let Some(level) = level {
            store = store.with_synchronous_commit(level);
        }
        let idem = Idem::new(store);
        let first = wire::exchanges(&proxy, &idem, &through_pool, id).await;
        let replay = wire::exchanges(&proxy, &idem, &through_pool, id).await;
        eprintln!("level {level:?}: first call {first:?}, replay {replay:?}");
        seen.push((first, replay));
    }
    assert_eq!(seen[0], seen[1], "a level changed the exchanges");

    // What a store opened from a URL can use instead (the docs say so): sqlx's
    // `options[...]` sets the level for every statement of the pool's sessions.
    let sep = if url.contains('?') { '&' } else { '?' };
    let by_url = PostgresStore::builder()
        .migrate(false)
        .connect(&format!("{url}{sep}options[synchronous_commit]=off"))
        .await
        .unwrap();
    let session: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(by_url.pool())
        .await
        .unwrap();
    assert_eq!(session, "off");
}
