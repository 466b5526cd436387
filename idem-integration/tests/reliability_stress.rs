//! Stress, through `#[idempotent]`: 1000 concurrent callers over 100 keys, in reject and in
//! wait mode, with two `Idem` engines (two connections or pools) sharing one backend, on
//! memory, SQLite (one file), Postgres, Redis and Redis Cluster; and two OS processes
//! sharing one backend (SQLite file, Postgres, Redis). Each key's body runs exactly once,
//! every caller gets its key's value, and no key is left in progress.
//!
//! ```text
//! IDEM_REQUIRE_BACKENDS=1 IDEM_TEST_POSTGRES_URL=... IDEM_TEST_REDIS_URL=... \
//!     IDEM_TEST_REDIS_CLUSTER=... cargo test -p idem-integration --all-features --test reliability_stress
//! ```
#![cfg(all(
    feature = "sqlite",
    feature = "postgres",
    feature = "redis",
    feature = "redis-cluster"
))]

mod common;

use std::ffi::OsStr;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::testing::backend_url;
use idem::{idempotent, store::Record, Error, Idem, Key};

const CALLERS: usize = 1000;
const KEYS: usize = 100;
/// Scopes of these tests' own; every run's ids carry the run's name too.
const REJECT_SCOPE: &str = "reliability.stress.reject";
const WAIT_SCOPE: &str = "reliability.stress.wait";

/// Executions per key, counted in the body.
struct Runs(Vec<AtomicU32>);

impl Runs {
    fn new() -> Runs {
        Runs((0..KEYS).map(|_| AtomicU32::new(0)).collect())
    }
}

fn value_of(run: &str, k: usize) -> String {
    format!("{run}/value-{k}")
}

#[idempotent(key = id, store = idem, skip(idem, runs, k), scope = "reliability.stress.reject")]
async fn reject_mode(idem: &Idem, runs: &Runs, k: usize, id: String) -> String {
    runs.0[k].fetch_add(1, Ordering::SeqCst);
    // Long enough that most of the 10 callers per key arrive while it runs.
    tokio::time::sleep(Duration::from_millis(30)).await;
    id.replace("/k-", "/value-")
}

#[idempotent(key = id, store = idem, skip(idem, runs, k), scope = "reliability.stress.wait", in_progress = "wait", wait_timeout = "120s")]
async fn wait_mode(idem: &Idem, runs: &Runs, k: usize, id: String) -> String {
    runs.0[k].fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(30)).await;
    id.replace("/k-", "/value-")
}

fn id_of(run: &str, k: usize) -> String {
    format!("{run}/k-{k}")
}

/// An engine whose steps may queue behind 1000 callers on one pool or file: a generous
/// step timeout, so that a slow step is not mistaken for an outage here (the outage tests
/// bound it).
fn engine(store: Arc<dyn idem::store::Store>) -> Idem {
    Idem::builder()
        .shared_store(store)
        .store_timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// 1000 callers, caller `i` on key `i % 100` through engine `i % 2`, started together.
/// Reject mode: a caller told `InProgress` tries again after the hint, as a client would.
async fn stress(backend: &str, engines: [Idem; 2], wait: bool) {
    let run = common::run_name(backend);
    let engines = Arc::new(engines);
    let runs = Arc::new(Runs::new());
    let barrier = Arc::new(tokio::sync::Barrier::new(CALLERS));
    let rejected = Arc::new(AtomicU32::new(0));
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..CALLERS)
        .map(|i| {
            let (engines, runs, barrier, run, rejected) = (
                engines.clone(),
                runs.clone(),
                barrier.clone(),
                run.clone(),
                rejected.clone(),
            );
            tokio::spawn(async move {
                let k = i % KEYS;
                let idem = &engines[i % 2];
                barrier.wait().await;
                let v = if wait {
                    wait_mode(idem, &runs, k, id_of(&run, k)).await
                } else {
                    loop {
                        match reject_mode(idem, &runs, k, id_of(&run, k)).await {
                            Err(Error::InProgress { retry_after, .. }) => {
                                rejected.fetch_add(1, Ordering::SeqCst);
                                let pause = retry_after
                                    .clamp(Duration::from_millis(5), Duration::from_millis(50));
                                tokio::time::sleep(pause).await;
                            }
                            other => break other,
                        }
                    }
                };
                (k, v)
            })
        })
        .collect();
    let mut answers: HashMap<usize, u32> = HashMap::new();
    for t in tasks {
        let (k, v) = t.await.unwrap();
        let v = v.unwrap_or_else(|e| panic!("{backend}: a caller of key {k} got {e:?}"));
        assert_eq!(
            v,
            value_of(&run, k),
            "{backend}: a caller got another value"
        );
        *answers.entry(k).or_default() += 1;
    }
    let took = started.elapsed();
    assert_eq!(answers.len(), KEYS);
    assert!(answers.values().all(|n| *n as usize == CALLERS / KEYS));
    let runs: Vec<u32> = runs.0.iter().map(|n| n.load(Ordering::SeqCst)).collect();
    assert_eq!(
        runs,
        vec![1; KEYS],
        "{backend}: executions per key (wait mode: {wait})"
    );
    // Nothing left in progress: every key holds its completed record.
    let scope = if wait { WAIT_SCOPE } else { REJECT_SCOPE };
    for k in 0..KEYS {
        let key = Key::new(scope, id_of(&run, k)).unwrap();
        let rec = engines[0].store().get(&key).await.unwrap();
        assert!(
            matches!(rec, Some(Record::Completed { .. })),
            "{backend}: key {k} holds {rec:?} at the end"
        );
    }
    let mode = if wait { "wait" } else { "reject" };
    eprintln!(
        "reliability stress {backend} {mode}: {CALLERS} callers over {KEYS} keys, 2 engines, \
         {} executions, {} InProgress answers retried, {took:.1?}",
        KEYS,
        rejected.load(Ordering::SeqCst)
    );
}

