//! Steps inside one call, on every store: a body of three steps (`charge`,
//! `reserve`, `email`) whose side effects are counted in files, so that a count outlives
//! the process that made it.
//!
//! - A child process (this test binary started again with `IDEM_STEPS_CRASH_URL` set:
//!   the test `reliability_steps_crash_child`) runs six calls, each stopped at one of the
//!   six boundaries (inside each step before its side effect, with the step's record
//!   claimed; and after each step, its record completed), and is killed with SIGKILL
//!   there. Once the leases end, the parent's retries finish every call, and each side
//!   effect happened once.
//! - An `Err` and a panic at each boundary, in process: the retry finishes, each side
//!   effect once.
//! - 100 concurrent callers of one key, whose first six bodies fail (so the key passes from
//!   caller to caller, each replaying the steps done): each step once, one answer for all.
//! - A holder whose lease ended while it ran on (`LeaseLoss::Finish`, its extends failing)
//!   goes on after its successor finished the call and deleted the step records: it runs
//!   no step again.
//! - A step whose outcome is unknown holds the key (later calls answer `OutcomeUnknown`
//!   and run nothing) until `Idem::resolve` or the reconcile hook settles it.
//!
//! Memory has no crash test (its records die with the process). Servers come from
//! `IDEM_TEST_POSTGRES_URL`, `IDEM_TEST_MYSQL_URL`, `IDEM_TEST_REDIS_URL` and
//! `IDEM_TEST_REDIS_CLUSTER` (skipped when unset, failed with `IDEM_REQUIRE_BACKENDS=1`):
//!
//! ```text
//! IDEM_REQUIRE_BACKENDS=1 IDEM_TEST_POSTGRES_URL=... IDEM_TEST_MYSQL_URL=... \
//!   IDEM_TEST_REDIS_URL=... IDEM_TEST_REDIS_CLUSTER=redis+cluster://h1:p1,h2:p2,h3:p3 \
//!   cargo test -p idem-integration --all-features --test reliability_steps
//! ```

mod common;

use std::ffi::OsStr;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;
use futures_util::FutureExt;
use idem::testing::backend_url;
use idem::{
    steps::Resolution, steps::Resolved, steps::Step, steps::Unresolved, store::Record,
    store::Store, store::StoreError, store::StoreWrapper, store::Token, Error, Fingerprint, Idem,
    InProgress, Key, LeaseLoss,
};

const SCOPE: &str = "steps.every_store";
/// The lease of a call (and of its steps) that crashes: what a retry waits out.
const LEASE: Duration = Duration::from_secs(2);
/// A lease that does not end within a test, where no takeover is wanted.
const LONG_LEASE: Duration = Duration::from_secs(60);
/// How long a caller waits for another's claim: far more than a lease, on a loaded machine.
const WAIT: Duration = Duration::from_secs(90);
/// How long a test waits for something to happen before it fails.
const PATIENCE: Duration = Duration::from_secs(60);

const STEPS: [&str; 3] = ["charge", "reserve", "email"];

const URL_VAR: &str = "IDEM_STEPS_CRASH_URL";
const RUN_VAR: &str = "IDEM_STEPS_CRASH_RUN";
const DIR_VAR: &str = "IDEM_STEPS_CRASH_DIR";
/// What a child prints when one of its calls reached its boundary.
const AT: &str = "IDEM-STEPS-AT ";

/// Where in the body a fault strikes: inside step `i` before its side effect (the step's
/// record is claimed), or after step `i` returned (its record is completed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Boundary {
    Before(usize),
    After(usize),
}

const BOUNDARIES: [Boundary; 6] = [
    Boundary::Before(0),
    Boundary::After(0),
    Boundary::Before(1),
    Boundary::After(1),
    Boundary::Before(2),
    Boundary::After(2),
];

impl Boundary {
    fn tag(self) -> String {
        match self {
            Boundary::Before(i) => format!("before-{}", STEPS[i]),
            Boundary::After(i) => format!("after-{}", STEPS[i]),
        }
    }

    /// How many steps' side effects happened when a body stopped here.
    fn done(self) -> usize {
        match self {
            Boundary::Before(i) => i,
            Boundary::After(i) => i + 1,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Print the marker and hang, to be killed.
    Hang,
    /// Return an error.
    Err,
    Panic,
    /// Fail in a way `reserve` calls ambiguous (only inside `reserve`).
    Ambiguous,
    /// Say so (`notify_one`) on the first gate, then wait on the second, and go on.
    Stall(&'static tokio::sync::Notify, &'static tokio::sync::Notify),
}

/// A body's fault, if any; a pause inside each step before its side effect; and failures
/// shared by every caller of a key (see [`FLAKY`]).
#[derive(Debug, Clone, Copy)]
struct Plan {
    fault: Option<(Boundary, Fault)>,
    pause: Duration,
    flaky: Option<&'static AtomicU32>,
}

const CLEAN: Plan = Plan {
    fault: None,
    pause: Duration::ZERO,
    flaky: None,
};

fn at(boundary: Boundary, fault: Fault) -> Plan {
    Plan {
        fault: Some((boundary, fault)),
        ..CLEAN
    }
}

/// The failures a flaky plan's counter starts with: the bodies of a key, whichever caller
/// runs them, return an `Err` after `charge` twice, then after `reserve` twice, then after
/// `email` twice; the seventh body succeeds.
const FLAKY: u32 = 6;

/// Whether a body of a flaky plan fails after step `i`: it takes one of the failures left.
fn flaky_fails(plan: Plan, i: usize) -> bool {
    let Some(left) = plan.flaky else {
        return false;
    };
    let n = left.load(SeqCst);
    n > 0
        && (FLAKY - n) as usize / 2 == i
        && left.compare_exchange(n, n - 1, SeqCst, SeqCst).is_ok()
}

#[derive(Debug)]
enum Fail {
    Injected(Boundary),
    Ambiguous,
    Idem(Error),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Fail::Idem(e)
    }
}

/// The side effects of one key's steps: a line `<step> <value>` per run of a step (and a
/// line `<step>.entered <step key>` each time its closure is entered), in a file that
/// outlives the process that wrote it.
#[derive(Clone)]
struct Effects(PathBuf);

impl Effects {
    fn new(dir: &Path, id: &str) -> Effects {
        Effects(dir.join(format!("{id}.effects")))
    }

