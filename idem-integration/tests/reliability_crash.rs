//! Crashes, through `#[idempotent]`: a process killed with SIGKILL in the middle of a body;
//! a result that must outlive the process that stored it; a Redis server of the test's own
//! killed and restarted under a running engine; a Postgres server of the test's own
//! stopped without a checkpoint (`pg_ctl stop -m immediate`) and recovered; a MariaDB server
//! of the test's own killed with SIGKILL and recovered. The crashing
//! processes are this test binary started again with `IDEM_CRASH_MODE` set (the test
//! `reliability_crash_child`).
//!
//! ```text
//! IDEM_REQUIRE_BACKENDS=1 IDEM_TEST_POSTGRES_URL=... IDEM_TEST_REDIS_URL=... \
//!     cargo test -p idem-integration --all-features --test reliability_crash
//! ```
#![cfg(all(feature = "sqlite", feature = "postgres", feature = "redis"))]

mod common;

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use idem::testing::backend_url;
use idem::{idempotent, Error, Idem, Key};
use support::redis_server::PrivateRedis;

// The store tests' support (a private `redis-server`), shared with `idem-stores`' own tests.
#[path = "../../idem-stores/tests/support/mod.rs"]
mod support;

const SCOPE: &str = "reliability.crash";
/// The lease of the crashing call: what a successor waits out.
const LEASE: Duration = Duration::from_secs(5);

const MODE: &str = "IDEM_CRASH_MODE";
const URL: &str = "IDEM_CRASH_URL";
const ID: &str = "IDEM_CRASH_ID";

