//! Postgres store against a real server (`IDEM_TEST_POSTGRES_URL`; skipped with a message
//! when unset, a failure when `IDEM_REQUIRE_BACKENDS=1`). Every test works in a schema of
//! its own, so tests run in parallel; schemas older than an hour are dropped on the way.
//!
//! Round trips are counted on the wire: a small proxy between the pool and the server reads
//! the client's protocol messages and tells statements, prepares and pings apart.
#![cfg(feature = "postgres")]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use idem_core::testing::backend_url;
use idem_core::{Claim, Error, Fingerprint, Idem, InProgress, Key, Record, Store, Token};
use idem_stores::PostgresStore;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

static SCHEMAS: AtomicU64 = AtomicU64::new(0);

fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn url() -> Option<String> {
    backend_url("IDEM_TEST_POSTGRES_URL")
}

async fn pool(url: &str, max: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max)
        .test_before_acquire(false)
        .connect(url)
        .await
        .expect("connect to IDEM_TEST_POSTGRES_URL")
}

/// A new schema for one test; drops the schemas of test runs older than an hour.
async fn fresh_schema(pool: &PgPool) -> String {
    let now = unix_secs();
    let old: Vec<String> = sqlx::query_scalar(
        "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'idem\\_t\\_%'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    for schema in old {
        let born: u64 = schema
            .split('_')
            .nth(2)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if born + 3600 < now {
            let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                .execute(pool)
                .await;
        }
    }
    let schema = format!(
        "idem_t_{now}_{}_{}",
        std::process::id(),
        SCHEMAS.fetch_add(1, Ordering::Relaxed)
    );
    sqlx::query(&format!("CREATE SCHEMA \"{schema}\""))
        .execute(pool)
        .await
        .unwrap();
    schema
}

/// A migrated store on its own pool, in a fresh schema.
async fn fresh_on(url: &str, max: u32) -> PostgresStore {
    let pool = pool(url, max).await;
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

#[macro_use]
#[path = "support/sql.rs"]
mod sql_suite;

/// A store on a pool of its own, in a fresh schema, not migrated.
async fn unmigrated() -> Option<(PostgresStore, ())> {
    let pool = pool(&url()?, 6).await;
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
);

fn key(id: &str) -> Key {
    Key::new("postgres-tests", id).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_engines_on_two_pools_run_each_key_once() {
    let Some(url) = url() else { return };
    let a = fresh_on(&url, 5).await;
    let b = PostgresStore::new(pool(&url, 5).await)
        .with_table(&a.table())
        .unwrap();
    let engines = [a, b].map(|s| {
        Idem::builder()
            .store(s)
            .in_progress(InProgress::Wait)
            .wait_timeout(Duration::from_secs(30))
            .build()
            .unwrap()
    });
    const KEYS: usize = 30;
    let runs: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let mut tasks = Vec::new();
    for i in 0..KEYS * 10 {
        let (idem, runs, k) = (engines[i % 2].clone(), runs.clone(), i % KEYS);
        tasks.push(tokio::spawn(async move {
            let v: usize = idem
                .run(key(&format!("k{k}")), Fingerprint::of(&k), || async move {
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
        assert_eq!(
            *answers.entry(k).or_insert(v),
            v,
            "key {k} answered two values"
        );
    }
    let runs: Vec<u64> = runs.iter().map(|n| n.load(Ordering::SeqCst)).collect();
    assert_eq!(
        runs,
        vec![1; KEYS],
        "executions per key across both engines"
    );
    let winners_on_a = answers.values().filter(|v| *v % 2 == 0).count();
    eprintln!("keys won by engine a: {winners_on_a} of {KEYS}");
}

// ---- round trips, counted on the wire ------------------------------------------------

/// One request the client made and waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exchange {
    /// Bind/Execute ... Sync: a statement ran.
    Statement,
    /// Parse/Describe ... Sync with no Execute: sqlx preparing a statement.
    Prepare,
    /// A bare Sync: sqlx's connection check (before lending it out, or on its return).
    Ping,
    /// A simple-protocol query.
    Simple,
}

/// A TCP proxy to the Postgres server that logs the client's exchanges.
struct Proxy {
    port: u16,
    log: Arc<Mutex<Vec<Exchange>>>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let log = Arc::new(Mutex::new(Vec::new()));
        let shared = log.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(upstream).await.unwrap();
                let log = shared.clone();
                tokio::spawn(async move {
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut sr, &mut cw).await;
                    });
                    let _ = client_to_server(&mut cr, &mut sw, &log).await;
                });
            }
        });
        Proxy { port, log }
    }

    fn take(&self) -> Vec<Exchange> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