    fn record(&self, step: &str, value: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.0)
            .unwrap();
        // One write: lines of concurrent writers do not interleave.
        f.write_all(format!("{step} {value}\n").as_bytes()).unwrap();
        f.sync_all().unwrap();
    }

    fn lines(&self) -> Vec<(String, String)> {
        match std::fs::read_to_string(&self.0) {
            Ok(text) => text
                .lines()
                .map(|l| {
                    let (s, v) = l.split_once(' ').expect("a line is `step value`");
                    (s.to_owned(), v.to_owned())
                })
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => panic!("{:?}: {e}", self.0),
        }
    }

    /// The values step `step` produced, one per run, in order.
    fn runs(&self, step: &str) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|(s, _)| s == step)
            .map(|(_, v)| v)
            .collect()
    }

    /// How many times each step ran.
    fn counts(&self) -> [usize; 3] {
        STEPS.map(|s| self.runs(s).len())
    }

    /// The step keys step `step` handed on, one per time its closure was entered.
    fn entered(&self, step: &str) -> Vec<String> {
        self.runs(&format!("{step}.entered"))
    }

    /// The value of each step that ran exactly once; panics otherwise.
    fn once_each(&self, what: &str) -> Vec<String> {
        STEPS
            .iter()
            .map(|s| {
                let runs = self.runs(s);
                assert_eq!(
                    runs.len(),
                    1,
                    "{what}: `{s}` ran {} times: {runs:?}",
                    runs.len()
                );
                runs[0].clone()
            })
            .collect()
    }
}

static UNIQUE: AtomicU64 = AtomicU64::new(0);

/// Unique across processes, runs and calls: the databases are shared and keep their rows.
fn unique(label: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{label}-{}-{nanos:x}-{}",
        std::process::id(),
        UNIQUE.fetch_add(1, SeqCst)
    )
}

/// The injected panics, without their messages and backtraces in the test's output.
fn quiet_injected_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let injected = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|m| m.starts_with("injected panic"));
            if !injected {
                default(info);
            }
        }));
    });
}

async fn strike(plan: Plan, here: Boundary, key: &Key) -> Result<(), Fail> {
    let Some((boundary, fault)) = plan.fault else {
        return Ok(());
    };
    if boundary != here {
        return Ok(());
    }
    match fault {
        Fault::Err => Err(Fail::Injected(here)),
        Fault::Panic => panic!("injected panic at {here:?}"),
        Fault::Ambiguous => Err(Fail::Ambiguous),
        Fault::Stall(stalled, go_on) => {
            stalled.notify_one();
            go_on.notified().await;
            Ok(())
        }
        Fault::Hang => {
            println!("{AT}{}", key.id());
            std::io::stdout().flush().unwrap();
            // Killed here. A child nobody kills ends on its own, so a parent reading its
            // output is never stuck.
            tokio::time::sleep(Duration::from_secs(180)).await;
            std::process::exit(3);
        }
    }
}

/// The checkout: `charge`, `reserve` (an error `Fail::Ambiguous` leaves its outcome
/// unknown), `email`, each recording its side effect and returning a value made for that
/// run; the receipt is the three values. `bodies` counts the body's runs.
async fn checkout(
    idem: &Idem,
    key: &Key,
    effects: &Effects,
    plan: Plan,
    bodies: &AtomicU32,
) -> Result<Vec<String>, Fail> {
    idem.call(key.clone(), Fingerprint::NONE)
        .run_fallible(|| async move {
            bodies.fetch_add(1, SeqCst);
            let mut receipt = Vec::new();
            for (i, name) in STEPS.into_iter().enumerate() {
                let effect = || async move {
                    // Entered: with the key the step hands on to the system it calls.
                    effects.record(&format!("{name}.entered"), &idem::steps::step_key(name)?);
                    strike(plan, Boundary::Before(i), key).await?;
                    if !plan.pause.is_zero() {
                        tokio::time::sleep(plan.pause).await;
                    }
                    let value = unique(name);
                    effects.record(name, &value);
                    Ok::<_, Fail>(value)
                };
                let value = if name == "reserve" {
                    Step::new(name)
                        .unknown_if(|e: &Fail| matches!(e, Fail::Ambiguous))
                        .run(effect)
                        .await?
                } else {
                    idem::step(name, effect).await?
                };
                receipt.push(value);
                strike(plan, Boundary::After(i), key).await?;
                if flaky_fails(plan, i) {
                    return Err(Fail::Injected(Boundary::After(i)));
                }
            }
            Ok(receipt)
        })
        .await
}

