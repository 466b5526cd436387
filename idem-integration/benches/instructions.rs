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

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use idem::{Idem, MemoryStore};
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

/// The two call counts whose difference is measured.
const FEW: u64 = 200;
const MANY: u64 = 1_200;

const CHILD_CASE: &str = "IDEM_INSTRUCTIONS_CASE";
const CHILD_CALLS: &str = "IDEM_INSTRUCTIONS_CALLS";

fn main() {
    if let (Ok(case), Ok(calls)) = (std::env::var(CHILD_CASE), std::env::var(CHILD_CALLS)) {
        let calls: u64 = calls.parse().expect("a call count");
        run_case(&case, calls);
        return;
    }
    // `cargo test --benches` runs bench targets without `--bench`: nothing to measure then.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if Command::new("valgrind").arg("--version").output().is_err() {
        eprintln!("skipped: valgrind is not installed, so no instruction counts");
        return;
    }
    let exe = std::env::current_exe().expect("this bench's path");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut per_call = Vec::new();
    for &(group, side) in CASES {
        let case = format!("{group}/{side}");
        let few = instructions(&exe, dir.path(), &case, FEW);
        let many = instructions(&exe, dir.path(), &case, MANY);
        let each = many.saturating_sub(few) as f64 / (MANY - FEW) as f64;
        per_call.push((group, side, each));
    }
    println!("instructions per call (callgrind Ir, {FEW} and {MANY} calls):");
    println!("| group | side | instructions | idem / baseline |");
    println!("|---|---|---|---|");
    for &(group, side, each) in &per_call {
        let baseline = per_call
            .iter()
            .find(|(g, s, _)| *g == group && *s == "baseline")
            .map(|(_, _, b)| *b)
            .expect("every group has a baseline");
        let ratio = if side == "baseline" {
            "-".to_string()
        } else {
            format!("{:.2}x", each / baseline)
        };
        println!("| {group} | {side} | {each:.0} | {ratio} |");
    }
}

/// The total instructions of a child making `calls` calls of `case`, under callgrind.
fn instructions(exe: &std::path::Path, dir: &std::path::Path, case: &str, calls: u64) -> u64 {
    let out_file = dir.join(format!("{}-{calls}.out", case.replace('/', "-")));
    let status = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg(exe)
        .env(CHILD_CASE, case)
        .env(CHILD_CALLS, calls.to_string())
        .output()
        .expect("run valgrind");
    assert!(
        status.status.success(),
        "callgrind on {case}: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let text = std::fs::read_to_string(&out_file).expect("callgrind's output file");
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|n| n.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no summary line in {}", out_file.display()))
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
