//! The remote pairs that `benches/remote.rs` times and `benches/remote_instructions.rs`
//! counts: on Redis, Postgres and MySQL/MariaDB, the attribute as users write it (each on
//! an engine of its own, set up by `setup_*`) and the hand-written check on the same client
//! it is compared with. Each run uses its own Redis key prefix and tables (named after the
//! process), removed by `cleanup_*`.

use std::sync::OnceLock;
use std::time::Duration;

use idem::stores::{MySqlStore, PostgresStore, RedisStore};
use idem::{idempotent, Idem};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgPool, PgPoolOptions};

use crate::support::{receipt_for, request, ChargeRequest, Receipt};

/// Orders stored before the replay groups, on both sides.
pub const STORED: u64 = 256;
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
pub async fn redis_charge(req: ChargeRequest) -> Receipt {
    receipt_for(&req)
}

/// The hand-written check: `GET` the order's key, decode the stored receipt; on a miss,
/// charge, encode, `SET` with a ttl. No claim, so no protection against concurrent
/// duplicates: the least a hand-rolled result cache does.
pub async fn redis_charge_by_hand(req: ChargeRequest) -> Receipt {
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
pub async fn redis_write_by_hand(req: ChargeRequest) -> Receipt {
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
pub async fn setup_redis(run: &str) -> Option<String> {
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
pub async fn cleanup_redis(prefix: &str) {
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
pub async fn pg_charge(req: ChargeRequest) -> Receipt {
    receipt_for(&req)
}

/// The hand-written check on Postgres: select the stored body, decode it; on a miss,
/// charge, encode, insert (a concurrent duplicate's row is left as it is).
pub async fn pg_charge_by_hand(req: ChargeRequest) -> Receipt {
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
pub async fn pg_write_by_hand(req: ChargeRequest) -> Receipt {
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
pub struct PgTables {
    idem: String,
    by_hand: String,
}

pub async fn setup_postgres() -> Option<PgTables> {
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

pub async fn cleanup_postgres(tables: &PgTables) {
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
pub async fn my_charge(req: ChargeRequest) -> Receipt {
    receipt_for(&req)
}

/// The hand-written check on MySQL: select the stored body, decode it; on a miss, charge,
/// encode, insert.
pub async fn my_charge_by_hand(req: ChargeRequest) -> Receipt {
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
pub async fn my_write_by_hand(req: ChargeRequest) -> Receipt {
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

pub async fn setup_mysql() -> Option<PgTables> {
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

pub async fn cleanup_mysql(tables: &PgTables) {
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
pub fn unreachable_server<T>(var: &str, what: &str, e: &dyn std::fmt::Display) -> Option<T> {
    if std::env::var("IDEM_REQUIRE_BACKENDS").as_deref() == Ok("1") {
        panic!("IDEM_REQUIRE_BACKENDS=1 but {what} ({var}) cannot be reached: {e}");
    }
    eprintln!("skipped: {what} ({var}) cannot be reached: {e}");
    None
}