// --- the stores ------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
#[cfg_attr(
    not(all(feature = "mysql", feature = "redis", feature = "redis-cluster")),
    allow(dead_code)
)]
enum Backend {
    Memory,
    Sqlite,
    Postgres,
    Mysql,
    Redis,
    RedisCluster,
}

/// The backend's URL (SQLite's in `dir`), or `None`: skipped (see `backend_url`).
fn url(backend: Backend, dir: &Path) -> Option<String> {
    match backend {
        Backend::Memory => Some("memory://".into()),
        Backend::Sqlite => Some(format!("sqlite://{}", dir.join("steps.db").display())),
        Backend::Postgres => backend_url("IDEM_TEST_POSTGRES_URL"),
        Backend::Mysql => backend_url("IDEM_TEST_MYSQL_URL"),
        Backend::Redis => backend_url("IDEM_TEST_REDIS_URL"),
        Backend::RedisCluster => backend_url("IDEM_TEST_REDIS_CLUSTER"),
    }
}

async fn open(url: &str) -> Arc<dyn Store> {
    idem::stores::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"))
}

/// An engine on `store` whose calls wait for each other.
fn engine(store: Arc<dyn Store>, lease: Duration) -> Idem {
    Idem::builder()
        .shared_store(store)
        .lease(lease)
        .in_progress(InProgress::Wait)
        .wait_timeout(WAIT)
        .build()
        .unwrap()
}

fn key(id: &str) -> Key {
    Key::new(SCOPE, id).unwrap()
}

