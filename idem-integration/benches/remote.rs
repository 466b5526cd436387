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
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion};

#[path = "support/remote_pairs.rs"]
mod remote_pairs;
mod support;

use remote_pairs::{
    cleanup_mysql, cleanup_postgres, cleanup_redis, my_charge, my_charge_by_hand, my_write_by_hand,
    pg_charge, pg_charge_by_hand, pg_write_by_hand, redis_charge, redis_charge_by_hand,
    redis_write_by_hand, setup_mysql, setup_postgres, setup_redis, STORED,
};
use support::{request, ChargeRequest, Receipt};

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
