//! Instruction counts of the remote replays on the client, under valgrind's callgrind:
//! what idem's replay costs the client's CPU beside the hand-written check on the same
//! client, in figures that repeat whatever else the machine (and the server) does.
//!
//! ```sh
//! IDEM_TEST_REDIS_URL=redis://127.0.0.1:6379 \
//! IDEM_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test \
//! IDEM_TEST_MYSQL_URL=mysql://root@127.0.0.1:3306/test \
//!     cargo bench -p idem-integration --features redis,postgres,mysql --bench remote_instructions
//! ```
//!
//! The pairs are `benches/remote.rs`'s (`support/remote_pairs.rs`): one caller replaying
//! the stored orders, on a current-thread runtime. Callgrind counts the client process
//! only, so the server's work and the network's wait are not in these figures; a round
//! trip's client side (the driver, the runtime's wait for the socket) is, on both sides.
//! A backend whose variable is unset is left out, with a line saying so.

use std::future::Future;
use std::hint::black_box;

#[path = "support/callgrind.rs"]
mod callgrind;
#[path = "support/remote_pairs.rs"]
#[allow(dead_code)] // the first-call sides, which `benches/remote.rs` times
mod remote_pairs;
mod support;

use remote_pairs::{
    cleanup_mysql, cleanup_postgres, cleanup_redis, my_charge, my_charge_by_hand, pg_charge,
    pg_charge_by_hand, redis_charge, redis_charge_by_hand, setup_mysql, setup_postgres,
    setup_redis, STORED,
};
use support::{request, ChargeRequest, Receipt};

fn main() {
    if let Some((case, calls)) = callgrind::child() {
        run_case(&case, calls);
        return;
    }
    let mut cases = Vec::new();
    for (backend, var) in [
        ("redis_replay", "IDEM_TEST_REDIS_URL"),
        ("postgres_replay", "IDEM_TEST_POSTGRES_URL"),
        ("mysql_replay", "IDEM_TEST_MYSQL_URL"),
    ] {
        if std::env::var_os(var).is_none() {
            eprintln!("skipped: {backend}, since {var} is not set");
            continue;
        }
        cases.extend([(backend, "baseline"), (backend, "idem")]);
    }
    callgrind::measure(&cases);
}

/// In a child: sets up the case's backend (its tables or key prefix, and the stored
/// orders on both sides), makes `calls` replays of one side, and removes what it set up.
fn run_case(case: &str, calls: u64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    let (backend, side) = case.split_once('/').expect("a group/side case");
    let idem = side == "idem";
    rt.block_on(async {
        match backend {
            "redis_replay" => {
                let prefix = setup_redis(&std::process::id().to_string())
                    .await
                    .expect("Redis is set up");
                replays(calls, idem, redis_charge, redis_charge_by_hand).await;
                cleanup_redis(&prefix).await;
            }
            "postgres_replay" => {
                let tables = setup_postgres().await.expect("Postgres is set up");
                replays(calls, idem, pg_charge, pg_charge_by_hand).await;
                cleanup_postgres(&tables).await;
            }
            "mysql_replay" => {
                let tables = setup_mysql().await.expect("MySQL is set up");
                replays(calls, idem, my_charge, my_charge_by_hand).await;
                cleanup_mysql(&tables).await;
            }
            other => panic!("unknown case {other}"),
        }
    });
}

/// `calls` replays of the stored orders in turn, by the idem side or the hand-written one.
async fn replays<I, IF, B, BF>(calls: u64, idem: bool, by_idem: I, by_hand: B)
where
    I: Fn(ChargeRequest) -> IF,
    IF: Future<Output = Result<Receipt, idem::Error>>,
    B: Fn(ChargeRequest) -> BF,
    BF: Future<Output = Receipt>,
{
    let requests: Vec<_> = (0..STORED).map(request).collect();
    for i in 0..calls {
        let req = requests[(i % STORED) as usize].clone();
        black_box(if idem {
            by_idem(req).await.expect("a replay")
        } else {
            by_hand(req).await
        });
    }
}