/// Waits until the step records of `key` are gone: deleted in the background once the
/// call's result is stored.
async fn step_records_go(store: &dyn Store, key: &Key, what: &str) {
    let deadline = Instant::now() + PATIENCE;
    for step in STEPS {
        let record = key.step(step).unwrap();
        loop {
            match store.get(&record).await.unwrap() {
                None => break,
                Some(r) if Instant::now() >= deadline => {
                    panic!("{what}: the record of `{step}` is still there: {r:?}")
                }
                Some(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

/// After a call of `key` finished: each step ran once, the receipt is the values those
/// runs made, later calls replay it without running the body, and the step records go.
async fn finished_once(idem: &Idem, key: &Key, effects: &Effects, receipt: &[String], what: &str) {
    assert_eq!(receipt, effects.once_each(what), "{what}: the receipt");
    let bodies = AtomicU32::new(0);
    let again = checkout(idem, key, effects, CLEAN, &bodies).await;
    assert_eq!(again.ok().as_deref(), Some(receipt), "{what}: the replay");
    assert_eq!(bodies.load(SeqCst), 0, "{what}: a replay ran the body");
    effects.once_each(what);
    step_records_go(&**idem.store(), key, what).await;
}

// --- 1. SIGKILL at each boundary ---------------------------------------------------------

/// The child: one call per boundary, all at once, each hanging at its boundary (the parent
/// kills the process once every one has said so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_steps_crash_child() {
    let Some((url, run, dir)) = common::child_env(URL_VAR, RUN_VAR, DIR_VAR) else {
        return;
    };
    let idem = engine(open(&url).await, LEASE);
    let bodies = AtomicU32::new(0);
    let calls = BOUNDARIES.map(|b| {
        let id = format!("{run}-{}", b.tag());
        let (idem, bodies) = (&idem, &bodies);
        let effects = Effects::new(Path::new(&dir), &id);
        async move {
            let out = checkout(idem, &key(&id), &effects, at(b, Fault::Hang), bodies).await;
            panic!("{id}: the call ended instead of hanging: {out:?}");
        }
    });
    join_all(calls).await;
}

async fn killed_at_each_boundary(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let Some(url) = url(backend, dir.path()) else {
        return;
    };
    let started = Instant::now();
    let run = unique(&format!("{backend:?}-crash"));
    let mut child = common::spawn_child(
        "reliability_steps_crash_child",
        [
            (URL_VAR, OsStr::new(&url)),
            (RUN_VAR, OsStr::new(&run)),
            (DIR_VAR, OsStr::new(dir.path())),
        ],
        Stdio::piped(),
    );
    let stdout = child.stdout.take().unwrap();
    let reached = tokio::task::spawn_blocking(move || {
        let mut reached = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(at) = line.find(AT) {
                reached.push(line[at + AT.len()..].to_owned());
                if reached.len() == BOUNDARIES.len() {
                    break;
                }
            }
        }
        reached
    })
    .await
    .unwrap();
    if reached.len() < BOUNDARIES.len() {
        let _ = child.kill();
        let mut err = String::new();
        let _ = child.stderr.take().unwrap().read_to_string(&mut err);
        panic!("{backend:?}: the child reached only {reached:?}:\n{err}");
    }
    child.kill().unwrap(); // SIGKILL: no destructor runs, nothing is released.
    let status = child.wait().unwrap();
    assert!(!status.success(), "{backend:?}: the child was killed");

    let idem = engine(open(&url).await, LEASE);
    let bodies = AtomicU32::new(0);
    let retries = BOUNDARIES.map(|b| {
        let id = format!("{run}-{}", b.tag());
        let (idem, bodies) = (&idem, &bodies);
        let effects = Effects::new(dir.path(), &id);
        async move {
            let what = format!("{backend:?} killed {}", b.tag());
            // The child got as far as its boundary, and no further.
            let mut expected = [0; 3];
            expected[..b.done()].fill(1);
            assert_eq!(
                effects.counts(),
                expected,
                "{what}: side effects before the retry"
            );
            let k = key(&id);
            // Waits out the dead holder's lease (and its step's), then takes over.
            let receipt = checkout(idem, &k, &effects, CLEAN, bodies)
                .await
                .unwrap_or_else(|e| panic!("{what}: the retry: {e:?}"));
            finished_once(idem, &k, &effects, &receipt, &what).await;
        }
    });
    join_all(retries).await;
    assert_eq!(
        bodies.load(SeqCst),
        6,
        "{backend:?}: one retry per key ran the body"
    );
    // The child held its claims: the retries waited out their leases (which began after
    // the child was started) before they could take over.
    let took = started.elapsed();
    assert!(
        took >= LEASE,
        "{backend:?}: the retries finished {took:?} after the child started, within its lease of {LEASE:?}"
    );
    eprintln!(
        "reliability steps {backend:?}: SIGKILL at six boundaries, each call finished by a retry with every step once, in {:.1?}",
        started.elapsed()
    );
}

// --- 2. an Err and a panic at each boundary ----------------------------------------------

async fn err_and_panic_at_each_boundary(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let Some(url) = url(backend, dir.path()) else {
        return;
    };
    quiet_injected_panics();
    let started = Instant::now();
    let idem = engine(open(&url).await, LEASE);
    let run = unique(&format!("{backend:?}-fault"));
    let cases = [Fault::Err, Fault::Panic]
        .into_iter()
        .flat_map(|f| BOUNDARIES.map(|b| (f, b)));
    let cases = cases.map(|(fault, b)| {
        let (idem, dir, run) = (&idem, dir.path(), &run);
        async move {
            let id = format!("{run}-{fault:?}-{}", b.tag());
            let what = format!("{backend:?} {fault:?} {}", b.tag());
            let (k, effects, bodies) = (key(&id), Effects::new(dir, &id), AtomicU32::new(0));
            let first = checkout(idem, &k, &effects, at(b, fault), &bodies);
            match (
                fault,
                std::panic::AssertUnwindSafe(first).catch_unwind().await,
            ) {
                (Fault::Err, Ok(Err(Fail::Injected(got)))) => assert_eq!(got, b, "{what}"),
                (Fault::Panic, Err(_)) => {}
                (_, other) => panic!("{what}: the first attempt answered {other:?}"),
            }
            let mut expected = [0; 3];
            expected[..b.done()].fill(1);
            assert_eq!(
                effects.counts(),
                expected,
                "{what}: side effects of the first attempt"
            );
            let receipt = checkout(idem, &k, &effects, CLEAN, &bodies)
                .await
                .unwrap_or_else(|e| panic!("{what}: the retry: {e:?}"));
            assert_eq!(bodies.load(SeqCst), 2, "{what}: the body's runs");
            finished_once(idem, &k, &effects, &receipt, &what).await;
        }
    });
    join_all(cases).await;
    eprintln!(
        "reliability steps {backend:?}: an Err and a panic at six boundaries, each call finished by a retry with every step once, in {:.1?}",
        started.elapsed()
    );
}

// --- 3. 100 concurrent callers of one key ------------------------------------------------

/// 100 callers at once, waiting for each other; the first six bodies fail after one step or
/// another, so the key passes from caller to caller, each replaying the steps done.
async fn hundred_callers_of_one_key(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let Some(url) = url(backend, dir.path()) else {
        return;
    };
    let started = Instant::now();
    // A lease no caller outlives here: one body, and every other caller waits for it.
    let idem = engine(open(&url).await, LONG_LEASE);
    let id = unique(&format!("{backend:?}-hundred"));
    let effects = Effects::new(dir.path(), &id);
    let bodies = Arc::new(AtomicU32::new(0));
    let start = Arc::new(tokio::sync::Barrier::new(100));
    // Slow steps, so that callers pile up behind each body; and bodies that fail (each
    // giving the key back to a waiting caller) six times before one succeeds.
    let plan = Plan {
        pause: Duration::from_millis(30),
        flaky: Some(Box::leak(Box::new(AtomicU32::new(FLAKY)))),
        ..CLEAN
    };
    let callers: Vec<_> = (0..100)
        .map(|_| {
            let (idem, k, effects) = (idem.clone(), key(&id), effects.clone());
            let (bodies, start) = (bodies.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                // A caller whose body failed calls again, until the key is done.
                for _ in 0..=FLAKY {
                    match checkout(&idem, &k, &effects, plan, &bodies).await {
                        Err(Fail::Injected(_)) => continue,
                        out => return out,
                    }
                }
                panic!("a caller failed more than {FLAKY} times");
            })
        })
        .collect();
    let mut receipts = Vec::new();
    for caller in callers {
        let receipt = caller.await.unwrap();
        receipts.push(receipt.unwrap_or_else(|e| panic!("{backend:?}: a caller got {e:?}")));
    }
    let what = format!("{backend:?} 100 callers");
    assert!(
        receipts.iter().all(|r| *r == receipts[0]),
        "{what}: the callers' answers differ"
    );
    assert_eq!(
        bodies.load(SeqCst),
        FLAKY + 1,
        "{what}: the body's runs (one per failure, and the one that succeeded)"
    );
    assert_eq!(plan.flaky.unwrap().load(SeqCst), 0, "{what}: failures left");
    finished_once(&idem, &key(&id), &effects, &receipts[0], &what).await;
    eprintln!(
        "reliability steps {backend:?}: 100 concurrent callers of one key, 7 bodies (6 failed), every step once, one answer, in {:.1?}",
        started.elapsed()
    );
}

// --- 3b. a holder that lost its lease and runs on beside its successor ----------------

/// A store whose extends fail while `failing` is set: the lease of a call on it ends while
/// its body runs, and another caller takes the key over.
#[derive(Debug)]
struct FailingExtends {
    inner: Arc<dyn Store>,
    failing: std::sync::atomic::AtomicBool,
}

#[idem::store::async_trait]
impl StoreWrapper for FailingExtends {
    type Inner = dyn Store;
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }
    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
        if self.failing.load(SeqCst) {
            return Err(StoreError::Unavailable {
                backend: "test",
                source: "extends fail in this test".into(),
            });
        }
        self.inner.extend(key, token, lease).await
    }
}

