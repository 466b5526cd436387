//! Failover: a primary, a standby streaming from it through a proxy that delays the WAL,
//! and a promotion right after the last acknowledged call. Counts what the promoted
//! standby lost of what idem acknowledged, and which bodies a retry ran a second time,
//! with and without [`SynchronousCommit`] (RELIABILITY.md, "Durability beyond one node").
//!
//! The servers are the test's own: `initdb` in a temp dir, 127.0.0.1 on spare ports, run as
//! the `postgres` OS user when the test runs as root (Postgres refuses root). The binaries
//! are found in `IDEM_PG_BIN`, or `/usr/lib/postgresql/<version>/bin`; without them the
//! tests are skipped with a message, or fail when `IDEM_REQUIRE_BACKENDS=1`. Everything
//! they start is stopped, and their directories removed, on the way out, failures included.
#![cfg(feature = "postgres")]

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt};
use idem_core::{Error, Fingerprint, Idem, Key, StoreError};
use idem_stores::{PostgresStore, SynchronousCommit};

mod support;
use support::TcpProxy;

/// How many keys each failover test runs, and the delay on the WAL stream.
const KEYS: usize = 200;
const WAL_DELAY: Duration = Duration::from_millis(100);
/// Calls in flight at once.
const CONCURRENCY: usize = 20;

// ---- the servers ------------------------------------------------------------------------

/// The directory of `initdb`, `pg_ctl`, `postgres` and `pg_basebackup`, or `None` (skipped)
/// when there is none.
fn pg_bin() -> Option<PathBuf> {
    let found = std::env::var_os("IDEM_PG_BIN")
        .map(PathBuf::from)
        .into_iter()
        .chain(
            std::fs::read_dir("/usr/lib/postgresql")
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path().join("bin")),
        )
        .filter(|bin| bin.join("initdb").exists() && bin.join("pg_basebackup").exists())
        .max();
    if found.is_none() {
        if std::env::var("IDEM_REQUIRE_BACKENDS").as_deref() == Ok("1") {
            panic!("IDEM_REQUIRE_BACKENDS=1 but no Postgres binaries (initdb, pg_ctl, pg_basebackup) were found: set IDEM_PG_BIN");
        }
        idem_core::testing::skip(
            "no Postgres binaries (initdb, pg_basebackup) in IDEM_PG_BIN or /usr/lib/postgresql/*/bin",
        );
    }
    if found.is_some() && is_root() && !user_exists("postgres") {
        if std::env::var("IDEM_REQUIRE_BACKENDS").as_deref() == Ok("1") {
            panic!("IDEM_REQUIRE_BACKENDS=1 but the test runs as root and there is no `postgres` user to run the servers as");
        }
        idem_core::testing::skip(
            "running as root, and no `postgres` user to run the servers as (Postgres refuses root)",
        );
        return None;
    }
    found
}

fn user_exists(name: &str) -> bool {
    Command::new("id")
        .arg(name)
        .output()
        .is_ok_and(|o| o.status.success())
}

fn spare_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// The servers of one test, and the directory they live in: stopped (immediately) and
/// removed on drop, whatever the test did.
struct Cluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    as_postgres: bool,
    /// Data directories of servers started, to stop on drop.
    started: Vec<PathBuf>,
}

impl Cluster {
    fn new(bin: PathBuf) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("idem-pg-")
            .tempdir_in("/tmp")
            .unwrap();
        let as_postgres = is_root();
        let cluster = Cluster {
            bin,
            dir,
            as_postgres,
            started: Vec::new(),
        };
        if as_postgres {
            cluster.sh("chown", &["postgres:postgres", cluster.root_str()], false);
        }
        cluster
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn root_str(&self) -> &str {
        self.root().to_str().unwrap()
    }

    fn data(&self, name: &str) -> PathBuf {
        self.root().join(name)
    }

