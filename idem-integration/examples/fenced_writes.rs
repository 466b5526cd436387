//! A stalled holder, its successor, and the fence that keeps the stalled one from
//! overwriting its successor's write in the application's own table.
//!
//! Worker A claims `payout:o-7` and freezes before it writes (a long GC pause, a VM
//! migration: here a blocking sleep, which stops its heartbeat too). Its lease ends, worker
//! B takes the key over and records the payout. Then A wakes up and writes as well. The
//! store refuses A's result (its token is stale); the `payouts` table refuses A's write
//! because each write carries the claim's fence (`idem::fence()`) and the table keeps only
//! a larger one: `UPDATE payouts SET ..., fence = $1 WHERE order_id = $2 AND fence < $1`.
//!
//! `cargo run -p idem-integration --example fenced_writes` (SQLite in a temporary directory,
//! no server).

use std::time::Duration;

use idem::stores::SqliteStore;
use idem::{Error, Fence, Fingerprint, Idem, Key, LeaseLoss};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Records the payout of `order` as sent by `worker`, unless a holder with a larger fence
/// wrote it already: whether this write took effect.
async fn record_payout(
    pool: &sqlx::SqlitePool,
    order: &str,
    worker: &str,
    fence: Fence,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE payouts SET status = 'sent', sent_by = $3, fence = $1
         WHERE order_id = $2 AND fence < $1",
    )
    .bind(fence.as_i64())
    .bind(order)
    .bind(worker)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The body both workers run: the payout, written under the claim's fence. `stall` freezes
/// the worker's thread before it writes.
async fn pay_out(pool: &sqlx::SqlitePool, worker: &str, stall: Duration) -> Result<bool, BoxError> {
    let fence = idem::fence().ok_or("no fence: the store assigns none")?;
    println!("{worker}: claimed the key with fence {fence}");
    if !stall.is_zero() {
        // The whole thread stops: no heartbeat extends the lease meanwhile.
        std::thread::sleep(stall);
        println!("{worker}: woke up after {stall:?}, writing with fence {fence}");
    }
    let written = record_payout(pool, "o-7", worker, fence).await?;
    println!(
        "{worker}: its write {}",
        if written {
            "took effect"
        } else {
            "was refused by the table: a larger fence wrote it"
        }
    );
    Ok(written)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let dir = std::env::temp_dir().join(format!("idem-fenced-writes-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let store = SqliteStore::open(dir.join("app.db")).await?;
    // The application's own table, here in the same file.
    let pool = store.pool().clone();
    sqlx::query(
        "CREATE TABLE payouts (order_id TEXT PRIMARY KEY, status TEXT NOT NULL,
                               sent_by TEXT, fence INTEGER NOT NULL DEFAULT 0)",
    )
    .execute(&pool)
    .await?;
    sqlx::query("INSERT INTO payouts (order_id, status) VALUES ('o-7', 'pending')")
        .execute(&pool)
        .await?;

    let lease = Duration::from_millis(300);
    let idem = Idem::builder()
        .store(store)
        .lease(lease)
        // Worker A runs to its end after losing its lease, so that its late write is tried.
        .lease_loss(LeaseLoss::Finish)
        .build()?;
    let key = Key::new("billing::payout", "o-7")?;

    let a = {
        let (idem, key, pool) = (idem.clone(), key.clone(), pool.clone());
        tokio::spawn(async move {
            idem.call(key, Fingerprint::NONE)
                .run_fallible(|| pay_out(&pool, "worker A", lease * 3))
                .await
        })
    };
    // A's lease ends while it is frozen; B takes the key over.
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    let b = idem
        .call(key.clone(), Fingerprint::NONE)
        .run_fallible(|| pay_out(&pool, "worker B", Duration::ZERO))
        .await?;
    assert!(b, "B's write took effect");

    match a.await? {
        Err(e) if matches!(e.downcast_ref::<Error>(), Some(Error::LeaseLost { .. })) => {
            println!("worker A: the store refused its result too: {e}")
        }
        other => panic!("worker A lost its lease, yet answered {other:?}"),
    }
    let (status, sent_by, fence): (String, String, i64) =
        sqlx::query_as("SELECT status, sent_by, fence FROM payouts WHERE order_id = 'o-7'")
            .fetch_one(&pool)
            .await?;
    println!("payouts: o-7 {status} by {sent_by} under fence {fence}");
    assert_eq!(
        sent_by, "worker B",
        "the stalled holder did not overwrite its successor"
    );

    drop((idem, pool));
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