/// A holder A whose extends fail (`LeaseLoss::Finish`: its body runs on) stalls after
/// `charge`; its lease ends, B takes the key over, replays `charge`, runs `reserve` and
/// `email`, stores the receipt and deletes the step records. Then A goes on: it must not
/// run `reserve` or `email` again (their records are gone, but the call is B's and done).
async fn holder_past_its_lease_runs_no_step_again(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let Some(url) = url(backend, dir.path()) else {
        return;
    };
    let store = open(&url).await;
    let a_store = FailingExtends {
        inner: store.clone(),
        failing: true.into(),
    };
    let a = Idem::builder()
        .store(a_store)
        .lease(LEASE)
        .lease_loss(LeaseLoss::Finish)
        .build()
        .unwrap();
    let b = engine(store.clone(), LEASE);
    let id = unique(&format!("{backend:?}-past-lease"));
    let (k, effects) = (key(&id), Effects::new(dir.path(), &id));
    let what = format!("{backend:?} holder past its lease");
    let stalled: &'static tokio::sync::Notify = Box::leak(Box::default());
    let go_on: &'static tokio::sync::Notify = Box::leak(Box::default());
    let a_call = tokio::spawn({
        let (a, k, effects) = (a.clone(), k.clone(), effects.clone());
        async move {
            let plan = at(Boundary::After(0), Fault::Stall(stalled, go_on));
            checkout(&a, &k, &effects, plan, &AtomicU32::new(0)).await
        }
    });
    stalled.notified().await;
    // B waits out A's lease, takes over, and finishes.
    let bodies = AtomicU32::new(0);
    let receipt = checkout(&b, &k, &effects, CLEAN, &bodies)
        .await
        .unwrap_or_else(|e| panic!("{what}: B: {e:?}"));
    assert_eq!(effects.counts(), [1, 1, 1], "{what}: after B");
    step_records_go(&*store, &k, &what).await;
    go_on.notify_one();
    let a_answer = a_call.await.unwrap();
    assert_eq!(
        effects.counts(),
        [1, 1, 1],
        "{what}: A ran steps again after B finished (A answered {a_answer:?})"
    );
    assert!(
        matches!(a_answer, Err(Fail::Idem(Error::LeaseLost { .. }))),
        "{what}: A answered {a_answer:?}"
    );
    finished_once(&b, &k, &effects, &receipt, &what).await;
}

// --- 4. unknown outcomes -----------------------------------------------------------------

/// A first attempt whose `reserve` fails ambiguously: the key is held from then on.
async fn held(idem: &Idem, k: &Key, effects: &Effects, bodies: &AtomicU32, what: &str) {
    let first = checkout(
        idem,
        k,
        effects,
        at(Boundary::Before(1), Fault::Ambiguous),
        bodies,
    )
    .await;
    match first {
        Err(Fail::Idem(Error::OutcomeUnknown { key, step })) if key == *k && step == "reserve" => {}
        other => panic!("{what}: the ambiguous attempt answered {other:?}"),
    }
    assert_eq!(
        effects.counts(),
        [1, 0, 0],
        "{what}: side effects of the first attempt"
    );
    assert_eq!(bodies.load(SeqCst), 1, "{what}");
}

/// Three calls of a held key: each answers `OutcomeUnknown` for `reserve` and runs nothing.
async fn still_held(idem: &Idem, k: &Key, effects: &Effects, bodies: &AtomicU32, what: &str) {
    let ran = bodies.load(SeqCst);
    for _ in 0..3 {
        match checkout(idem, k, effects, CLEAN, bodies).await {
            Err(Fail::Idem(Error::OutcomeUnknown { key, step }))
                if key == *k && step == "reserve" => {}
            other => panic!("{what}: a call of the held key answered {other:?}"),
        }
    }
    assert_eq!(
        bodies.load(SeqCst),
        ran,
        "{what}: a call of the held key ran the body"
    );
    assert_eq!(
        effects.counts(),
        [1, 0, 0],
        "{what}: side effects while held"
    );
    // Held in the store, not in an engine: the call's record and the step's are there.
    let store = idem.store();
    for record in [k.clone(), k.step("reserve").unwrap()] {
        let got = store.get(&record).await.unwrap();
        assert!(
            matches!(got, Some(Record::Completed { .. })),
            "{what}: {record} while held: {got:?}"
        );
    }
}

