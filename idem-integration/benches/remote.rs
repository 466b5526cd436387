//! What `#[idempotent]` costs on Redis, Postgres and MySQL/MariaDB, measured against what a user would write
//! instead on the same client, in the same run: read the ratios (`BENCHMARKS.md`), not the
//! absolute times, which are mostly the server's round trips.
//!
//! ```sh
//! IDEM_TEST_REDIS_URL=redis://127.0.0.1:6379 \
//! IDEM_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//! IDEM_TEST_MYSQL_URL=mysql://root@127.0.0.1:3306/test \
//!     cargo bench -p idem-integration --bench remote --all-features
//! ```
//!
//! A backend whose variable is unset, or whose server cannot be reached, is skipped with a
//! line saying why, and the other one still runs (`IDEM_REQUIRE_BACKENDS=1` turns either
//! skip into a failure).
//!
//! Every idem side is the attribute as users write it, on the 4-field request of
//! `benches/memory.rs` taken by value
//! (`#[idempotent(key = req.order_id, store = redis_engine())] async fn charge(req) -> Receipt`),
//! and every baseline an `async fn` with the same signature: look the order up, decode its
//! stored receipt (JSON, idem's default codec); on a miss charge, encode and store it. Both
//! sides share one client: one `redis::aio::ConnectionManager`, one `sqlx::PgPool` of 16
//! connections, on one multi-thread runtime of 2 workers. Records are kept 24 h on both
//! sides (idem's default ttl; `SET ... EX 86400` by hand).
//!
//! - `redis_replay_1`, `postgres_replay_1`: one caller replaying stored orders (256 of them,
//!   stored before measuring). Baseline: `GET` + decode / `SELECT body ... WHERE order_id =
//!   $1` + decode; idem: one `claim` that finds the completed record, then its decode.
//! - `redis_replay_32`, `postgres_replay_16`: the same with 32 (Redis) or 16 (Postgres)
//!   concurrent callers, each a tokio task. The time per iteration is the total elapsed
//!   time divided by the calls made, i.e. the inverse of the throughput.
//! - `mysql_replay_1`, `mysql_replay_16`, `mysql_first_call`: the Postgres groups on MySQL
//!   or MariaDB, with a pool of 16 as well (`VARBINARY` order ids, `LONGBLOB` bodies,
//!   `INSERT IGNORE` by hand).
//! - `redis_first_call`, `postgres_first_call`: an order never seen before, one caller.
//!   Baseline: the raw write alone, `SET` / `INSERT` (1 round trip, and on Postgres 1
//!   commit); idem: claim, run, complete (2 round trips, 2 commits).
//!
//! Each run uses its own Redis key prefixes and Postgres tables (named after the process),
//! so a rerun never replays an earlier run's records; both are removed at the end.

use std::future::Future;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion};
use idem::stores::{MySqlStore, PostgresStore, RedisStore};
use idem::{idempotent, Idem};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgPool, PgPoolOptions};

mod support;

use support::{receipt_for, request, ChargeRequest, Receipt};

/// Orders stored before the replay groups, on both sides.
const STORED: u64 = 256;
/// How long the hand-written sides keep a receipt: idem's default ttl.
const TTL_SECS: u64 = 24 * 60 * 60;

// ---------------------------------------------------------------------------------------
// Redis.

/// The client both Redis sides share, and the hand-written side's key prefix.
struct RedisByHand {
    conn: ConnectionManager,
    prefix: String,
}

static REDIS_ENGINE: OnceLock<Idem> = OnceLock::new();
static REDIS_BY_HAND: OnceLock<RedisByHand> = OnceLock::new();

fn redis_engine() -> &'static Idem {
    REDIS_ENGINE
        .get()
        .expect("the Redis engine is set up in main")
}

#[idempotent(key = req.order_id, store = redis_engine())]
async fn redis_charge(req: ChargeRequest) -> Receipt {
    receipt_for(&req)
}