    /// Runs `program` (a Postgres binary when `pg`), as the `postgres` user when the test
    /// is root; panics with its output when it fails.
    fn sh(&self, program: &str, args: &[&str], pg: bool) -> String {
        let program = if pg {
            self.bin.join(program).to_str().unwrap().to_owned()
        } else {
            program.to_owned()
        };
        let mut cmd = if pg && self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", &program]);
            c
        } else {
            Command::new(&program)
        };
        let out = cmd
            .args(args)
            .current_dir(self.root())
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "{program} {args:?} failed: {text}\n{}",
            self.logs()
        );
        text
    }

    fn logs(&self) -> String {
        ["primary.log", "standby.log"]
            .iter()
            .filter_map(|f| {
                let text = std::fs::read_to_string(self.root().join(f)).ok()?;
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                Some(format!(
                    "--- {f} (last lines) ---\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `initdb` of a primary on `port` with `conf` added to its settings.
    fn init_primary(&self, port: u16, conf: &str) -> PathBuf {
        let data = self.data("primary");
        self.sh(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "--auth=trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            true,
        );
        self.append_conf(
            &data,
            &format!(
                "listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{}'\n\
                 fsync = off\nshared_buffers = 16MB\nmax_connections = 40\nmax_wal_senders = 4\n{conf}\n",
                self.root_str()
            ),
        );
        data
    }

    /// A standby of the primary, by `pg_basebackup -R` through `via` (so that it streams
    /// through it), listening on `port`, never waiting for a standby of its own.
    fn init_standby(&self, via: u16, port: u16) -> PathBuf {
        let data = self.data("standby");
        self.sh(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &via.to_string(),
                "-U",
                "postgres",
                "-D",
                data.to_str().unwrap(),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ],
            true,
        );
        self.append_conf(
            &data,
            &format!("port = {port}\nsynchronous_standby_names = ''\nsynchronous_commit = on\n"),
        );
        data
    }

    fn append_conf(&self, data: &Path, text: &str) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    fn start(&mut self, data: &Path, log: &str) {
        self.started.push(data.to_owned());
        let log = self.root().join(log);
        self.sh(
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-l",
                log.to_str().unwrap(),
                "-w",
                "-t",
                "30",
                "start",
            ],
            true,
        );
    }

    /// `pg_ctl stop -m immediate`: the server ends at once, as a crash would.
    fn crash(&self, data: &Path) {
        self.sh(
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
            true,
        );
    }

    fn promote(&self, data: &Path) {
        self.sh(
            "pg_ctl",
            &["-D", data.to_str().unwrap(), "-w", "-t", "30", "promote"],
            true,
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for data in &self.started {
            if data.join("postmaster.pid").exists() {
                let data = data.to_str().unwrap().to_owned();
                let program = self.bin.join("pg_ctl").to_str().unwrap().to_owned();
                let mut cmd = if self.as_postgres {
                    let mut c = Command::new("runuser");
                    c.args(["-u", "postgres", "--", &program]);
                    c
                } else {
                    Command::new(&program)
                };
                let _ = cmd
                    .args(["-D", &data, "-m", "immediate", "-w", "stop"])
                    .output();
            }
        }
        // The TempDir removes the directory.
    }
}

fn url(port: u16) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/postgres")
}

async fn admin(port: u16) -> sqlx::PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&url(port))
        .await
        .unwrap()
}