/// What the reconcile hook was asked, by key id: the step and the key it handed on.
type Asked = Arc<Mutex<HashMap<String, Vec<(String, String)>>>>;

async fn unknown_outcome_holds_until_resolved(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let Some(url) = url(backend, dir.path()) else {
        return;
    };
    let started = Instant::now();
    let store = open(&url).await;
    let idem = engine(store.clone(), LONG_LEASE);
    let asked: Asked = Arc::default();
    let hooked = Idem::builder()
        .shared_store(store.clone())
        .lease(LONG_LEASE)
        .in_progress(InProgress::Wait)
        .wait_timeout(WAIT)
        .reconcile({
            let asked = asked.clone();
            move |u: Unresolved| {
                let id = u.key().id().to_owned();
                let entry = (u.step().to_owned(), u.step_key());
                asked
                    .lock()
                    .unwrap()
                    .entry(id.clone())
                    .or_default()
                    .push(entry);
                let answer = if id.ends_with("-hook-ran") {
                    Some(Resolution::ran("reserved by the hook").unwrap())
                } else if id.ends_with("-hook-not-ran") {
                    Some(Resolution::NotRan)
                } else {
                    None
                };
                async move { answer }
            }
        })
        .build()
        .unwrap();
    let run = unique(&format!("{backend:?}-unknown"));
    let case = |name: &str| {
        let id = format!("{run}-{name}");
        let what = format!("{backend:?} unknown {name}");
        (
            key(&id),
            Effects::new(dir.path(), &id),
            AtomicU32::new(0),
            what,
        )
    };
    let asked_of = |k: &Key| {
        asked
            .lock()
            .unwrap()
            .get(k.id())
            .cloned()
            .unwrap_or_default()
    };

    // Resolved as run, with its value: the next call replays it and runs only `email`.
    let (k, effects, bodies, what) = case("ran");
    held(&idem, &k, &effects, &bodies, &what).await;
    still_held(&idem, &k, &effects, &bodies, &what).await;
    let resolved = idem
        .resolve(&k, "reserve", Resolution::ran("reserved by hand").unwrap())
        .await
        .unwrap();
    assert_eq!(resolved, Resolved::Resolved, "{what}");
    let receipt = checkout(&idem, &k, &effects, CLEAN, &bodies).await.unwrap();
    let charge = effects.runs("charge");
    let email = effects.runs("email");
    assert_eq!(
        effects.counts(),
        [1, 0, 1],
        "{what}: side effects after the resolution"
    );
    let expected = [
        charge[0].clone(),
        "reserved by hand".into(),
        email[0].clone(),
    ];
    assert_eq!(receipt, expected, "{what}");
    assert_eq!(bodies.load(SeqCst), 2, "{what}: the body's runs");
    let again = checkout(&idem, &k, &effects, CLEAN, &bodies).await.unwrap();
    assert_eq!(again, receipt, "{what}: the replay");
    assert_eq!(bodies.load(SeqCst), 2, "{what}: the replay ran the body");
    assert_eq!(
        effects.entered("reserve").len(),
        1,
        "{what}: the resolved step ran again"
    );
    let twice = idem
        .resolve(&k, "reserve", Resolution::NotRan)
        .await
        .unwrap();
    assert_eq!(twice, Resolved::NotHeld, "{what}: a second resolution");
    step_records_go(&*store, &k, &what).await;

    // Resolved as not run: the next call runs `reserve` (and `email`), not `charge`.
    let (k, effects, bodies, what) = case("not-ran");
    held(&idem, &k, &effects, &bodies, &what).await;
    still_held(&idem, &k, &effects, &bodies, &what).await;
    let resolved = idem
        .resolve(&k, "reserve", Resolution::NotRan)
        .await
        .unwrap();
    assert_eq!(resolved, Resolved::Resolved, "{what}");
    let receipt = checkout(&idem, &k, &effects, CLEAN, &bodies).await.unwrap();
    let entered = effects.entered("reserve");
    assert_eq!(entered.len(), 2, "{what}: `reserve` entered {entered:?}");
    assert_eq!(
        entered[0], entered[1],
        "{what}: each attempt hands on the same step key"
    );
    finished_once(&idem, &k, &effects, &receipt, &what).await;

    // The reconcile hook knows it ran: the call after the hold asks it, and replays its value.
    let (k, effects, bodies, what) = case("hook-ran");
    held(&hooked, &k, &effects, &bodies, &what).await;
    let receipt = checkout(&hooked, &k, &effects, CLEAN, &bodies)
        .await
        .unwrap();
    assert_eq!(
        effects.counts(),
        [1, 0, 1],
        "{what}: side effects after the hook"
    );
    let (charge, email) = (effects.runs("charge"), effects.runs("email"));
    let expected = [
        charge[0].clone(),
        "reserved by the hook".into(),
        email[0].clone(),
    ];
    assert_eq!(receipt, expected, "{what}");
    let entered = effects.entered("reserve");
    assert_eq!(entered.len(), 1, "{what}: the resolved step ran again");
    let asked_here = asked_of(&k);
    assert!(!asked_here.is_empty(), "{what}: the hook was not asked");
    for (step, handed_on) in &asked_here {
        assert_eq!(step, "reserve", "{what}");
        // The hook is told the key the step handed on, to ask the system it called.
        assert_eq!(handed_on, &entered[0], "{what}: the hook's step key");
        assert_eq!(handed_on.len(), 32, "{what}: the step key {handed_on:?}");
    }
    let again = checkout(&hooked, &k, &effects, CLEAN, &bodies)
        .await
        .unwrap();
    assert_eq!(again, receipt, "{what}: the replay");
    assert_eq!(bodies.load(SeqCst), 2, "{what}: the body's runs");
    step_records_go(&*store, &k, &what).await;

    // The hook knows it did not run: the call after the hold runs `reserve`.
    let (k, effects, bodies, what) = case("hook-not-ran");
    held(&hooked, &k, &effects, &bodies, &what).await;
    let receipt = checkout(&hooked, &k, &effects, CLEAN, &bodies)
        .await
        .unwrap();
    assert!(!asked_of(&k).is_empty(), "{what}: the hook was not asked");
    let entered = effects.entered("reserve");
    assert_eq!(
        entered.len(),
        2,
        "{what}: `reserve` was not run again: {entered:?}"
    );
    assert_eq!(bodies.load(SeqCst), 2, "{what}: the body's runs");
    finished_once(&hooked, &k, &effects, &receipt, &what).await;

    // The hook does not know: the key stays held, through the hook's engine too, until it
    // is resolved by hand.
    let (k, effects, bodies, what) = case("hook-unsure");
    held(&hooked, &k, &effects, &bodies, &what).await;
    still_held(&hooked, &k, &effects, &bodies, &what).await;
    assert!(
        asked_of(&k).len() >= 3,
        "{what}: the hook was asked {:?}",
        asked_of(&k)
    );
    let resolved = idem
        .resolve(&k, "reserve", Resolution::NotRan)
        .await
        .unwrap();
    assert_eq!(resolved, Resolved::Resolved, "{what}");
    let receipt = checkout(&hooked, &k, &effects, CLEAN, &bodies)
        .await
        .unwrap();
    assert_eq!(bodies.load(SeqCst), 2, "{what}: the body's runs");
    finished_once(&hooked, &k, &effects, &receipt, &what).await;
    eprintln!(
        "reliability steps {backend:?}: a step of unknown outcome held its key until resolved (by hand: ran, not run; by the hook: ran, not run, unsure), in {:.1?}",
        started.elapsed()
    );
}

