//! The callgrind harness of the instruction-count benches: each case runs in this bench's
//! own binary again, as a child under `valgrind --tool=callgrind`, making `n` calls of the
//! case for two values of `n`; the difference of the two totals divided by the difference
//! of the counts is the cost of one call, with the process's start, the set-up and the
//! first call taken out.

use std::path::Path;
use std::process::Command;

/// The two call counts whose difference is measured.
const FEW: u64 = 200;
const MANY: u64 = 1_200;

const CHILD_CASE: &str = "IDEM_INSTRUCTIONS_CASE";
const CHILD_CALLS: &str = "IDEM_INSTRUCTIONS_CALLS";

/// In a child: the case it is to run and how many calls to make.
pub fn child() -> Option<(String, u64)> {
    let (case, calls) = (
        std::env::var(CHILD_CASE).ok()?,
        std::env::var(CHILD_CALLS).ok()?,
    );
    Some((case, calls.parse().expect("a call count")))
}

/// Counts each `(group, side)` case with `FEW` and `MANY` calls and prints the table of
/// instructions per call, each side beside its group's `baseline`. Does nothing when the
/// bench is not run with `--bench` (`cargo test --benches`), or without valgrind.
pub fn measure(cases: &[(&str, &str)]) {
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
    for &(group, side) in cases {
        let case = format!("{group}/{side}");
        let fewer = instructions(&exe, dir.path(), &case, FEW);
        let more = instructions(&exe, dir.path(), &case, MANY);
        let each = more.saturating_sub(fewer) as f64 / (MANY - FEW) as f64;
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
fn instructions(exe: &Path, dir: &Path, case: &str, calls: u64) -> u64 {
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