/// The hand-written check: `GET` the order's key, decode the stored receipt; on a miss,
/// charge, encode, `SET` with a ttl. No claim, so no protection against concurrent
/// duplicates: the least a hand-rolled result cache does.
async fn redis_charge_by_hand(req: ChargeRequest) -> Receipt {
    let hand = REDIS_BY_HAND.get().expect("set up in main");
    let mut conn = hand.conn.clone();
    let key = format!("{}{}", hand.prefix, req.order_id);
    let stored: Option<Vec<u8>> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("GET");
    match stored {
        Some(bytes) => serde_json::from_slice(&bytes).expect("a stored receipt"),
        None => redis_write_by_hand(req).await,
    }
}

/// The hand-written miss, and the first-call baseline: what a call that knows its order is
/// new would do, charge, encode and `SET`, in one round trip (idem needs two: claim, then
/// complete).
async fn redis_write_by_hand(req: ChargeRequest) -> Receipt {
    let hand = REDIS_BY_HAND.get().expect("set up in main");
    let mut conn = hand.conn.clone();
    let key = format!("{}{}", hand.prefix, req.order_id);
    let receipt = receipt_for(&req);
    let bytes = serde_json::to_vec(&receipt).expect("a receipt encodes");
    let () = redis::cmd("SET")
        .arg(&key)
        .arg(bytes)
        .arg("EX")
        .arg(TTL_SECS)
        .query_async(&mut conn)
        .await
        .expect("SET");
    receipt
}

/// Connects once and sets up both sides on that manager; `None` (with a line saying why)
/// when the variable is unset or the server does not answer.
async fn setup_redis(run: &str) -> Option<String> {
    let url = idem_core::testing::backend_url("IDEM_TEST_REDIS_URL")?;
    let connected = async {
        let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(3)))
            .set_response_timeout(Some(Duration::from_secs(3)))
            .set_number_of_retries(1);
        let mut conn = tokio::time::timeout(
            Duration::from_secs(10),
            ConnectionManager::new_with_config(client, config),
        )
        .await
        .map_err(|_| "no connection within 10s".to_string())?
        .map_err(|e| e.to_string())?;
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(conn)
    }
    .await;
    let conn = match connected {
        Ok(conn) => conn,
        Err(e) => return unreachable_server("IDEM_TEST_REDIS_URL", "Redis", &e),
    };
    let prefix = format!("idem-bench:{run}:");
    let store = RedisStore::builder()
        .prefix(format!("{prefix}idem:"))
        .connection_manager(conn.clone())
        .await;
    let _ = REDIS_ENGINE.set(Idem::new(store));
    let _ = REDIS_BY_HAND.set(RedisByHand {
        conn,
        prefix: format!("{prefix}hand:"),
    });
    for order in 0..STORED {
        redis_charge(request(order)).await.expect("a first call");
        redis_charge_by_hand(request(order)).await;
    }
    Some(prefix)
}

/// Deletes every key of this run.
async fn cleanup_redis(prefix: &str) {
    let mut conn = REDIS_BY_HAND.get().expect("set up").conn.clone();
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = match redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
        {
            Ok(page) => page,
            Err(e) => {
                eprintln!("could not remove this run's Redis keys: {e}");
                return;
            }
        };
        if !keys.is_empty() {
            let _: Result<u64, _> = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await;
        }
        if next == 0 {
            return;
        }
        cursor = next;
    }
}

// ---------------------------------------------------------------------------------------
// Postgres.

/// The pool both Postgres sides share, and the hand-written side's statements.
struct PgByHand {
    pool: PgPool,
    select: String,
    insert: String,
}

static PG_ENGINE: OnceLock<Idem> = OnceLock::new();
static PG_BY_HAND: OnceLock<PgByHand> = OnceLock::new();

fn pg_engine() -> &'static Idem {
    PG_ENGINE
        .get()
        .expect("the Postgres engine is set up in main")
}

#[idempotent(key = req.order_id, store = pg_engine())]
async fn pg_charge(req: ChargeRequest) -> Receipt {
    receipt_for(&req)
}

/// The hand-written check on Postgres: select the stored body, decode it; on a miss,
/// charge, encode, insert (a concurrent duplicate's row is left as it is).
async fn pg_charge_by_hand(req: ChargeRequest) -> Receipt {
    let hand = PG_BY_HAND.get().expect("set up in main");
    let stored: Option<(Vec<u8>,)> = sqlx::query_as(&hand.select)
        .bind(&req.order_id)
        .fetch_optional(&hand.pool)
        .await
        .expect("SELECT");
    match stored {
        Some((body,)) => serde_json::from_slice(&body).expect("a stored receipt"),
        None => pg_write_by_hand(req).await,
    }
}