/// Waits until the primary streams to one standby (`sync`: as a synchronous one) and the
/// standby has replayed everything the primary wrote so far.
async fn wait_caught_up(primary: &sqlx::PgPool, sync: bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ok: bool = sqlx::query_scalar(
            "SELECT count(*) > 0 FROM pg_stat_replication
             WHERE state = 'streaming' AND replay_lsn >= pg_current_wal_lsn()
               AND (NOT $1 OR sync_state = 'sync')",
        )
        .bind(sync)
        .fetch_one(primary)
        .await
        .unwrap();
        if ok {
            return;
        }
        assert!(Instant::now() < deadline, "the standby did not catch up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn key(i: usize) -> Key {
    Key::new("failover", format!("k{i}")).unwrap()
}

/// A primary with its standby streaming through a proxy; `sync` names the standby in
/// `synchronous_standby_names` (with `synchronous_commit = local` on the server, so that
/// only what idem sets makes a commit wait for it).
struct Pair {
    cluster: Cluster,
    primary: PathBuf,
    standby: PathBuf,
    primary_port: u16,
    standby_port: u16,
    proxy: TcpProxy,
    admin: sqlx::PgPool,
}

async fn pair(sync: bool) -> Option<Pair> {
    let bin = pg_bin()?;
    let started = Instant::now();
    let mut cluster = Cluster::new(bin);
    let (primary_port, standby_port) = (spare_port(), spare_port());
    let conf = if sync {
        "synchronous_standby_names = '*'\nsynchronous_commit = local"
    } else {
        "synchronous_standby_names = ''"
    };
    let primary = tokio::task::block_in_place(|| {
        let data = cluster.init_primary(primary_port, conf);
        cluster.start(&data, "primary.log");
        data
    });
    let proxy = TcpProxy::start(SocketAddr::from(([127, 0, 0, 1], primary_port))).await;
    let standby = tokio::task::block_in_place(|| {
        let data = cluster.init_standby(proxy.port(), standby_port);
        cluster.start(&data, "standby.log");
        data
    });
    let admin = admin(primary_port).await;
    wait_caught_up(&admin, sync).await;
    eprintln!(
        "primary on {primary_port}, standby on {standby_port} through the proxy on {}: up in {:?}",
        proxy.port(),
        started.elapsed()
    );
    Some(Pair {
        cluster,
        primary,
        standby,
        primary_port,
        standby_port,
        proxy,
        admin,
    })
}

// ---- the failover runs ------------------------------------------------------------------

/// What one failover run measured.
#[derive(Debug)]
struct Tally {
    acknowledged: usize,
    /// Acknowledged results the promoted standby did not answer with.
    lost: usize,
    /// Of those, how many it found still claimed (the claim had reached it, the result not).
    lost_claimed: usize,
    /// Keys whose body ran more than once, over both servers.
    ran_twice: usize,
    took: Duration,
}

async fn failover(sync: bool, level: Option<SynchronousCommit>) -> Option<Tally> {
    let Pair {
        cluster,
        primary,
        standby,
        primary_port,
        standby_port,
        proxy,
        admin,
    } = pair(sync).await?;
    let begun = Instant::now();
    let mut builder = PostgresStore::builder();
    if let Some(level) = level {
        builder = builder.synchronous_commit(level);
    }
    let store = builder.connect(&url(primary_port)).await.unwrap();
    assert_eq!(store.synchronous_commit(), level);
    // The table reaches the standby before the link slows down.
    wait_caught_up(&admin, sync).await;
    proxy.delay_replies(WAL_DELAY);

    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..KEYS).map(|_| AtomicU32::new(0)).collect());
    let idem = Idem::new(store);
    let acknowledged: Vec<usize> = stream::iter(0..KEYS)
        .map(|i| {
            let (idem, runs) = (&idem, runs.clone());
            async move {
                let answer = idem
                    .call(key(i), Fingerprint::NONE)
                    .run(|| async move {
                        runs[i].fetch_add(1, Ordering::SeqCst);
                        i as u64
                    })
                    .await;
                match answer {
                    Ok(v) => {
                        assert_eq!(v, i as u64);
                        Some(i)
                    }
                    Err(e) => {
                        eprintln!("key {i} not acknowledged: {e}");
                        None
                    }
                }
            }
        })
        .buffer_unordered(CONCURRENCY)
        .filter_map(|i| async move { i })
        .collect()
        .await;
    // Right after the last acknowledgement: the link goes, then the primary, at once. The
    // lag is what the standby had confirmed when the link went (its feedback stops too).
    proxy.black_hole();
    let lag: Option<i64> = sqlx::query_scalar(
        "SELECT (pg_current_wal_lsn() - replay_lsn)::int8 FROM pg_stat_replication LIMIT 1",
    )
    .fetch_optional(&admin)
    .await
    .ok()
    .flatten();
    proxy.cut();
    tokio::task::block_in_place(|| cluster.crash(&primary));
    drop(idem);
    admin.close().await;
    let took = begun.elapsed();
    eprintln!(
        "reliability failover, {} of {KEYS} acknowledged in {took:?}; standby replay lag at the crash: {lag:?} bytes",
        acknowledged.len()
    );

    tokio::task::block_in_place(|| cluster.promote(&standby));
    let promoted = PostgresStore::builder()
        .connect(&url(standby_port))
        .await
        .unwrap();
    let idem = Idem::new(promoted);
    let answers: Vec<Retry> = stream::iter(acknowledged.iter().copied())
        .map(|i| {
            let (idem, runs) = (&idem, runs.clone());
            async move {
                let before = runs[i].load(Ordering::SeqCst);
                let body_runs = runs.clone();
                let answer = idem
                    .call(key(i), Fingerprint::NONE)
                    .run(|| async move {
                        body_runs[i].fetch_add(1, Ordering::SeqCst);
                        i as u64
                    })
                    .await;
                let ran = runs[i].load(Ordering::SeqCst) > before;
                match answer {
                    Ok(v) if !ran => {
                        assert_eq!(v, i as u64, "key {i} answered another key's result");
                        Retry::Kept
                    }
                    Ok(_) => Retry::RanAgain,
                    // The claim reached the standby, its result did not.
                    Err(Error::InProgress { .. }) => Retry::Claimed,
                    Err(e) => panic!("retrying key {i} on the promoted standby: {e}"),
                }
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let lost = answers.iter().filter(|a| **a != Retry::Kept).count();
    let lost_claimed = answers.iter().filter(|a| **a == Retry::Claimed).count();
    let ran_twice = runs.iter().filter(|n| n.load(Ordering::SeqCst) > 1).count();
    drop(proxy);
    drop(cluster);
    Some(Tally {
        acknowledged: acknowledged.len(),
        lost,
        lost_claimed,
        ran_twice,
        took,
    })
}

/// What the retry of an acknowledged key on the promoted standby found.
#[derive(Debug, PartialEq)]
enum Retry {
    /// The stored result: the body did not run.
    Kept,
    /// Nothing: the body ran again.
    RanAgain,
    /// A claim without its result (`Error::InProgress` until its lease ends).
    Claimed,
}

fn report(what: &str, t: &Tally) {
    eprintln!(
        "reliability failover, {what}: {KEYS} keys, WAL delayed {WAL_DELAY:?}: {} acknowledged in {:?}, {} lost \
         ({} of them found still claimed), {} run twice",
        t.acknowledged, t.took, t.lost, t.lost_claimed, t.ran_twice
    );
}

/// Without a commit level, and an asynchronous standby: what the server acknowledged but
/// had not yet streamed is gone after the promotion, and those keys run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reliability_failover_without_a_level_loses_acknowledged_results() {
    let Some(t) = failover(false, None).await else {
        return;
    };
    report("without a level, asynchronous standby", &t);
    assert_eq!(t.acknowledged, KEYS, "every call is acknowledged");
    assert!(
        t.lost > 0,
        "nothing was lost: the standby did not lag, so this run shows nothing"
    );
    assert_eq!(
        t.ran_twice + t.lost_claimed,
        t.lost,
        "each lost result runs its body again, unless its claim survived"
    );
}

/// A synchronous standby, but the server's `synchronous_commit = local` and no level from
/// idem: commits do not wait for the standby, and results are lost as with an asynchronous
/// one. (The test below differs from this one only by the level: it is what counts.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reliability_failover_a_synchronous_standby_alone_does_not_make_idem_wait() {
    let Some(t) = failover(true, None).await else {
        return;
    };
    report("without a level, synchronous standby, server local", &t);
    assert_eq!(t.acknowledged, KEYS, "every call is acknowledged");
    assert!(
        t.lost > 0,
        "nothing was lost: the standby did not lag, so this run shows nothing"
    );
}