async fn both_modes(backend: &str, make: impl Fn() -> [Idem; 2]) {
    stress(backend, make(), false).await;
    stress(backend, make(), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_stress_memory() {
    let store: Arc<dyn idem::store::Store> = Arc::new(idem::MemoryStore::new());
    both_modes("memory", || [engine(store.clone()), engine(store.clone())]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_stress_sqlite() {
    use idem::stores::SqliteStore;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stress.db");
    let a = SqliteStore::open(&path).await.unwrap();
    a.migrate().await.unwrap();
    let b = SqliteStore::open(&path).await.unwrap();
    let (a, b): (Arc<dyn idem::store::Store>, Arc<dyn idem::store::Store>) =
        (Arc::new(a), Arc::new(b));
    both_modes("sqlite", || [engine(a.clone()), engine(b.clone())]).await;
}

async fn two_postgres_pools(url: &str) -> [Arc<dyn idem::store::Store>; 2] {
    use idem::stores::PostgresStore;
    let a = PostgresStore::connect(url).await.unwrap();
    a.migrate().await.unwrap();
    let b = PostgresStore::connect(url).await.unwrap();
    [Arc::new(a), Arc::new(b)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_stress_postgres() {
    let Some(url) = backend_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let [a, b] = two_postgres_pools(&url).await;
    both_modes("postgres", || [engine(a.clone()), engine(b.clone())]).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_stress_mysql() {
    use idem::stores::MySqlStore;
    let Some(url) = backend_url("IDEM_TEST_MYSQL_URL") else {
        return;
    };
    let a = MySqlStore::connect(&url).await.unwrap();
    a.migrate().await.unwrap();
    let b = MySqlStore::connect(&url).await.unwrap();
    let (a, b): (Arc<dyn idem::store::Store>, Arc<dyn idem::store::Store>) =
        (Arc::new(a), Arc::new(b));
    both_modes("mysql", || [engine(a.clone()), engine(b.clone())]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_stress_redis() {
    use idem::stores::RedisStore;
    let Some(url) = backend_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    let a: Arc<dyn idem::store::Store> = Arc::new(RedisStore::open(&url).await.unwrap());
    let b: Arc<dyn idem::store::Store> = Arc::new(RedisStore::open(&url).await.unwrap());
    both_modes("redis", || [engine(a.clone()), engine(b.clone())]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_stress_redis_cluster() {
    let Some(spec) = backend_url("IDEM_TEST_REDIS_CLUSTER") else {
        return;
    };
    let url = if spec.starts_with("redis+cluster://") {
        spec
    } else {
        format!(
            "redis+cluster://{}",
            spec.replace("redis://", "").replace(' ', "")
        )
    };
    let a = idem::connect(&url).await.unwrap().store().clone();
    let b = idem::connect(&url).await.unwrap().store().clone();
    both_modes("redis-cluster", || [engine(a.clone()), engine(b.clone())]).await;
}

// --- two processes ------------------------------------------------------------------------

const CHILD_URL: &str = "IDEM_RELIABILITY_CHILD_URL";
const CHILD_RUN: &str = "IDEM_RELIABILITY_CHILD_RUN";
const CHILD_DIR: &str = "IDEM_RELIABILITY_CHILD_DIR";
/// Callers per process: two processes make the 1000.
const CHILD_CALLERS: usize = CALLERS / 2;

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

/// The child half of the two-process tests: does nothing unless one of them started it.
/// It announces itself in the shared directory, starts its callers only when the other
/// child has announced itself too, and prints each execution, each answer and the wall
/// clock of its first call's start and its last call's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_stress_child() {
    let Some((url, run, dir)) = common::child_env(CHILD_URL, CHILD_RUN, CHILD_DIR) else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let store = idem::connect(&url).await.unwrap().store().clone();
    let idem = Arc::new(engine(store));
    let pid = std::process::id();
    std::fs::write(dir.join(format!("ready-{pid}")), b"").unwrap();
    // A barrier across processes: both are connected before either calls.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::fs::read_dir(&dir).unwrap().count() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the other child never came"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let runs = Arc::new(Runs::new());
    let first_start = now_us();
    let tasks: Vec<_> = (0..CHILD_CALLERS)
        .map(|i| {
            let (idem, runs, run) = (idem.clone(), runs.clone(), run.clone());
            tokio::spawn(async move {
                let k = i % KEYS;
                let v = wait_mode(&idem, &runs, k, id_of(&run, k)).await.unwrap();
                println!("IDEM-ANSWER {k} {v}");
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let last_end = now_us();
    for (k, n) in runs.0.iter().enumerate() {
        for _ in 0..n.load(Ordering::SeqCst) {
            println!("IDEM-RAN {k}");
        }
    }
    println!("IDEM-SPAN {first_start} {last_end}");
}

/// Two processes, 500 callers each over the same 100 keys on the backend at `url`.
fn two_processes(backend: &str, url: &str) {
    let run = common::run_name(backend);
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Creates the table (or file) before the children race to.
    let idem = rt.block_on(idem::connect(url)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let children: Vec<_> = (0..2)
        .map(|_| {
            common::spawn_child(
                "reliability_stress_child",
                [
                    (CHILD_URL, OsStr::new(&url)),
                    (CHILD_RUN, OsStr::new(&run)),
                    (CHILD_DIR, OsStr::new(dir.path())),
                ],
                std::process::Stdio::piped(),
            )
        })
        .collect();
    let mut ran: HashMap<usize, u32> = HashMap::new();
    let mut answers: HashMap<usize, Vec<String>> = HashMap::new();
    let mut spans = Vec::new();
    let mut per_child = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{backend} child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut mine = 0;
        for line in stdout.lines() {
            // The harness prints `test reliability_stress_child ... ` before the first line.
            let line = line.find("IDEM-").map_or(line, |at| &line[at..]);
            let mut words = line.split(' ');
            match words.next() {
                Some("IDEM-RAN") => {
                    *ran.entry(words.next().unwrap().parse().unwrap())
                        .or_default() += 1;
                    mine += 1;
                }
                Some("IDEM-ANSWER") => {
                    let k: usize = words.next().unwrap().parse().unwrap();
                    answers
                        .entry(k)
                        .or_default()
                        .push(words.next().unwrap().to_owned());
                }
                Some("IDEM-SPAN") => {
                    let a: u128 = words.next().unwrap().parse().unwrap();
                    let b: u128 = words.next().unwrap().parse().unwrap();
                    spans.push((a, b));
                }
                _ => {}
            }
        }
        per_child.push(mine);
    }
    assert_eq!(spans.len(), 2, "{backend}: both children report their span");
    // The processes overlapped: each started calling before the other finished.
    let overlap = spans[0].1.min(spans[1].1) as i128 - spans[0].0.max(spans[1].0) as i128;
    assert!(
        overlap > 0,
        "{backend}: the two processes ran one after the other: {spans:?}"
    );
    assert_eq!(ran.len(), KEYS, "{backend}: every key ran: {ran:?}");
    assert!(
        ran.values().all(|n| *n == 1),
        "{backend}: a key ran more than once across the processes: {ran:?}"
    );
    for k in 0..KEYS {
        let vs = &answers[&k];
        assert_eq!(vs.len(), CHILD_CALLERS * 2 / KEYS, "{backend}: key {k}");
        assert!(
            vs.iter().all(|v| *v == value_of(&run, k)),
            "{backend}: key {k} answered {vs:?}"
        );
    }
    // Nothing left in progress, seen from a third connection.
    rt.block_on(async {
        for k in 0..KEYS {
            let key = Key::new(WAIT_SCOPE, id_of(&run, k)).unwrap();
            let rec = idem.store().get(&key).await.unwrap();
            assert!(
                matches!(rec, Some(Record::Completed { .. })),
                "{backend}: key {k} holds {rec:?} after both processes"
            );
        }
    });
    eprintln!(
        "reliability stress {backend} two processes: executions per process {per_child:?}, \
         overlap {:.1} ms",
        overlap as f64 / 1000.0
    );
}

#[test]
fn reliability_stress_two_processes_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("two.db").display());
    two_processes("sqlite", &url);
}

#[test]
fn reliability_stress_two_processes_postgres() {
    let Some(url) = backend_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    two_processes("postgres", &url);
}

#[cfg(feature = "mysql")]
#[test]
fn reliability_stress_two_processes_mysql() {
    let Some(url) = backend_url("IDEM_TEST_MYSQL_URL") else {
        return;
    };
    two_processes("mysql", &url);
}

#[test]
fn reliability_stress_two_processes_redis() {
    let Some(url) = backend_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    two_processes("redis", &url);
}
