//! What the Redis test files share: the shared test server of `IDEM_TEST_REDIS_URL` and the
//! cluster of `IDEM_TEST_REDIS_CLUSTER`, a plain connection to poke a server behind the
//! store's back, command counts from `INFO commandstats`, a subscriber that keeps idem's
//! warnings, a resent-claims race, and a private `redis-server` a test owns (to count its
//! commands, stop it, freeze it or fill it without disturbing anyone).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use idem_core::testing::backend_url;
use idem_core::{Claim, Fingerprint, Idem, InProgress, Key, Store, Token};
use idem_stores::RedisStore;

use super::ClaimFresh;

pub const URL_VAR: &str = "IDEM_TEST_REDIS_URL";

pub async fn shared_store() -> Option<RedisStore> {
    let url = backend_url(URL_VAR)?;
    Some(
        RedisStore::open(&url)
            .await
            .expect("connect to IDEM_TEST_REDIS_URL"),
    )
}

/// A plain connection for looking at and poking the server behind the store's back.
pub async fn admin(url: &str) -> ::redis::aio::MultiplexedConnection {
    ::redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("admin connection")
}

pub fn key(scope: &str, id: &str) -> Key {
    Key::new(scope, id).unwrap()
}

/// What a claim of `k` with a token of its own (no fingerprint, a 30 s lease) answers.
pub async fn claim_new(store: &dyn Store, k: &Key) -> Claim {
    store.claim_fresh(k, Duration::from_secs(30)).await.unwrap()
}

/// Claims `k` with a token of its own and completes it with `payload` (kept 60 s).
pub async fn complete_new(store: &dyn Store, k: &Key, payload: idem_core::Bytes) {
    let Claim::Acquired { token, .. } = claim_new(store, k).await else {
        panic!("{k}: a fresh key was not acquired");
    };
    store
        .complete(k, token, payload, Duration::from_secs(60))
        .await
        .unwrap();
}

/// An engine on `store` whose callers of a key in progress wait for it (up to 20 s).
pub fn waiting_engine(store: RedisStore) -> Idem {
    Idem::builder()
        .store(store)
        .in_progress(InProgress::Wait)
        .wait_timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// Closes every client connection of the server but `admin`'s own (`CLIENT KILL TYPE
/// normal SKIPME yes`): how many it closed.
pub async fn kill_normal_clients(admin: &mut ::redis::aio::MultiplexedConnection) -> i64 {
    ::redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query_async(admin)
        .await
        .unwrap()
}

// --- a cluster -------------------------------------------------------------------------

pub const CLUSTER_VAR: &str = "IDEM_TEST_REDIS_CLUSTER";

/// The node URLs of a cluster spec, whichever form it has: `redis+cluster://h1:p1,h2:p2`
/// (what `.ci/run` sets) or a comma-separated list of `redis://host:port` URLs.
pub fn cluster_nodes(spec: &str) -> Vec<String> {
    let list = spec.strip_prefix("redis+cluster://").unwrap_or(spec);
    list.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| {
            if n.contains("://") {
                n.to_string()
            } else {
                format!("redis://{n}")
            }
        })
        .collect()
}

/// A store on the cluster of `IDEM_TEST_REDIS_CLUSTER`, or `None` (skipping) when unset.
#[cfg(feature = "redis-cluster")]
pub async fn cluster_store() -> Option<RedisStore> {
    let spec = backend_url(CLUSTER_VAR)?;
    Some(
        RedisStore::builder()
            .open_cluster(cluster_nodes(&spec))
            .await
            .expect("connect to IDEM_TEST_REDIS_CLUSTER"),
    )
}

// --- counting commands -----------------------------------------------------------------

/// `INFO commandstats` of one server as command -> calls.
pub async fn command_calls(conn: &mut ::redis::aio::MultiplexedConnection) -> HashMap<String, u64> {
    let info: String = ::redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let calls = rest
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}