/// With `RemoteApply` and a synchronous standby (the server itself set to
/// `synchronous_commit = local`, so only idem's level makes a commit wait): nothing
/// acknowledged is lost, no body runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reliability_failover_with_remote_apply_loses_nothing_acknowledged() {
    let Some(t) = failover(true, Some(SynchronousCommit::RemoteApply)).await else {
        return;
    };
    report("with remote_apply, synchronous standby, server local", &t);
    assert_eq!(t.acknowledged, KEYS, "every call is acknowledged");
    assert_eq!(t.lost, 0, "an acknowledged result was lost");
    assert_eq!(t.ran_twice, 0, "a body ran twice");
}

/// `On` (the standby has flushed the commit, not yet applied it): a promotion replays what
/// was flushed, so nothing acknowledged is lost either.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reliability_failover_with_on_loses_nothing_acknowledged() {
    let Some(t) = failover(true, Some(SynchronousCommit::On)).await else {
        return;
    };
    report("with on, synchronous standby, server local", &t);
    assert_eq!(t.acknowledged, KEYS, "every call is acknowledged");
    assert_eq!(t.lost, 0, "an acknowledged result was lost");
    assert_eq!(t.ran_twice, 0, "a body ran twice");
}

// ---- a standby that stops answering ------------------------------------------------------

