//! At-most-once steps (`Step::at_most_once`) and calls (`Call::at_most_once`) on every
//! store: a process killed (SIGKILL) inside such a step or body leaves its key held, and the
//! retry runs it no second time; the same crash inside an ordinary step is run again by the
//! retry (what the mode is for).
//!
//! A child process (this test binary started again with `IDEM_AMO_URL` set: the test
//! `at_most_once_crash_child`) sends two emails, each in a step of its own call, records
//! each send in a file, says so, and hangs inside the step; the parent kills it there.
//! Servers come from `IDEM_TEST_*` as in `reliability_steps.rs`.

mod common;

use std::ffi::OsStr;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::testing::backend_url;
use idem::{
    steps::Resolution, steps::Resolved, steps::Step, Error, Fingerprint, Idem, InProgress, Key,
};

const SCOPE: &str = "steps.at_most_once";
const LEASE: Duration = Duration::from_secs(2);
const URL_VAR: &str = "IDEM_AMO_URL";
const RUN_VAR: &str = "IDEM_AMO_RUN";
const DIR_VAR: &str = "IDEM_AMO_DIR";
const SENT: &str = "IDEM-AMO-SENT";

fn key(run: &str, mode: &str) -> Key {
    Key::new(SCOPE, format!("{run}-{mode}")).unwrap()
}

