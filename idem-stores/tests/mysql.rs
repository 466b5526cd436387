//! MySqlStore against a MySQL or MariaDB server: the conformance suite, the SQL stores'
//! shared tests, keys as bytes, and round trips counted on the wire. Each test uses a table
//! of its own. Runs when `IDEM_TEST_MYSQL_URL` is set
//! (`mysql://root@127.0.0.1:3306/test`), and fails instead of skipping when
//! `IDEM_REQUIRE_BACKENDS=1`.
#![cfg(feature = "mysql")]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use idem_core::testing::backend_url;
use idem_core::{Claim, Fingerprint, Idem, Key, Record, Store, Token};
use idem_stores::MySqlStore;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

static TABLES: AtomicU64 = AtomicU64::new(0);

fn url() -> Option<String> {
    backend_url("IDEM_TEST_MYSQL_URL")
}

fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

async fn pool(url: &str, max: u32) -> MySqlPool {
    MySqlPoolOptions::new()
        .max_connections(max)
        .test_before_acquire(false)
        .connect(url)
        .await
        .expect("connect to IDEM_TEST_MYSQL_URL")
}

/// A table name no other test or run uses; drops the tables (and claim procedures) of test
/// runs older than an hour.
async fn fresh_table(pool: &MySqlPool) -> String {
    let now = unix_secs();
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
    for (name, kind) in old {
        let born: u64 = name
            .split('_')
            .nth(2)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if born + 3600 < now {
            let _ = sqlx::raw_sql(&format!("DROP {kind} IF EXISTS `{name}`"))
                .execute(pool)
                .await;
        }
    }
    format!(
        "idem_t_{now}_{}_{}",
        std::process::id(),
        TABLES.fetch_add(1, Ordering::Relaxed)
    )
}

/// A store on a pool of its own, on a table of its own, not migrated.
async fn unmigrated_on(url: &str, max: u32) -> MySqlStore {
    let pool = pool(url, max).await;
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
);

fn key(id: &str) -> Key {
    Key::new("mysql-tests", id).unwrap()
}

/// Keys are bound, never spliced, and stored as their bytes: NUL, case and `%` all reach
/// rows of their own, and the column holds exactly `scope/id`.
#[tokio::test]
async fn keys_are_bound_parameters_stored_as_their_bytes() {
    let Some(store) = fresh().await else { return };
    let ids = [
        "it's".to_string(),
        "\"quoted\"".into(),
        "`tick`".into(),
        "100%".into(),
        "_".into(),
        "'; DROP TABLE idem_records; --".into(),
        "?".into(),
        "$1".into(),
        "ünïcödé 🦀".into(),
        "Ünïcödé 🦀".into(),
        "a\0b".into(),
        "a".into(),
        "a ".into(),
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
    let mut stored: Vec<Vec<u8>> =
        sqlx::query_scalar(&format!("SELECT `key` FROM {}", store.table()))
            .fetch_all(store.pool())
            .await
            .unwrap();
    stored.sort();
    let mut expected: Vec<Vec<u8>> = ids
        .iter()
        .map(|id| key(id).as_str().as_bytes().to_vec())
        .collect();
    expected.sort();
    assert_eq!(stored, expected);
    for id in &ids {
        match store.get(&key(id)).await.unwrap() {
            Some(Record::Completed { payload, .. }) => assert_eq!(payload, Bytes::from(id.clone())),
            other => panic!("{id:?}: {other:?}"),
        }
        assert!(store.delete(&key(id)).await.unwrap(), "{id:?}");
    }
}

// ---- round trips, counted on the wire ------------------------------------------------

/// One command the client sent and waited for (the first packet of a command, sequence
/// number 0, by its command byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exchange {
    /// COM_STMT_EXECUTE: a prepared statement ran.
    Statement,
    /// COM_STMT_PREPARE: sqlx preparing a statement, once per connection.
    Prepare,
    /// COM_PING.
    Ping,
    /// COM_QUERY: a plain-text query.
    Simple,
    /// Anything else that waits for an answer.
    Other(u8),
}