/// With a level and the synchronous standby unreachable, Postgres holds every commit: the
/// engine's step timeout ends the step. A claim that timed out runs no body; a complete
/// that timed out after the body ran does not release the claim, and once the standby is
/// back the result (committed on the primary all along) is replayed: the body ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reliability_failover_an_unreachable_standby_fails_the_step_and_runs_no_body_twice() {
    let Some(pair) = pair(true).await else { return };
    let store = PostgresStore::builder()
        .synchronous_commit(SynchronousCommit::On)
        .connect(&url(pair.primary_port))
        .await
        .unwrap();
    wait_caught_up(&pair.admin, true).await;
    // Records every step, to show that no release follows the body.
    let recorded = support::Recorded::new(Arc::new(store));
    let idem = Idem::builder()
        .store(recorded.clone())
        // Seconds of room: a healthy claim waits for the standby's flush, which a loaded
        // machine can slow past a few hundred milliseconds.
        .store_timeout(Duration::from_secs(2))
        .lease(Duration::from_secs(6))
        .build()
        .unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let body = |runs: Arc<AtomicU32>, then: Option<Box<dyn Fn() + Send>>| async move {
        runs.fetch_add(1, Ordering::SeqCst);
        if let Some(then) = then {
            then();
        }
        7u32
    };

    // The claim: the standby is gone before it.
    pair.proxy.black_hole();
    let claim_key = Key::new("failover", "claim-times-out").unwrap();
    let started = Instant::now();
    let err = idem
        .call(claim_key.clone(), Fingerprint::NONE)
        .run(|| body(runs.clone(), None))
        .await
        .expect_err("a claim the standby never confirmed is not acquired");
    eprintln!(
        "reliability failover, claim with the standby unreachable: {err} after {:?}",
        started.elapsed()
    );
    assert!(
        matches!(
            err,
            Error::Store {
                source: StoreError::Timeout { .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the body ran without its claim"
    );
    // The server still holds that commit, in a backend of its own, whatever the client did.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let held: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
            .fetch_one(&pair.admin)
            .await
            .unwrap();
    eprintln!(
        "reliability failover, backends waiting for the standby after the claim timed out: {held}"
    );
    assert!(held >= 1, "no commit waits for the standby");

    // The standby back: the claim's commit, held until now, is confirmed, and its row is
    // there (Postgres' caveat: a commit whose wait was given up on still commits).
    pair.proxy.pass();
    pair.proxy.cut();
    wait_caught_up(&pair.admin, true).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM idem_records WHERE key = $1")
            .bind(claim_key.as_str())
            .fetch_one(&pair.admin)
            .await
            .unwrap();
        if rows == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the timed-out claim's commit did not go through once the standby answered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The complete: the standby goes away while the body runs.
    let done_key = Key::new("failover", "complete-times-out").unwrap();
    let started = Instant::now();
    let gone = pair.proxy.black_hole_switch();
    let err = idem
        .call(done_key.clone(), Fingerprint::NONE)
        .run(|| body(runs.clone(), Some(Box::new(gone))))
        .await
        .expect_err("a result the standby never confirmed is not acknowledged");
    eprintln!(
        "reliability failover, complete with the standby unreachable: {err} after {:?}",
        started.elapsed()
    );
    assert!(matches!(err, Error::Store { .. }), "{err:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let waiting: Vec<(String, i64)> = sqlx::query_as(
        "SELECT coalesce(wait_event, 'none'), count(*) FROM pg_stat_activity
         WHERE backend_type = 'client backend' AND state = 'active' AND pid <> pg_backend_pid()
         GROUP BY 1",
    )
    .fetch_all(&pair.admin)
    .await
    .unwrap();
    eprintln!(
        "reliability failover, server backends still at work after the complete timed out: \
         {waiting:?}"
    );
    let completes = recorded.steps("complete");
    eprintln!(
        "reliability failover, complete attempts: {}, all given up by the engine: {}",
        completes.len(),
        completes
            .iter()
            .all(|s| s.outcome == support::Outcome::Abandoned)
    );
    assert!(!completes.is_empty());
    assert!(
        recorded.steps("release").is_empty(),
        "a claim was released after its body ran"
    );

    pair.proxy.pass();
    pair.proxy.cut();
    wait_caught_up(&pair.admin, true).await;
    // The result, held on the primary until the standby confirmed it, is replayed.
    let deadline = Instant::now() + Duration::from_secs(15);
    let answer = loop {
        match idem
            .call(done_key.clone(), Fingerprint::NONE)
            .run(|| body(runs.clone(), None))
            .await
        {
            // In progress until the held commit shows; a step that waited on its row lock
            // may time out meanwhile.
            Err(Error::InProgress { .. } | Error::Store { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            other => break other,
        }
    };
    assert_eq!(answer.unwrap(), 7);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran twice");
}