// --- 6. a step belongs to its call's payload ---------------------------------------------

/// An attempt with amount 100 charges in a step, then fails (its claim released); a retry
/// of the key with amount 5000 is `KeyReuse` before any step replays, and the first
/// payload's retry resumes after its charge.
async fn a_step_belongs_to_its_calls_payload(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let Some(url) = url(backend, dir.path()) else {
        return;
    };
    let idem = engine(open(&url).await, LONG_LEASE);
    let k = key(&unique(&format!("{backend:?}-payload")));
    let charges = AtomicU32::new(0);
    let pay = |amount: u32, fail: bool| {
        let charges = &charges;
        idem.call(k.clone(), Fingerprint::of(&amount))
            .run_fallible(move || async move {
                let charge = idem::step("charge", || async move {
                    charges.fetch_add(1, SeqCst);
                    Ok::<_, Error>(format!("ch_for_{amount}"))
                })
                .await?;
                match fail {
                    true => Err(Error::Config {
                        message: "stock changed".into(),
                        source: None,
                    }),
                    false => Ok(format!("order paid {amount} with {charge}")),
                }
            })
    };
    assert!(pay(100, true).await.is_err());
    let other = pay(5000, false).await;
    assert!(
        matches!(other, Err(Error::KeyReuse { .. })),
        "{backend:?}: another payload replayed the first one's charge: {other:?}"
    );
    assert_eq!(
        pay(100, false).await.unwrap(),
        "order paid 100 with ch_for_100"
    );
    assert_eq!(charges.load(SeqCst), 1, "{backend:?}: charged twice");
}

// --- 7. resolutions racing, from every caller of a held key -------------------------------

/// How many held keys the race resolves (times `IDEM_RELIABILITY_SCALE`).
const RACE_KEYS: usize = 100;
/// How many callers retry each held key at once, spread over [`RACE_ENGINES`] engines on
/// connections of their own (standing for processes).
const RACE_CALLERS: usize = 8;
const RACE_ENGINES: usize = 4;