/// Forwards the client's bytes message by message, logging each exchange as it ends.
async fn client_to_server(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    log: &Mutex<Vec<Exchange>>,
) -> std::io::Result<()> {
    // Startup: untyped messages (length, then body) until one that is not an SSL or GSS
    // encryption request.
    loop {
        let len = from.read_u32().await?;
        let mut body = vec![0; len as usize - 4];
        from.read_exact(&mut body).await?;
        to.write_u32(len).await?;
        to.write_all(&body).await?;
        let code = u32::from_be_bytes(body[..4].try_into().unwrap());
        if code != 80877103 && code != 80877104 {
            break;
        }
    }
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let kind = from.read_u8().await?;
        let len = from.read_u32().await?;
        let mut body = vec![0; len as usize - 4];
        from.read_exact(&mut body).await?;
        match kind {
            b'S' => {
                let e = if pending.contains(&b'E') {
                    Exchange::Statement
                } else if pending.contains(&b'P') {
                    Exchange::Prepare
                } else {
                    Exchange::Ping
                };
                log.lock().unwrap().push(e);
                pending.clear();
            }
            b'Q' => log.lock().unwrap().push(Exchange::Simple),
            other => pending.push(other),
        }
        to.write_u8(kind).await?;
        to.write_u32(len).await?;
        to.write_all(&body).await?;
    }
}

/// The test server's URL with the proxy's address instead of the server's.
fn through(url: &str, port: u16) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (user, rest) = match rest.split_once('@') {
        Some((user, rest)) => (format!("{user}@"), rest),
        None => (String::new(), rest),
    };
    let path = rest.find(['/', '?']).map_or("", |at| &rest[at..]);
    let sep = if path.contains('?') { '&' } else { '?' };
    format!("{scheme}://{user}127.0.0.1:{port}{path}{sep}sslmode=disable")
}

