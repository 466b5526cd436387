//! What the consumer tests (`consumer_rabbitmq.rs`, `consumer_jetstream.rs`) and the crash
//! tests' child processes share.
// Each test crate that includes this module uses a part of it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A name no other run shares: the time, the process and a counter.
pub fn run_id() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis();
    format!(
        "{ms:x}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A crash test's child process reads the store's URL, the run and the shared directory from
/// the variables `url`, `run` and `dir`; `None` when one is unset: a normal test run.
pub fn child_env(url: &str, run: &str, dir: &str) -> Option<(String, String, String)> {
    let var = |name: &str| std::env::var(name).ok();
    Some((var(url)?, var(run)?, var(dir)?))
}

/// This test binary again, running only the test `test`, with the variables `env`: its
/// stdout piped, its stderr as `stderr` says.
pub fn spawn_child(
    test: &str,
    env: [(&str, &std::ffi::OsStr); 3],
    stderr: std::process::Stdio,
) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .envs(env)
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

/// A run's name: `backend`, the process and the time.
pub fn run_name(backend: &str) -> String {
    let nanos = std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos();
    format!("{backend}-{}-{nanos:x}", std::process::id())
}