/// The commands that ran between two snapshots of `command_calls`, those that did.
pub fn delta(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> HashMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

/// What `run` answers, and the commands the server ran while it did (a `delta`).
pub async fn counted<T>(
    admin: &mut ::redis::aio::MultiplexedConnection,
    run: impl std::future::Future<Output = T>,
) -> (T, HashMap<String, u64>) {
    let before = command_calls(admin).await;
    let out = run.await;
    let after = command_calls(admin).await;
    (out, delta(&before, &after))
}

/// Round trips in a `delta`: the scripts the store ran, plus any command other than those
/// the scripts run inside (GET, SET, DEL, TIME) and the INFO that took the snapshot.
pub fn round_trips(d: &HashMap<String, u64>) -> u64 {
    d.iter()
        .filter(|(k, _)| !matches!(k.as_str(), "get" | "set" | "del" | "time" | "info"))
        .map(|(_, v)| v)
        .sum()
}

// --- idem's warnings -------------------------------------------------------------------

/// idem's warnings and errors, as `LEVEL field=value ...` lines. A test that runs on a
/// thread of its own installs one with `set_default`; one whose binary has several tests
/// on several threads takes `Logged::global()`, since a thread-local subscriber loses
/// events once a sibling thread without one reached the callsite first (tracing caches
/// interest process-wide).
#[derive(Clone, Default)]
pub struct Logged(Arc<Mutex<Vec<String>>>);

impl Logged {
    /// The process's global subscriber, installed on first use.
    pub fn global() -> &'static Logged {
        static GLOBAL: OnceLock<Logged> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            let logged = Logged::default();
            tracing::subscriber::set_global_default(logged.clone())
                .expect("no other global subscriber in this test binary");
            logged
        })
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// How many lines so far (to take those after a point with `lines()[n..]`).
    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// The lines at `level` that name `port` (a server of the test's own).
    pub fn of(&self, level: tracing::Level, port: u16) -> Vec<String> {
        let port = format!("127.0.0.1:{port}");
        let level = format!("{level} ");
        let all = self.0.lock().unwrap();
        all.iter()
            .filter(|e| e.starts_with(&level) && e.contains(&port))
            .cloned()
            .collect()
    }
}

impl tracing::Subscriber for Logged {
    fn enabled(&self, meta: &tracing::Metadata<'_>) -> bool {
        *meta.level() <= tracing::Level::WARN && meta.target() == "idem"
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Text(String);
        impl tracing::field::Visit for Text {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!("{}={:?} ", field.name(), value));
            }
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                self.0.push_str(&format!("{}={} ", field.name(), value));
            }
        }
        let mut text = Text(format!("{} ", event.metadata().level()));
        event.record(&mut text);
        self.0.lock().unwrap().push(text.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

// --- resent claims ---------------------------------------------------------------------

/// 40 claims at once: 20 resends of one token on `resent` all acquire, while 20 with tokens
/// of their own on `raced` have exactly one winner.
pub async fn resends_acquire_while_own_tokens_race(
    store: &RedisStore,
    resent: Key,
    raced: Key,
    fp: Fingerprint,
    lease: Duration,
) {
    let shared = Token::random();
    let barrier = Arc::new(tokio::sync::Barrier::new(40));
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let (store, barrier) = (store.clone(), barrier.clone());
            let (k, t) = if i % 2 == 0 {
                (resent.clone(), shared)
            } else {
                (raced.clone(), Token::random())
            };
            tokio::spawn(async move {
                barrier.wait().await;
                (i % 2, store.claim(&k, &fp, t, lease).await.unwrap())
            })
        })
        .collect();
    let mut acquired = [0, 0];
    for task in tasks {
        let (which, claim) = task.await.unwrap();
        match claim {
            Claim::Acquired { .. } => acquired[which] += 1,
            Claim::InProgress { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(acquired, [20, 1], "[resends of one token, own tokens]");
}

// --- a private redis-server -----------------------------------------------------------

/// A `redis-server` this test owns: 127.0.0.1 on a spare port, nothing on disk, killed on
/// drop.
pub struct PrivateRedis {
    child: Option<Child>,
    port: u16,
    dir: std::path::PathBuf,
    extra: Vec<String>,
}

impl PrivateRedis {
    /// Starts one, or answers `None` (skipping) when the Redis tests are not configured.
    pub fn start(extra: &[&str]) -> Option<PrivateRedis> {
        backend_url(URL_VAR)?;
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir =
            std::env::temp_dir().join(format!("idem-redis-test-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = PrivateRedis {
            child: None,
            port,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        server.spawn();
        Some(server)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is on PATH (the Redis tests start private servers)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.pings() {
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not come up",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pings(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    /// Kills the server (as a crash would: no goodbye to its clients).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes or thaws the server process (SIGSTOP / SIGCONT): it keeps its connections
    /// but answers nothing.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let ok = Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {signal} {pid}");
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.signal_quietly("-CONT");
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl PrivateRedis {
    pub fn signal_quietly(&self, signal: &str) -> std::io::Result<()> {
        let pid = self
            .child
            .as_ref()
            .map(|c| c.id().to_string())
            .unwrap_or_default();
        Command::new("kill")
            .args([signal, &pid])
            .status()
            .map(|_| ())
    }
}