/// The hand-written miss on Postgres, and the first-call baseline: charge, encode, one
/// `INSERT` (one round trip and one commit; idem's claim and complete are two of each).
async fn pg_write_by_hand(req: ChargeRequest) -> Receipt {
    let hand = PG_BY_HAND.get().expect("set up in main");
    let receipt = receipt_for(&req);
    let body = serde_json::to_vec(&receipt).expect("a receipt encodes");
    sqlx::query(&hand.insert)
        .bind(&req.order_id)
        .bind(body)
        .execute(&hand.pool)
        .await
        .expect("INSERT");
    receipt
}

/// The tables of this run: idem's, and the hand-written side's (on Postgres and MySQL).
struct PgTables {
    idem: String,
    by_hand: String,
}

async fn setup_postgres() -> Option<PgTables> {
    let url = idem_core::testing::backend_url("IDEM_TEST_POSTGRES_URL")?;
    let pool = PgPoolOptions::new()
        .max_connections(16)
        // As idem's own builder does: no ping before each statement, on both sides.
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(3));
    let pool = match tokio::time::timeout(Duration::from_secs(10), pool.connect(&url)).await {
        Ok(Ok(pool)) => pool,
        Ok(Err(e)) => return unreachable_server("IDEM_TEST_POSTGRES_URL", "Postgres", &e),
        Err(_) => {
            return unreachable_server("IDEM_TEST_POSTGRES_URL", "Postgres", &"no answer in 10s")
        }
    };
    let pid = std::process::id();
    let tables = PgTables {
        idem: format!("bench_idem_{pid}"),
        by_hand: format!("bench_by_hand_{pid}"),
    };
    let store = PostgresStore::new(pool.clone())
        .with_table(&tables.idem)
        .expect("a valid table name");
    store.migrate().await.expect("idem's table");
    let _ = PG_ENGINE.set(Idem::new(store));
    let by_hand = &tables.by_hand;
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {by_hand} (order_id text PRIMARY KEY, body bytea NOT NULL)"
    ))
    .execute(&pool)
    .await
    .expect("the hand-written side's table");
    let _ = PG_BY_HAND.set(PgByHand {
        select: format!("SELECT body FROM {by_hand} WHERE order_id = $1"),
        insert: format!(
            "INSERT INTO {by_hand} (order_id, body) VALUES ($1, $2) ON CONFLICT (order_id) DO NOTHING"
        ),
        pool,
    });
    for order in 0..STORED {
        pg_charge(request(order)).await.expect("a first call");
        pg_charge_by_hand(request(order)).await;
    }
    Some(tables)
}