/// Waits until every connection is back in the pool, which sqlx does only after its check
/// of the connection has answered: then every exchange so far is in the proxy's log.
async fn settle(pool: &PgPool) {
    for _ in 0..500 {
        if pool.num_idle() == pool.size() as usize {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
}

fn count(log: &[Exchange], e: Exchange) -> usize {
    log.iter().filter(|x| **x == e).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_first_call_two_replay_one() {
    let Some(url) = url() else { return };
    let options = PgConnectOptions::from_str(&url).unwrap();
    let upstream = tokio::net::lookup_host((options.get_host(), options.get_port()))
        .await
        .unwrap()
        .next()
        .unwrap();
    let proxy = Proxy::start(upstream).await;
    let schema = fresh_schema(&pool(&url, 1).await).await;
    let table = format!("{schema}.idem_records");

    async fn call(idem: &Idem, id: &'static str) -> String {
        idem.run(key(id), Fingerprint::NONE, || async {
            // Lets the pool's background check of the claim's connection pass first.
            tokio::time::sleep(Duration::from_millis(50)).await;
            id.to_string()
        })
        .await
        .unwrap()
    }

    // The store's own constructor, through the proxy. Its pool has several connections,
    // each of which prepares a statement the first time it runs it.
    let store = PostgresStore::connect(&through(&url, proxy.port))
        .await
        .unwrap()
        .with_table(&table)
        .unwrap();
    store.migrate().await.unwrap();
    let pool = store.pool().clone();
    let idem = Idem::new(store);
    settle(&pool).await;
    proxy.take();
    call(&idem, "a").await;
    settle(&pool).await;
    let first = proxy.take();
    call(&idem, "a").await;
    settle(&pool).await;
    let replay = proxy.take();
    eprintln!("PostgresStore::connect: first call {first:?}, replay {replay:?}");
    assert_eq!(
        count(&first, Exchange::Statement),
        2,
        "a first call is claim + complete: {first:?}"
    );
    assert_eq!(
        count(&replay, Exchange::Statement),
        1,
        "a replay is one claim: {replay:?}"
    );
    for log in [&first, &replay] {
        // sqlx checks a connection when it goes back to the pool, after the caller has its
        // answer; with test_before_acquire off, no check comes before a statement.
        assert_ne!(
            log.first(),
            Some(&Exchange::Ping),
            "a ping before the statement: {log:?}"
        );
        assert_eq!(count(log, Exchange::Simple), 0, "{log:?}");
    }

    // One warm connection: exactly one exchange per step on the caller's path, then the
    // pool's check on release.
    let one = PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect(&through(&url, proxy.port))
        .await
        .unwrap();
    let pool = one.clone();
    let idem = Idem::new(PostgresStore::new(one).with_table(&table).unwrap());
    call(&idem, "warm").await;
    call(&idem, "warm").await;
    settle(&pool).await;
    proxy.take();
    call(&idem, "b").await;
    settle(&pool).await;
    let first = proxy.take();
    call(&idem, "b").await;
    settle(&pool).await;
    let replay = proxy.take();
    eprintln!("one warm connection: first call {first:?}, replay {replay:?}");
    use Exchange::{Ping, Statement};
    assert_eq!(
        first,
        [Statement, Ping, Statement, Ping],
        "first call: claim, complete"
    );
    assert_eq!(replay, [Statement, Ping], "replay: claim");

    // What a pool with sqlx's defaults costs: a ping before every statement.
    let default_pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&through(&url, proxy.port))
        .await
        .unwrap();
    let pool = default_pool.clone();
    let idem = Idem::new(PostgresStore::new(default_pool).with_table(&table).unwrap());
    call(&idem, "warm").await;
    settle(&pool).await;
    proxy.take();
    call(&idem, "b").await;
    settle(&pool).await;
    let replay = proxy.take();
    eprintln!("replay on a pool with sqlx's default test_before_acquire: {replay:?}");
    assert_eq!(replay, [Ping, Statement, Ping]);
}

// ---- setup and failures ------------------------------------------------------------------

/// Keys are bound, never spliced, and kept as they are but for `%` and NUL, which are
/// percent-encoded (Postgres text cannot hold NUL): every key still reaches its own row.
#[tokio::test]
async fn keys_are_bound_parameters_stored_with_percent_and_nul_escaped() {
    let Some(store) = fresh().await else { return };
    let ids = [
        "it's".to_string(),
        "\"quoted\"".into(),
        "100%".into(),
        "%".into(),
        "_".into(),
        "'; DROP TABLE idem_records; --".into(),
        "$1".into(),
        "ünïcödé 🦀".into(),
        "a\0b".into(),
        "a%00b".into(),
        "\0".into(),
        "k".repeat(1024),
    ];
    for id in &ids {
        let k = key(id);
        let Claim::Acquired { token, .. } = store
            .claim(
                &k,
                &Fingerprint::NONE,
                Token::random(),
                Duration::from_secs(30),
            )
            .await
            .unwrap()
        else {
            panic!("{id:?} not acquired");
        };
        store
            .complete(&k, token, Bytes::from(id.clone()), Duration::from_secs(30))
            .await
            .unwrap();
    }
    let stored: Vec<String> =
        sqlx::query_scalar(&format!("SELECT key FROM {} ORDER BY key", store.table()))
            .fetch_all(store.pool())
            .await
            .unwrap();
    let mut expected: Vec<String> = ids
        .iter()
        .map(|id| key(id).as_str().replace('%', "%25").replace('\0', "%00"))
        .collect();
    expected.sort();
    assert_eq!(stored, expected);
    for id in &ids {
        match store.get(&key(id)).await.unwrap() {
            Some(Record::Completed { payload, .. }) => assert_eq!(payload, Bytes::from(id.clone())),
            other => panic!("{id:?}: {other:?}"),
        }
    }
    for id in &ids {
        assert!(store.delete(&key(id)).await.unwrap(), "{id:?}");
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
    let admin = pool(&url, 1).await;
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
    idem.run(key("before"), Fingerprint::NONE, || async {
        runs.fetch_add(1, Ordering::SeqCst)
    })
    .await
    .unwrap();

    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(&name)
    .fetch_all(&admin)
    .await
    .unwrap();
    assert_eq!(
        killed,
        vec![true],
        "the store's one connection was terminated"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;

    let err = idem
        .run(key("after"), Fingerprint::NONE, || async {
            runs.fetch_add(1, Ordering::SeqCst)
        })
        .await
        .unwrap_err();
    assert_store_error_with_source(&err);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the body ran without a claim"
    );
    // The pool replaces the dead connection: the next call works.
    tokio::time::sleep(Duration::from_millis(100)).await;
    idem.run(key("after"), Fingerprint::NONE, || async {
        runs.fetch_add(1, Ordering::SeqCst)
    })
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
        .run(key("down"), Fingerprint::NONE, || async {
            runs.fetch_add(1, Ordering::SeqCst)
        })
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
    let old = PostgresStore::new(pool(&url, 2).await)
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
        .run(key("old-table"), Fingerprint::NONE, || async { 3 })
        .await
        .unwrap();
    assert_eq!(v, 3);
}

/// A replay reads: it answers while another transaction holds the record's row lock, and
/// it leaves the row as it was (same row version).
#[tokio::test]
async fn a_replay_takes_no_row_lock_and_writes_nothing() {
    let Some(store) = fresh().await else { return };
    let k = key("replay-reads");
    let Claim::Acquired { token, .. } = store
        .claim(
            &k,
            &Fingerprint::NONE,
            Token::random(),
            Duration::from_secs(30),
        )
        .await
        .unwrap()
    else {
        panic!()
    };
    store
        .complete(&k, token, Bytes::from_static(b"v"), Duration::from_secs(60))
        .await
        .unwrap();
    let held = key("held-elsewhere");
    store
        .claim(
            &held,
            &Fingerprint::NONE,
            Token::random(),
            Duration::from_secs(30),
        )
        .await
        .unwrap();

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
    let replay = tokio::time::timeout(
        Duration::from_secs(3),
        store.claim(
            &k,
            &Fingerprint::NONE,
            Token::random(),
            Duration::from_secs(30),
        ),
    )
    .await
    .expect("a replay waited for a row lock")
    .unwrap();
    assert!(matches!(replay, Claim::Completed { .. }), "{replay:?}");
    let busy = tokio::time::timeout(
        Duration::from_secs(3),
        store.claim(
            &held,
            &Fingerprint::NONE,
            Token::random(),
            Duration::from_secs(30),
        ),
    )
    .await
    .expect("an in-progress answer waited for a row lock")
    .unwrap();
    assert!(matches!(busy, Claim::InProgress { .. }), "{busy:?}");
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
    let proxied = PostgresStore::connect(&through(url, proxy.port()))
        .await
        .unwrap()
        .with_table(&direct.table())
        .unwrap();
    (proxy, Arc::new(proxied), Arc::new(direct))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_holed_claim_answers_within_the_step_timeout() {
    let Some(url) = url() else { return };
    let (proxy, store, _) = behind_proxy(&url).await;
    support::claim_when_black_holed(store, &proxy, key("bh-claim")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_holed_release_answers_within_the_step_timeout() {
    let Some(url) = url() else { return };
    let (proxy, store, _) = behind_proxy(&url).await;
    support::release_when_black_holed(store, &proxy, key("bh-release")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_holed_extends_and_complete_answer_within_the_step_timeout() {
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
        .connect(&through(&url, proxy.port()))
        .await
        .unwrap_err();
    support::assert_within("postgres connect", started.elapsed(), timeout);
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
    assert!(err.to_string().contains("within"), "{err}");
}