#[idempotent(key = id, store = idem, skip(idem, runs, hang), scope = "reliability.crash", lease = "5s")]
async fn charge(idem: &Idem, runs: &AtomicU32, id: String, hang: bool) -> String {
    runs.fetch_add(1, Ordering::SeqCst);
    if hang {
        println!("IDEM-BODY-STARTED");
        std::io::stdout().flush().unwrap();
        // Killed here.
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
    println!("IDEM-RAN");
    format!("charged {id} in process {}", std::process::id())
}

/// The child: `hang` claims and never finishes its body (the parent kills it there);
/// `complete` calls once and prints its answer.
#[tokio::test]
async fn reliability_crash_child() {
    let (Ok(mode), Ok(url), Ok(id)) = (std::env::var(MODE), std::env::var(URL), std::env::var(ID))
    else {
        return;
    };
    let idem = idem::connect(&url).await.unwrap();
    let runs = AtomicU32::new(0);
    let v = charge(&idem, &runs, id, mode == "hang").await.unwrap();
    println!("IDEM-ANSWER {v}");
}

fn child(mode: &str, url: &str, id: &str) -> Child {
    common::spawn_child(
        "reliability_crash_child",
        [
            (MODE, OsStr::new(&mode)),
            (URL, OsStr::new(&url)),
            (ID, OsStr::new(&id)),
        ],
        Stdio::piped(),
    )
}

/// Runs a `complete` child to its end; its answer and whether its body ran.
fn complete_in_child(url: &str, id: &str) -> (String, bool) {
    let out = child("complete", url, id).wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer = stdout
        .lines()
        .find_map(|l| l.find("IDEM-ANSWER ").map(|at| l[at + 12..].to_owned()))
        .expect("the child answered");
    (answer, stdout.contains("IDEM-RAN"))
}

/// SIGKILL in the body; then: the key is in progress until the lease ends, the next call
/// after it runs the body exactly once, and every later call replays that result.
async fn killed_in_the_body(backend: &str, url: &str) {
    let id = common::run_name(backend);
    // Before the child claims: its lease (extended while it lived) ends at least LEASE
    // after this, whatever the machine's load did to reading its pipe or to the kill.
    let spawned_at = Instant::now();
    let mut hung = child("hang", url, &id);
    let mut lines = BufReader::new(hung.stdout.take().unwrap()).lines();
    let started = tokio::task::spawn_blocking(move || {
        lines.any(|l| l.is_ok_and(|l| l.contains("IDEM-BODY-STARTED")))
    })
    .await
    .unwrap();
    if !started {
        let mut err = String::new();
        hung.stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        panic!("{backend}: the child never started its body:\n{err}");
    }
    let killed_at = Instant::now();
    hung.kill().unwrap(); // SIGKILL: no destructor, no release.
    let status = hung.wait().unwrap();
    assert!(!status.success(), "{backend}: the child was killed");

    let idem = idem::connect(url).await.unwrap();
    let runs = AtomicU32::new(0);
    // The dead holder's lease still runs: in progress, and the body does not run.
    match charge(&idem, &runs, id.clone(), false).await {
        Err(Error::InProgress { .. }) => {}
        other => panic!("{backend}: right after the kill, expected InProgress, got {other:?}"),
    }
    // After the lease: taken over, run once.
    let deadline = killed_at + LEASE + Duration::from_secs(5);
    let value = loop {
        match charge(&idem, &runs, id.clone(), false).await {
            Ok(v) => break v,
            Err(Error::InProgress { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => panic!("{backend}: after the lease, got {other:?}"),
        }
    };
    let recovered_after = spawned_at.elapsed();
    assert!(
        recovered_after >= LEASE,
        "{backend}: taken over {recovered_after:?} after the child started, before the lease of {LEASE:?} ended"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "{backend}: runs after the takeover"
    );
    for _ in 0..3 {
        assert_eq!(
            charge(&idem, &runs, id.clone(), false).await.unwrap(),
            value
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "{backend}: replays ran the body"
    );
    // And another process replays it too, without running the body.
    let (answer, ran) = tokio::task::spawn_blocking({
        let (url, id) = (url.to_owned(), id.clone());
        move || complete_in_child(&url, &id)
    })
    .await
    .unwrap();
    assert_eq!(answer, value, "{backend}: another process's replay");
    assert!(!ran, "{backend}: a replay in another process ran the body");
    eprintln!("reliability crash {backend}: SIGKILL mid-body, taken over after {recovered_after:.1?}, ran once");
}

/// A result stored by one process is the answer of the next one, which does not run.
async fn survives_the_calling_process(backend: &str, url: &str) {
    let id = common::run_name(backend);
    let (url, id2) = (url.to_owned(), id.clone());
    let (first, second) = tokio::task::spawn_blocking(move || {
        (complete_in_child(&url, &id2), complete_in_child(&url, &id2))
    })
    .await
    .unwrap();
    assert!(first.1, "{backend}: the first process ran the body");
    assert!(
        !second.1,
        "{backend}: the second process ran the body again"
    );
    assert_eq!(second.0, first.0, "{backend}: the second process's answer");
}

fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}", dir.path().join("crash.db").display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_crash_sqlite_sigkill_mid_body() {
    let dir = tempfile::tempdir().unwrap();
    killed_in_the_body("sqlite", &sqlite_url(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_crash_sqlite_result_survives_the_process() {
    let dir = tempfile::tempdir().unwrap();
    survives_the_calling_process("sqlite", &sqlite_url(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_crash_postgres_sigkill_mid_body() {
    let Some(url) = backend_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    killed_in_the_body("postgres", &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_crash_postgres_result_survives_the_process() {
    let Some(url) = backend_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    survives_the_calling_process("postgres", &url).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_crash_mysql_sigkill_mid_body() {
    let Some(url) = backend_url("IDEM_TEST_MYSQL_URL") else {
        return;
    };
    killed_in_the_body("mysql", &url).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_crash_mysql_result_survives_the_process() {
    let Some(url) = backend_url("IDEM_TEST_MYSQL_URL") else {
        return;
    };
    survives_the_calling_process("mysql", &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_crash_redis_sigkill_mid_body() {
    let Some(url) = backend_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    killed_in_the_body("redis", &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_crash_redis_result_survives_the_process() {
    let Some(url) = backend_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    survives_the_calling_process("redis", &url).await;
}

// --- a Redis server of the test's own, killed and restarted --------------------------------

/// A result completed before the server was killed is replayed after its restart, by the
/// same engine (its connection comes back) and by a new process; the body never runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_crash_redis_server_restart_keeps_results() {
    if backend_url("IDEM_TEST_REDIS_URL").is_none() {
        return;
    }
    // Its AOF (fsync on every write) is in a directory that outlives restarts.
    let mut server = PrivateRedis::start(&["--appendonly", "yes", "--appendfsync", "always"])
        .expect("IDEM_TEST_REDIS_URL is set");
    let url = server.url();
    let idem = idem::connect(&url).await.unwrap();
    let runs = AtomicU32::new(0);
    let ids: Vec<String> = (0..20).map(|i| format!("restart-{i}")).collect();
    let mut values = Vec::new();
    for id in &ids {
        values.push(charge(&idem, &runs, id.clone(), false).await.unwrap());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 20);

    server.kill();
    // While it is down: fail closed, the body does not run.
    let down = charge(&idem, &runs, "while-down".into(), false).await;
    assert!(matches!(down, Err(Error::Store { .. })), "{down:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 20);
    server.spawn();

    same_answers_after_the_restart(&idem, &runs, &ids, &values).await;
    let (answer, ran) = tokio::task::spawn_blocking({
        let url = url.clone();
        move || complete_in_child(&url, "restart-0")
    })
    .await
    .unwrap();
    assert_eq!(answer, values[0]);
    assert!(!ran, "a new process ran the body after the restart");
    let key = Key::new(SCOPE, "restart-0").unwrap();
    assert!(idem.store().get(&key).await.unwrap().is_some());
    eprintln!("reliability crash redis-server: 20 results survived SIGKILL and restart");
}

/// Once the restarted server answers (within 15 s), every id replays its value, and no
/// body of the 20 ran again.
async fn same_answers_after_the_restart(
    idem: &Idem,
    runs: &AtomicU32,
    ids: &[String],
    values: &[String],
) {
    let deadline = Instant::now() + Duration::from_secs(15);
    for (id, v) in ids.iter().zip(values) {
        let got = loop {
            match charge(idem, runs, id.clone(), false).await {
                Err(Error::Store { .. }) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                other => break other,
            }
        };
        let got = got.unwrap_or_else(|e| panic!("{id} after the restart: {e:?}"));
        assert_eq!(&got, v, "{id} after the restart");
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        20,
        "a body ran again after the restart"
    );
}

// --- a Postgres server of the test's own, crashed and restarted ----------------------------

/// A Postgres cluster in a temporary directory on a spare port (initdb'd by the test;
/// as the `postgres` user when the test runs as root, since Postgres refuses root).
struct OwnPostgres {
    port: u16,
    dir: tempfile::TempDir,
    as_root: bool,
}

impl OwnPostgres {
    fn command(&self, program: &str) -> Command {
        if self.as_root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", program]);
            c
        } else {
            Command::new(program)
        }
    }

    fn data(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    fn start() -> OwnPostgres {
        let as_root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        let dir = tempfile::tempdir().unwrap();
        if as_root {
            let ok = Command::new("chown")
                .arg("postgres")
                .arg(dir.path())
                .status()
                .unwrap()
                .success();
            assert!(ok, "chown postgres {:?}", dir.path());
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let pg = OwnPostgres { port, dir, as_root };
        let out = pg
            .command("initdb")
            .arg("-D")
            .arg(pg.data())
            .args(["-U", "postgres", "--auth=trust", "-N"])
            .output()
            .expect("initdb is on PATH");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        pg.spawn();
        pg
    }

    fn spawn(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on",
            self.port,
            self.dir.path().display()
        );
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-o", &options, "-l"])
            .arg(self.dir.path().join("log"))
            .args(["-w", "-t", "30", "start"])
            .output()
            .expect("pg_ctl is on PATH");
        assert!(
            out.status.success(),
            "pg_ctl start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `pg_ctl stop -m immediate`: every process quits at once, no checkpoint; the next
    /// start recovers from the write-ahead log, as after a crash.
    fn crash(&self) {
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl stop: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}

/// A database server of the test's own that can crash and start again.
trait OwnServer: Send + 'static {
    /// The URL of its database.
    fn url(&self) -> String;
    /// Stops it at once, as a crash does (no checkpoint, no clean shutdown).
    fn crash(&self);
    /// Starts it again on the same data, waiting until it answers.
    fn spawn(&self);
}

impl OwnServer for OwnPostgres {
    fn url(&self) -> String {
        OwnPostgres::url(self)
    }
    fn crash(&self) {
        OwnPostgres::crash(self)
    }
    fn spawn(&self) {
        OwnPostgres::spawn(self)
    }
}

/// Results completed before `server` crashed are replayed after its recovery, by the same
/// engine (its pool reconnects) and by a new process; no body runs again.
async fn server_restart_keeps_results<S: OwnServer>(server: S, label: &str) {
    let url = server.url();
    let idem = idem::connect(&url).await.unwrap();
    let runs = AtomicU32::new(0);
    let ids: Vec<String> = (0..20).map(|i| format!("{label}-restart-{i}")).collect();
    let mut values = Vec::new();
    for id in &ids {
        values.push(charge(&idem, &runs, id.clone(), false).await.unwrap());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 20);

    let server = tokio::task::spawn_blocking(move || {
        server.crash();
        server
    })
    .await
    .unwrap();
    let down = charge(&idem, &runs, "while-down".into(), false).await;
    assert!(matches!(down, Err(Error::Store { .. })), "{down:?}");
    let server = tokio::task::spawn_blocking(move || {
        server.spawn();
        server
    })
    .await
    .unwrap();

    same_answers_after_the_restart(&idem, &runs, &ids, &values).await;
    let first = ids[0].clone();
    let (answer, ran) = tokio::task::spawn_blocking({
        let url = url.clone();
        move || complete_in_child(&url, &first)
    })
    .await
    .unwrap();
    assert_eq!(answer, values[0]);
    assert!(!ran, "a new process ran the body after the restart");
    drop(server);
    eprintln!("reliability crash {label} server: 20 results survived a crash and recovery");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_crash_postgres_server_restart_keeps_results() {
    if backend_url("IDEM_TEST_POSTGRES_URL").is_none() {
        return;
    }
    let server = tokio::task::spawn_blocking(OwnPostgres::start)
        .await
        .unwrap();
    server_restart_keeps_results(server, "postgres").await;
}

// --- a MariaDB server of the test's own, killed and restarted -------------------------------

/// A MariaDB server in a temporary directory on a spare port (`mariadb-install-db`, then
/// `mariadbd` as a child of the test; root over TCP with no password, loopback only).
#[cfg(feature = "mysql")]
struct OwnMariaDb {
    port: u16,
    dir: tempfile::TempDir,
    child: std::sync::Mutex<Option<Child>>,
}

#[cfg(feature = "mysql")]
impl OwnMariaDb {
    fn start() -> OwnMariaDb {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let out = Command::new("mariadb-install-db")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.path().join("data").display()))
            .args([
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ])
            .output()
            .expect("mariadb-install-db is on PATH");
        assert!(
            out.status.success(),
            "mariadb-install-db: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let server = OwnMariaDb {
            port,
            dir,
            child: std::sync::Mutex::new(None),
        };
        OwnServer::spawn(&server);
        server
    }
}

#[cfg(feature = "mysql")]
impl OwnServer for OwnMariaDb {
    fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/test", self.port)
    }

    /// SIGKILL: InnoDB recovers from its redo log on the next start (every commit flushed,
    /// `innodb_flush_log_at_trx_commit = 1`, the default).
    fn crash(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    fn spawn(&self) {
        let d = self.dir.path();
        let child = Command::new("mariadbd")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", d.join("data").display()))
            .arg(format!("--port={}", self.port))
            .arg(format!("--socket={}", d.join("sock").display()))
            .arg(format!("--pid-file={}", d.join("pid").display()))
            .arg(format!("--log-error={}", d.join("err.log").display()))
            .args([
                "--bind-address=127.0.0.1",
                "--user=root",
                "--skip-name-resolve",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mariadbd is on PATH");
        *self.child.lock().unwrap() = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = Command::new("mariadb")
                .args(["--protocol=tcp", "-h", "127.0.0.1", "-u", "root"])
                .arg(format!("-P{}", self.port))
                .args(["-e", "CREATE DATABASE IF NOT EXISTS test"])
                .output()
                .is_ok_and(|o| o.status.success());
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "mariadbd did not answer within 30 s: {}",
                std::fs::read_to_string(d.join("err.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[cfg(feature = "mysql")]
impl Drop for OwnMariaDb {
    fn drop(&mut self) {
        self.crash();
    }
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_crash_mysql_server_restart_keeps_results() {
    if backend_url("IDEM_TEST_MYSQL_URL").is_none() {
        return;
    }
    let server = tokio::task::spawn_blocking(OwnMariaDb::start)
        .await
        .unwrap();
    server_restart_keeps_results(server, "mysql").await;
}