fn engine(store: std::sync::Arc<dyn idem::store::Store>) -> Idem {
    Idem::builder()
        .shared_store(store)
        .lease(LEASE)
        .in_progress(InProgress::Wait)
        .wait_timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// The emails sent for a key, one line each, in a file that outlives the process.
fn sent(dir: &Path, k: &Key) -> usize {
    std::fs::read_to_string(outbox(dir, k))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn outbox(dir: &Path, k: &Key) -> PathBuf {
    dir.join(format!("{}.sent", k.id()))
}

/// A whole call at most once (no step): its body sends, then `hang` stops it there.
async fn send_call(idem: &Idem, k: &Key, dir: &Path, hang: bool) -> Result<String, Error> {
    let (k2, dir) = (k.clone(), dir.to_owned());
    idem.call(k.clone(), Fingerprint::NONE)
        .at_most_once()
        .run_fallible(move || async move {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(outbox(&dir, &k2))
                .unwrap();
            f.write_all(b"sent\n").unwrap();
            f.sync_all().unwrap();
            if hang {
                println!("{SENT} {}", k2.id());
                std::future::pending::<()>().await;
            }
            Ok::<_, Error>(String::from("msg_1"))
        })
        .await
}

/// The call: one step, `email`, at most once or not; `hang` stops inside it, after the send.
async fn send(
    idem: &Idem,
    k: &Key,
    dir: &Path,
    at_most_once: bool,
    hang: bool,
) -> Result<String, Error> {
    let (k2, dir) = (k.clone(), dir.to_owned());
    idem.call(k.clone(), Fingerprint::NONE)
        .run_fallible(move || async move {
            let step = match at_most_once {
                true => Step::new("email").at_most_once(),
                false => Step::new("email"),
            };
            step.run(|| async move {
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(outbox(&dir, &k2))
                    .unwrap();
                f.write_all(b"sent\n").unwrap();
                f.sync_all().unwrap();
                if hang {
                    println!("{SENT} {}", k2.id());
                    std::future::pending::<()>().await;
                }
                Ok::<_, Error>(String::from("msg_1"))
            })
            .await
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_once_crash_child() {
    let Some((url, run, dir)) = common::child_env(URL_VAR, RUN_VAR, DIR_VAR) else {
        return;
    };
    let idem = engine(idem::stores::connect(&url).await.unwrap());
    let dir = PathBuf::from(dir);
    let (a, b, c) = (
        key(&run, "at-most-once"),
        key(&run, "plain"),
        key(&run, "call"),
    );
    let _ = tokio::join!(
        send(&idem, &a, &dir, true, true),
        send(&idem, &b, &dir, false, true),
        send_call(&idem, &c, &dir, true)
    );
    panic!("the calls ended instead of hanging");
}

fn unique() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{nanos:x}", std::process::id())
}

async fn killed_inside_the_step(url: Option<String>, backend: &str) {
    let Some(url) = url else { return };
    let dir = tempfile::tempdir().unwrap();
    let run = unique();
    let mut child = common::spawn_child(
        "at_most_once_crash_child",
        [
            (URL_VAR, OsStr::new(&url)),
            (RUN_VAR, OsStr::new(&run)),
            (DIR_VAR, OsStr::new(dir.path())),
        ],
        Stdio::null(),
    );
    let stdout = child.stdout.take().unwrap();
    let reached = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .filter(|l| l.contains(SENT))
            .take(3)
            .count()
    })
    .await
    .unwrap();
    child.kill().unwrap(); // SIGKILL: no destructor runs, nothing is released.
    let _ = child.wait();
    assert_eq!(
        reached, 3,
        "{backend}: the child did not reach its three sends"
    );

    let idem = engine(idem::stores::connect(&url).await.unwrap());
    let (a, b) = (key(&run, "at-most-once"), key(&run, "plain"));
    // The ordinary step is run again by the retry, once the dead holder's lease ends.
    assert_eq!(
        send(&idem, &b, dir.path(), false, false).await.unwrap(),
        "msg_1"
    );
    assert_eq!(sent(dir.path(), &b), 2, "{backend}: the plain step's retry");
    // The at-most-once step is not: the key is held.
    for _ in 0..2 {
        let out = send(&idem, &a, dir.path(), true, false).await;
        assert!(
            matches!(&out, Err(Error::OutcomeUnknown { step, .. }) if step == "email"),
            "{backend}: {out:?}"
        );
    }
    assert_eq!(
        sent(dir.path(), &a),
        1,
        "{backend}: the at-most-once step ran again"
    );
    let resolved = idem
        .resolve(&a, "email", Resolution::ran("msg_0").unwrap())
        .await
        .unwrap();
    assert_eq!(resolved, Resolved::Resolved, "{backend}");
    assert_eq!(
        send(&idem, &a, dir.path(), true, false).await.unwrap(),
        "msg_0"
    );
    assert_eq!(
        sent(dir.path(), &a),
        1,
        "{backend}: sent again after its resolution"
    );
    // A whole call at most once: its body is not run again either.
    let c = key(&run, "call");
    let out = send_call(&idem, &c, dir.path(), false).await;
    assert!(
        matches!(&out, Err(Error::OutcomeUnknown { step, .. }) if step == "call"),
        "{backend}: {out:?}"
    );
    assert_eq!(
        sent(dir.path(), &c),
        1,
        "{backend}: the at-most-once body ran again"
    );
    idem.resolve(&c, "call", Resolution::ran("msg_0").unwrap())
        .await
        .unwrap();
    for _ in 0..2 {
        assert_eq!(
            send_call(&idem, &c, dir.path(), false).await.unwrap(),
            "msg_0"
        );
    }
    assert_eq!(sent(dir.path(), &c), 1, "{backend}: the resolved body ran");
    eprintln!("at_most_once {backend}: SIGKILL inside the step and inside the body: the plain step ran twice, the at-most-once step and body once each and held their keys until resolved");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_once_sqlite_sigkill_inside_a_step_and_a_body() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("amo.db").display());
    killed_inside_the_step(Some(url), "sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_once_postgres_sigkill_inside_a_step_and_a_body() {
    killed_inside_the_step(backend_url("IDEM_TEST_POSTGRES_URL"), "postgres").await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_once_mysql_sigkill_inside_a_step_and_a_body() {
    killed_inside_the_step(backend_url("IDEM_TEST_MYSQL_URL"), "mysql").await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_once_redis_sigkill_inside_a_step_and_a_body() {
    killed_inside_the_step(backend_url("IDEM_TEST_REDIS_URL"), "redis").await;
}

#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_once_redis_cluster_sigkill_inside_a_step_and_a_body() {
    killed_inside_the_step(backend_url("IDEM_TEST_REDIS_CLUSTER"), "redis-cluster").await;
}