async fn cleanup_postgres(tables: &PgTables) {
    let pool = &PG_BY_HAND.get().expect("set up").pool;
    for table in [
        tables.idem.clone(),
        format!("{}_schema", tables.idem),
        tables.by_hand.clone(),
    ] {
        if let Err(e) = sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
            .execute(pool)
            .await
        {
            eprintln!("could not drop {table}: {e}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// MySQL / MariaDB.

/// The pool both MySQL sides share, and the hand-written side's statements.
struct MyByHand {
    pool: MySqlPool,
    select: String,
    insert: String,
}

static MY_ENGINE: OnceLock<Idem> = OnceLock::new();
static MY_BY_HAND: OnceLock<MyByHand> = OnceLock::new();

fn my_engine() -> &'static Idem {
    MY_ENGINE.get().expect("the MySQL engine is set up in main")
}

#[idempotent(key = req.order_id, store = my_engine())]
async fn my_charge(req: ChargeRequest) -> Receipt {
    receipt_for(&req)
}

/// The hand-written check on MySQL: select the stored body, decode it; on a miss, charge,
/// encode, insert.
async fn my_charge_by_hand(req: ChargeRequest) -> Receipt {
    let hand = MY_BY_HAND.get().expect("set up in main");
    let stored: Option<(Vec<u8>,)> = sqlx::query_as(&hand.select)
        .bind(&req.order_id)
        .fetch_optional(&hand.pool)
        .await
        .expect("SELECT");
    match stored {
        Some((body,)) => serde_json::from_slice(&body).expect("a stored receipt"),
        None => my_write_by_hand(req).await,
    }
}

/// The hand-written miss on MySQL, and the first-call baseline: one `INSERT IGNORE`.
async fn my_write_by_hand(req: ChargeRequest) -> Receipt {
    let hand = MY_BY_HAND.get().expect("set up in main");
    let receipt = receipt_for(&req);
    let body = serde_json::to_vec(&receipt).expect("a receipt encodes");
    sqlx::query(&hand.insert)
        .bind(&req.order_id)
        .bind(body)
        .execute(&hand.pool)
        .await
        .expect("INSERT");
    receipt
}

async fn setup_mysql() -> Option<PgTables> {
    let url = idem_core::testing::backend_url("IDEM_TEST_MYSQL_URL")?;
    let pool = MySqlPoolOptions::new()
        .max_connections(16)
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(3));
    let pool = match tokio::time::timeout(Duration::from_secs(10), pool.connect(&url)).await {
        Ok(Ok(pool)) => pool,
        Ok(Err(e)) => return unreachable_server("IDEM_TEST_MYSQL_URL", "MySQL", &e),
        Err(_) => return unreachable_server("IDEM_TEST_MYSQL_URL", "MySQL", &"no answer in 10s"),
    };
    let pid = std::process::id();
    let tables = PgTables {
        idem: format!("bench_idem_{pid}"),
        by_hand: format!("bench_by_hand_{pid}"),
    };
    let store = MySqlStore::new(pool.clone())
        .with_table(&tables.idem)
        .expect("a valid table name");
    store.migrate().await.expect("idem's table");
    let _ = MY_ENGINE.set(Idem::new(store));
    let by_hand = &tables.by_hand;
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {by_hand} (order_id VARBINARY(255) PRIMARY KEY, body LONGBLOB NOT NULL)"
    ))
    .execute(&pool)
    .await
    .expect("the hand-written side's table");
    let _ = MY_BY_HAND.set(MyByHand {
        select: format!("SELECT body FROM {by_hand} WHERE order_id = ?"),
        insert: format!("INSERT IGNORE INTO {by_hand} (order_id, body) VALUES (?, ?)"),
        pool,
    });
    for order in 0..STORED {
        my_charge(request(order)).await.expect("a first call");
        my_charge_by_hand(request(order)).await;
    }
    Some(tables)
}

async fn cleanup_mysql(tables: &PgTables) {
    let pool = &MY_BY_HAND.get().expect("set up").pool;
    let procedure = format!("DROP PROCEDURE IF EXISTS {}_claim", tables.idem);
    if let Err(e) = sqlx::query(&procedure).execute(pool).await {
        eprintln!("could not drop the claim procedure: {e}");
    }
    for table in [
        tables.idem.clone(),
        format!("{}_schema", tables.idem),
        tables.by_hand.clone(),
    ] {
        if let Err(e) = sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
            .execute(pool)
            .await
        {
            eprintln!("could not drop {table}: {e}");
        }
    }
}

// ---------------------------------------------------------------------------------------

/// A server that is configured but does not answer: a skip, or a failure under
/// `IDEM_REQUIRE_BACKENDS=1`.
fn unreachable_server<T>(var: &str, what: &str, e: &dyn std::fmt::Display) -> Option<T> {
    if std::env::var("IDEM_REQUIRE_BACKENDS").as_deref() == Ok("1") {
        panic!("IDEM_REQUIRE_BACKENDS=1 but {what} ({var}) cannot be reached: {e}");
    }
    eprintln!("skipped: {what} ({var}) cannot be reached: {e}");
    None
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a multi-thread runtime")
}