/// A TCP proxy to the MySQL server that logs the client's commands.
struct Proxy {
    port: u16,
    log: Arc<Mutex<Vec<Exchange>>>,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let log = Arc::new(Mutex::new(Vec::new()));
        let shared = log.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(&upstream).await.unwrap();
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let log = shared.clone();
                tokio::spawn(async move {
                    let _ = client_to_server(&mut cr, &mut sw, &log).await;
                });
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                });
            }
        });
        Proxy { port, log }
    }

    fn take(&self) -> Vec<Exchange> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

/// Forwards the client's packets, logging each command: a packet with sequence number 0
/// (the handshake response and authentication packets have others).
async fn client_to_server(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    log: &Mutex<Vec<Exchange>>,
) -> std::io::Result<()> {
    loop {
        let mut header = [0u8; 4];
        from.read_exact(&mut header).await?;
        let len = u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize;
        let mut body = vec![0; len];
        from.read_exact(&mut body).await?;
        if header[3] == 0 && !body.is_empty() {
            let e = match body[0] {
                0x17 => Some(Exchange::Statement),
                0x16 => Some(Exchange::Prepare),
                0x0e => Some(Exchange::Ping),
                0x03 => Some(Exchange::Simple),
                // COM_STMT_CLOSE and COM_QUIT get no answer: no round trip.
                0x19 | 0x01 => None,
                other => Some(Exchange::Other(other)),
            };
            if let Some(e) = e {
                log.lock().unwrap().push(e);
            }
        }
        to.write_all(&header).await?;
        to.write_all(&body).await?;
    }
}

/// The test server's URL with the proxy's address instead of the server's, without TLS so
/// that the proxy can read the packets.
fn through(url: &str, port: u16) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (user, rest) = match rest.split_once('@') {
        Some((user, rest)) => (format!("{user}@"), rest),
        None => (String::new(), rest),
    };
    let path = rest.find(['/', '?']).map_or("", |at| &rest[at..]);
    let sep = if path.contains('?') { '&' } else { '?' };
    format!("{scheme}://{user}127.0.0.1:{port}{path}{sep}ssl-mode=disabled")
}

/// Waits until every connection is back in the pool: then every exchange so far is in the
/// proxy's log.
async fn settle(pool: &MySqlPool) {
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
    let options: sqlx::mysql::MySqlConnectOptions = url.parse().unwrap();
    let upstream = format!("{}:{}", options.get_host(), options.get_port());
    let proxy = Proxy::start(upstream).await;
    let table = fresh_table(&pool(&url, 1).await).await;

    async fn call(idem: &Idem, id: &'static str) -> String {
        idem.run(key(id), Fingerprint::NONE, || async { id.to_string() })
            .await
            .unwrap()
    }

    // The store's own constructor, through the proxy; it migrates the table.
    let store = MySqlStore::builder()
        .table(&table)
        .connect(&through(&url, proxy.port))
        .await
        .unwrap();
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
    eprintln!("MySqlStore::connect: first call {first:?}, replay {replay:?}");
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
        // answer; with test_before_acquire off, no check comes before a statement. (A
        // connection the pool opens on the way sets its session up with a plain query.)
        assert_ne!(
            log.first(),
            Some(&Exchange::Ping),
            "a ping before the statement: {log:?}"
        );
    }

    // One warm connection: exactly one exchange per step on the caller's path, then the
    // pool's check on release.
    let one = MySqlPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect(&through(&url, proxy.port))
        .await
        .unwrap();
    let pool = one.clone();
    let idem = Idem::new(MySqlStore::new(one).with_table(&table).unwrap());
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
}

/// A payload of 1 MiB and one of 8 MiB (under MariaDB's default `max_allowed_packet` of
/// 16 MiB) come back byte for byte.
#[tokio::test]
async fn payloads_up_to_the_servers_packet_limit_round_trip() {
    let Some(store) = fresh().await else { return };
    for (i, size) in [1usize << 20, 8 << 20].into_iter().enumerate() {
        let k = key(&format!("big{i}"));
        let payload: Bytes = (0..size)
            .map(|n| (n % 251) as u8)
            .collect::<Vec<u8>>()
            .into();
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
            .complete(&k, token, payload.clone(), Duration::from_secs(30))
            .await
            .unwrap();
        match store.get(&k).await.unwrap() {
            Some(Record::Completed { payload: got, .. }) => {
                assert!(got == payload, "{size} bytes changed")
            }
            other => panic!("{other:?}"),
        }
    }
}
