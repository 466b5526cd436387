//! Instruction counts of the memory pairs, under valgrind's callgrind: figures that repeat
//! for the same binary whatever else the machine does, beside criterion's times (which a
//! loaded machine moves).
//!
//! `cargo bench -p idem-integration --bench instructions`
//!
//! The bench runs itself again under `valgrind --tool=callgrind` once per case and count:
//! each child makes `n` calls of one case on a current-thread runtime, for two values of
//! `n`, and the difference of the two totals divided by the difference of the counts is the
//! cost of one call, with the process's start, the runtime and the first call taken out.
//! Both sides are the functions `benches/memory.rs` times: the attribute as users write it
//! on a 4-field request, and the hand-written `DashMap` plus JSON check. Without valgrind
//! the bench says so and measures nothing.

use std::sync::atomic::{AtomicU64, Ordering};

use idem::{Idem, MemoryStore};
#[path = "support/callgrind.rs"]
mod callgrind;
#[path = "support/memory_pair.rs"]
mod memory_pair;
mod support;

use memory_pair::{charge, charge_by_hand, charge_by_hand_checked, charge_unchecked};
use support::request;

/// Each case: (group, side). The idem side of a group is compared with its `baseline`.
const CASES: &[(&str, &str)] = &[
    ("memory_replay", "baseline"),
    ("memory_replay", "idem"),
    ("memory_replay", "idem_fingerprint_none"),
    ("memory_replay_checked", "baseline"),
    ("memory_replay_checked", "idem"),
    ("memory_first_call", "baseline"),
    ("memory_first_call", "idem"),
];

fn main() {
    if let Some((case, calls)) = callgrind::child() {
        run_case(&case, calls);
        return;
    }
    callgrind::measure(CASES);
}

fn run_case(case: &str, calls: u64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    let _ = idem::set_global(Idem::new(MemoryStore::new()));
    let req = request(42);
    let next = AtomicU64::new(1_000_000);
    let fresh = || request(next.fetch_add(1, Ordering::Relaxed));
    rt.block_on(async {
        // The first call of each side, outside what the two counts differ by.
        charge(req.clone()).await.expect("the first call");
        charge_unchecked(req.clone()).await.expect("the first call");
        charge_by_hand(req.clone()).await;
        charge_by_hand_checked(req.clone())
            .await
            .expect("the first call");
        for _ in 0..calls {
            let out = match case {
                "memory_replay/baseline" => charge_by_hand(req.clone()).await,
                "memory_replay/idem" => charge(req.clone()).await.expect("a replay"),
                "memory_replay/idem_fingerprint_none" => {
                    charge_unchecked(req.clone()).await.expect("a replay")
                }
                "memory_replay_checked/baseline" => {
                    charge_by_hand_checked(req.clone()).await.expect("a replay")
                }
                "memory_replay_checked/idem" => charge(req.clone()).await.expect("a replay"),
                "memory_first_call/baseline" => charge_by_hand(fresh()).await,
                "memory_first_call/idem" => charge(fresh()).await.expect("a first call"),
                other => panic!("unknown case {other}"),
            };
            std::hint::black_box(out);
        }
    });
}