/// `iters` calls split among `callers` tasks, each replaying its share of the stored
/// orders; the time from before the first spawn to the last task's end.
fn concurrent<F, Fut>(
    rt: &tokio::runtime::Runtime,
    callers: u64,
    iters: u64,
    requests: &Arc<Vec<ChargeRequest>>,
    call: F,
) -> Duration
where
    F: Fn(ChargeRequest) -> Fut + Copy + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    rt.block_on(async {
        let began = Instant::now();
        let tasks: Vec<_> = (0..callers)
            .map(|t| {
                let requests = requests.clone();
                let share = iters / callers + u64::from(t < iters % callers);
                tokio::spawn(async move {
                    for i in 0..share {
                        let req = &requests[((i * callers + t) % requests.len() as u64) as usize];
                        call(req.clone()).await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("a caller task");
        }
        began.elapsed()
    })
}

/// The three groups of one backend: replay with one caller, replay with `callers`, first
/// call (against `write_by_hand`, the raw write alone).
fn backend_groups<B, BF, W, WF, I, IF>(
    c: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    backend: &str,
    callers: u64,
    (by_hand, write_by_hand): (B, W),
    idem: I,
) where
    B: Fn(ChargeRequest) -> BF + Copy + Send + 'static,
    BF: Future<Output = Receipt> + Send + 'static,
    W: Fn(ChargeRequest) -> WF + Copy,
    WF: Future<Output = Receipt>,
    I: Fn(ChargeRequest) -> IF + Copy + Send + 'static,
    IF: Future<Output = Result<Receipt, idem::Error>> + Send + 'static,
{
    let requests: Arc<Vec<ChargeRequest>> = Arc::new((0..STORED).map(request).collect());
    let replay_by_hand = move |req| async move {
        black_box(by_hand(req).await);
    };
    let replay_idem = move |req| async move {
        black_box(idem(req).await.expect("a replay"));
    };

    let mut g = c.benchmark_group(format!("{backend}_replay_1"));
    g.sample_size(30).measurement_time(Duration::from_secs(5));
    g.bench_function("baseline", |b| {
        let mut n = 0usize;
        b.to_async(rt).iter(|| {
            n += 1;
            replay_by_hand(requests[n % requests.len()].clone())
        })
    });
    g.bench_function("idem", |b| {
        let mut n = 0usize;
        b.to_async(rt).iter(|| {
            n += 1;
            replay_idem(requests[n % requests.len()].clone())
        })
    });
    g.finish();

    let mut g = c.benchmark_group(format!("{backend}_replay_{callers}"));
    g.sample_size(30).measurement_time(Duration::from_secs(5));
    g.bench_function("baseline", |b| {
        b.iter_custom(|iters| concurrent(rt, callers, iters, &requests, replay_by_hand))
    });
    g.bench_function("idem", |b| {
        b.iter_custom(|iters| concurrent(rt, callers, iters, &requests, replay_idem))
    });
    g.finish();

    // Orders never seen before, on both sides; making the request is setup, not measured.
    let next = AtomicU64::new(1_000_000);
    let fresh = || request(next.fetch_add(1, Ordering::Relaxed));
    let mut g = c.benchmark_group(format!("{backend}_first_call"));
    g.sample_size(30).measurement_time(Duration::from_secs(5));
    g.bench_function("baseline", |b| {
        b.to_async(rt)
            .iter_batched(fresh, write_by_hand, BatchSize::SmallInput)
    });
    g.bench_function("idem", |b| {
        b.to_async(rt).iter_batched(
            fresh,
            |req| async move { idem(req).await.expect("a first call") },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn main() {
    let rt = runtime();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let run = format!("{}-{nanos}", std::process::id());
    let redis = rt.block_on(setup_redis(&run));
    let postgres = rt.block_on(setup_postgres());
    let mysql = rt.block_on(setup_mysql());

    let mut c = Criterion::default().configure_from_args();
    if redis.is_some() {
        backend_groups(
            &mut c,
            &rt,
            "redis",
            32,
            (redis_charge_by_hand, redis_write_by_hand),
            redis_charge,
        );
    }
    if postgres.is_some() {
        backend_groups(
            &mut c,
            &rt,
            "postgres",
            16,
            (pg_charge_by_hand, pg_write_by_hand),
            pg_charge,
        );
    }
    if mysql.is_some() {
        backend_groups(
            &mut c,
            &rt,
            "mysql",
            16,
            (my_charge_by_hand, my_write_by_hand),
            my_charge,
        );
    }
    c.final_summary();

    if let Some(prefix) = &redis {
        rt.block_on(cleanup_redis(prefix));
    }
    if let Some(tables) = &postgres {
        rt.block_on(cleanup_postgres(tables));
    }
    if let Some(tables) = &mysql {
        rt.block_on(cleanup_mysql(tables));
    }
}