/// Held keys, each retried by eight callers at once, whose reconcile hooks (one per engine)
/// answer "ran" after 0 to 4 ms: no charge runs a second time, no attempt loses its claim
/// to a resolution, and every caller gets the resolved value or a clean `OutcomeUnknown` /
/// `InProgress`.
async fn resolutions_race_from_every_caller(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let Some(url) = url(backend, dir.path()) else {
        return;
    };
    let scale: usize = std::env::var("IDEM_RELIABILITY_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let keys = RACE_KEYS * scale;
    let started = Instant::now();
    let mut engines = Vec::new();
    let first = open(&url).await;
    for e in 0..RACE_ENGINES {
        // A connection of its own per engine, but one memory store for all.
        let store = match (e, backend) {
            (0, _) | (_, Backend::Memory) => first.clone(),
            _ => open(&url).await,
        };
        engines.push(
            Idem::builder()
                .shared_store(store)
                .lease(LONG_LEASE)
                .in_progress(InProgress::Wait)
                .wait_timeout(WAIT)
                .reconcile(|u: Unresolved| async move {
                    // 0 to 4 ms, from the key's id and the moment.
                    let nanos = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |d| d.subsec_nanos());
                    let pause = (u64::from(nanos) + u.key().id().len() as u64) % 5;
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    Resolution::ran("ch_1").ok()
                })
                .build()
                .unwrap(),
        );
    }
    let run = unique(&format!("{backend:?}-race"));
    let charges: Arc<Vec<AtomicU32>> = Arc::new((0..keys).map(|_| AtomicU32::new(0)).collect());
    let call = |idem: Idem, i: usize, ambiguous: bool| {
        let (charges, k) = (charges.clone(), key(&format!("{run}-{i}")));
        async move {
            idem.call(k, Fingerprint::NONE)
                .run_fallible(move || async move {
                    Step::new("charge")
                        .unknown_if(|_: &Error| true)
                        .run(|| async move {
                            charges[i].fetch_add(1, SeqCst);
                            match ambiguous {
                                true => Err(Error::Config {
                                    message: "the gateway timed out".into(),
                                    source: None,
                                }),
                                false => Ok(String::from("ch_again")),
                            }
                        })
                        .await
                })
                .await
        }
    };
    // Hold every key.
    for chunk in (0..keys).collect::<Vec<_>>().chunks(50) {
        let holds = chunk.iter().map(|&i| call(engines[0].clone(), i, true));
        for out in join_all(holds).await {
            assert!(matches!(out, Err(Error::OutcomeUnknown { .. })), "{out:?}");
        }
    }
    let (mut lease_lost, mut answered) = (0, 0);
    for chunk in (0..keys).collect::<Vec<_>>().chunks(25) {
        let retries = chunk.iter().flat_map(|&i| {
            let engines = &engines;
            let call = &call;
            (0..RACE_CALLERS).map(move |c| call(engines[c % RACE_ENGINES].clone(), i, false))
        });
        for out in join_all(retries).await {
            match out {
                Ok(value) => {
                    assert_eq!(value, "ch_1", "{backend:?}");
                    answered += 1;
                }
                Err(Error::LeaseLost { .. }) => lease_lost += 1,
                Err(Error::OutcomeUnknown { .. } | Error::InProgress { .. }) => {}
                Err(e) => panic!("{backend:?}: {e}: {e:?}"),
            }
        }
    }
    let twice = charges.iter().filter(|c| c.load(SeqCst) > 1).count();
    assert_eq!(twice, 0, "{backend:?}: {twice} keys charged twice");
    assert_eq!(
        lease_lost, 0,
        "{backend:?}: resolutions ended running attempts"
    );
    // Every key is resolved: its next call answers the value.
    for i in 0..keys {
        assert_eq!(
            call(engines[0].clone(), i, false).await.unwrap(),
            "ch_1",
            "{backend:?}"
        );
    }
    println!(
        "reliability steps {backend:?}: {keys} held keys, {RACE_CALLERS} callers each on {RACE_ENGINES} engines, resolved by their hooks: 0 charged twice, 0 lease lost, {answered} callers answered at once, in {:.1?}",
        started.elapsed()
    );
}

// --- one test per store and scenario -----------------------------------------------------

macro_rules! every_store {
    ($($name:ident: $backend:expr, crash: $crash:meta, $gate:meta;)*) => {$(
        #[cfg($gate)]
        mod $name {
            use super::*;

            #[cfg($crash)]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn reliability_steps_sigkill_at_each_boundary() {
                killed_at_each_boundary($backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn reliability_steps_err_and_panic_at_each_boundary() {
                super::err_and_panic_at_each_boundary($backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn reliability_steps_hundred_concurrent_callers() {
                hundred_callers_of_one_key($backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn reliability_steps_holder_past_its_lease_runs_no_step_again() {
                holder_past_its_lease_runs_no_step_again($backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn reliability_steps_unknown_outcome() {
                unknown_outcome_holds_until_resolved($backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn reliability_steps_belong_to_their_calls_payload() {
                a_step_belongs_to_its_calls_payload($backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn reliability_steps_resolutions_race_from_every_caller() {
                resolutions_race_from_every_caller($backend).await;
            }
        }
    )*};
}

every_store! {
    // Records in memory die with the process: nothing for a crash to test.
    memory: Backend::Memory, crash: any(), all();
    sqlite: Backend::Sqlite, crash: all(), all();
    postgres: Backend::Postgres, crash: all(), all();
    mysql: Backend::Mysql, crash: all(), feature = "mysql";
    redis: Backend::Redis, crash: all(), feature = "redis";
    redis_cluster: Backend::RedisCluster, crash: all(), feature = "redis-cluster";
}
