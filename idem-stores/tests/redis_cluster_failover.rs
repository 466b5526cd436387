//! `RedisStore` on a Redis Cluster across a failover: a private cluster of three primaries
//! and three replicas (one each), each replica following its primary through a
//! [`LinkProxy`] that holds the replication stream back, 200 keys run through the engine
//! over all three shards, every primary (or one) killed right after the last
//! acknowledgement, its replica promoted with `CLUSTER FAILOVER TAKEOVER`, and every key
//! retried on the nodes serving the slots then. Without a durability level acknowledged
//! results are lost (their retry runs the body again), on the failed shards only; with
//! `wait_for_replicas(1, ..)`, whose `WAIT` goes to the primary of the key's slot, none are.
//! RELIABILITY.md keeps the figures these tests print.
//!
//! ```text
//! IDEM_TEST_REDIS_URL=redis://127.0.0.1:6379 cargo test -p idem-stores --all-features \
//!   --test redis_cluster_failover -- --nocapture
//! ```
//!
//! How the replication link passes the proxy: in cluster mode a replica connects to its
//! primary at the address the primary announces on the cluster bus, and `REPLICAOF` is
//! refused. Each primary announces its proxy's port (`cluster-announce-port`; its bus port
//! stays its own, so gossip is direct), so the replica's link, and the clients too, reach
//! it through the proxy. The proxy holds back only what the primary sends on a connection
//! that asked for the replication stream (`PSYNC`); every other connection, the stores'
//! included, passes through untouched. The test checks that each replica's link is the
//! proxy's (`master_port`) and that each proxy carried one replication link.
//!
//! Like the other Redis test files, they skip without `IDEM_TEST_REDIS_URL` (and fail under
//! `IDEM_REQUIRE_BACKENDS=1`); the servers they use are their own `redis-server`s.
#![cfg(feature = "redis-cluster")]

mod support;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::testing::{backend_url, unique_scope};
use idem_core::{Fingerprint, Idem, InProgress};
use idem_stores::RedisStore;
use support::redis_server::{admin, key, URL_VAR};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// Keys run before the failover, spread over the three shards by their hash slots.
const KEYS: usize = 200;
/// Engines (each its own store, so its own connections) running the keys side by side: a
/// `WAIT` holds up its connection to the key's primary.
const ENGINES: usize = 40;
/// The slot ranges of the three primaries.
const SLOTS: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

/// How long the proxy holds each chunk of the replication stream: 300 ms, or
/// `IDEM_FAILOVER_DELAY_MS` (the same knob as `redis_failover.rs`).
fn link_delay() -> Duration {
    let ms = std::env::var("IDEM_FAILOVER_DELAY_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(300);
    Duration::from_millis(ms)
}

/// The durable store's replica timeout: well above the link's lag, with margin for a
/// loaded machine (it only matters when a replica is late).
fn replica_timeout() -> Duration {
    (link_delay() * 4).max(Duration::from_secs(2))
}

/// The lease of the calls before the failover: it outlasts a call's two waits for the
/// replica, and a claim a promoted replica holds without its result ends soon after the
/// failover (its retry waits for that).
fn lease() -> Duration {
    replica_timeout() * 3
}

/// One failover at a time: each starts six servers and 40 stores, and the level's waits
/// must not be slowed by another run on two cores.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// --- the replication link's proxy -----------------------------------------------------

/// A TCP proxy on 127.0.0.1 in front of a primary. A connection that sends `PSYNC` (or
/// `SYNC`) is a replica's replication link: what the primary sends on it is held for the
/// delay before it is forwarded, as a slow link or a partition holds it, without limiting
/// its throughput (each chunk is due its delay after it arrived). Every other connection
/// passes through as it is.
struct LinkProxy {
    port: u16,
    shared: Arc<LinkShared>,
    accept: JoinHandle<()>,
}

struct LinkShared {
    /// The primary's port on 127.0.0.1 (0 until it is known: connections are closed).
    upstream: AtomicU16,
    delay_ms: AtomicU64,
    /// Set by `sever`: new connections are closed at once.
    severed: AtomicBool,
    /// Bumped by `sever`: every open connection closes, dropping what it holds.
    cut: watch::Sender<u64>,
    replication_links: AtomicU32,
}

impl LinkProxy {
    /// Listens on a port of its own; [`forward_to`](Self::forward_to) names the primary.
    async fn start() -> LinkProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(LinkShared {
            upstream: AtomicU16::new(0),
            delay_ms: AtomicU64::new(0),
            severed: AtomicBool::new(false),
            cut: watch::channel(0).0,
            replication_links: AtomicU32::new(0),
        });
        let accept = tokio::spawn({
            let shared = shared.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    tokio::spawn(serve(client, shared.clone()));
                }
            }
        });
        LinkProxy {
            port,
            shared,
            accept,
        }
    }

    /// Connections from now on go to the primary on 127.0.0.1:`port`.
    fn forward_to(&self, port: u16) {
        self.shared.upstream.store(port, Ordering::SeqCst);
    }

    /// From now on each chunk of a replication stream is held `delay` before it is
    /// forwarded.
    fn hold_back(&self, delay: Duration) {
        self.shared
            .delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// The primary is gone: what the link still holds is dropped, every connection closes
    /// and new ones are closed at once.
    fn sever(&self) {
        self.shared.severed.store(true, Ordering::SeqCst);
        self.shared.cut.send_modify(|n| *n += 1);
    }

    /// How many connections asked for the replication stream so far.
    fn replication_links(&self) -> u32 {
        self.shared.replication_links.load(Ordering::SeqCst)
    }
}

impl Drop for LinkProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.sever();
    }
}

async fn serve(client: TcpStream, shared: Arc<LinkShared>) {
    let mut cut = shared.cut.subscribe();
    let upstream = shared.upstream.load(Ordering::SeqCst);
    if shared.severed.load(Ordering::SeqCst) || upstream == 0 {
        return;
    }
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        return;
    };
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let replication = AtomicBool::new(false);
    let (due, queue) = mpsc::unbounded_channel();
    tokio::select! {
        _ = requests(client_read, server_write, &replication, &shared) => {}
        // Replies a closed server sent before it closed are still delivered when due.
        _ = async {
            tokio::join!(
                replies(server_read, due, &replication, &shared),
                deliver(queue, client_write)
            )
        } => {}
        _ = cut.changed() => {}
    }
}

/// Forwards the client's bytes to the server at once, watching for the command that turns
/// the connection into a replication link.
async fn requests(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    replication: &AtomicBool,
    shared: &LinkShared,
) {
    // The command's name as a RESP bulk string (a replica sends `PSYNC <replid> <offset>`);
    // the last bytes of the chunk before are kept, for a name split between two reads.
    const MARKERS: [&[u8]; 2] = [b"$5\r\nPSYNC\r\n", b"$4\r\nSYNC\r\n"];
    let mut seen: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if !replication.load(Ordering::SeqCst) {
            seen.extend_from_slice(&buf[..n]);
            let upper = seen.to_ascii_uppercase();
            if MARKERS
                .iter()
                .any(|m| upper.windows(m.len()).any(|w| w == *m))
            {
                replication.store(true, Ordering::SeqCst);
                shared.replication_links.fetch_add(1, Ordering::SeqCst);
            }
            let keep = seen.len().saturating_sub(16);
            seen.drain(..keep);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Reads the server's bytes and queues each chunk with the moment it is due: now, or on a
/// replication link the delay from now.
async fn replies(
    mut from: tokio::net::tcp::OwnedReadHalf,
    due: mpsc::UnboundedSender<(tokio::time::Instant, Vec<u8>)>,
    replication: &AtomicBool,
    shared: &LinkShared,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut at = tokio::time::Instant::now();
        if replication.load(Ordering::SeqCst) {
            at += Duration::from_millis(shared.delay_ms.load(Ordering::SeqCst));
        }
        if due.send((at, buf[..n].to_vec())).is_err() {
            return;
        }
    }
}

async fn deliver(
    mut queue: mpsc::UnboundedReceiver<(tokio::time::Instant, Vec<u8>)>,
    mut to: tokio::net::tcp::OwnedWriteHalf,
) {
    while let Some((at, chunk)) = queue.recv().await {
        tokio::time::sleep_until(at).await;
        if to.write_all(&chunk).await.is_err() {
            return;
        }
    }
}

// --- the cluster's servers ------------------------------------------------------------

/// A cluster-enabled `redis-server` of this test's own: 127.0.0.1 on a spare port, its bus
/// on another, its directory a temp dir (the cluster's `nodes.conf` and the log, nothing
/// else: no RDB, no AOF). Killed on drop.
struct Node {
    child: Option<Child>,
    port: u16,
    bus_port: u16,
    dir: PathBuf,
}

impl Node {
    /// Starts a node on spare ports. A port chosen free may be taken before the server
    /// binds it (an outgoing connection's): the server then exits, and the node is started
    /// again on other ports, up to three times.
    async fn start(extra: &[String]) -> Node {
        let mut attempt = 1;
        loop {
            // Both bound at once, so they differ.
            let (a, b) = (
                TcpListener::bind("127.0.0.1:0").unwrap(),
                TcpListener::bind("127.0.0.1:0").unwrap(),
            );
            let (port, bus_port) = (
                a.local_addr().unwrap().port(),
                b.local_addr().unwrap().port(),
            );
            drop((a, b));
            let dir = std::env::temp_dir().join(format!(
                "idem-redis-cluster-failover-{}-{port}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let mut node = Node {
                child: None,
                port,
                bus_port,
                dir,
            };
            match node.spawn(extra).await {
                Ok(()) => return node,
                Err(log) if attempt < 3 => {
                    eprintln!(
                        "cluster node on port {port} did not come up, trying other ports: {log}"
                    );
                    attempt += 1;
                }
                Err(log) => panic!("cluster node on port {port} did not come up: {log}"),
            }
        }
    }

    /// Starts the server and waits for its `PONG`; answers its log if it does not come up.
    async fn spawn(&mut self, extra: &[String]) -> Result<(), String> {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .args(["--cluster-enabled", "yes"])
            .args(["--cluster-port", &self.bus_port.to_string()])
            .args(["--cluster-config-file", "nodes.conf"])
            // Only the test promotes a replica: none takes over on its own because a
            // loaded machine delayed its primary's pings.
            .args(["--cluster-node-timeout", "5000"])
            .args(["--cluster-replica-no-failover", "yes"])
            // Diskless full sync, at once: a replica is in sync in milliseconds.
            .args([
                "--repl-diskless-sync",
                "yes",
                "--repl-diskless-sync-delay",
                "0",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--logfile", "redis.log"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is on PATH (the Redis tests start private servers)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.pings() {
            let exited = self.child.as_mut().unwrap().try_wait().unwrap();
            if exited.is_some() || Instant::now() > deadline {
                self.kill();
                let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
                return Err(format!("{exited:?}: {log}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    fn pings(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL, as a crash: no goodbye to its clients or replicas).
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A primary, the proxy in front of it (the port it announces), and its replica.
struct Shard {
    primary: Node,
    link: LinkProxy,
    replica: Node,
}

struct Cluster {
    shards: Vec<Shard>,
    /// How many shards (the first ones) failed over.
    failed: usize,
}

/// One command on a connection of its own (a node that is starting or resyncing may
/// refuse one for a moment: `None`).
async fn query<T: ::redis::FromRedisValue>(url: &str, cmd: &::redis::Cmd) -> Option<T> {
    let mut conn = ::redis::Client::open(url)
        .ok()?
        .get_multiplexed_async_connection()
        .await
        .ok()?;
    cmd.query_async(&mut conn).await.ok()
}

fn cmd(args: &[&str]) -> ::redis::Cmd {
    let mut cmd = ::redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd
}

/// Waits until `check` holds, for at most `within`; `check` answers what it saw instead.
async fn eventually<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + within;
    while let Err(seen) = check().await {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {within:?}; last seen: {seen}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `Ok` when `holds`, else what was seen.
fn seen(holds: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if holds {
        Ok(())
    } else {
        Err(what())
    }
}

/// The masters that serve slots, by node id, in `CLUSTER NODES` as `url`'s node sees them.
async fn masters_with_slots(url: &str) -> Vec<String> {
    let nodes: String = query(url, &cmd(&["CLUSTER", "NODES"]))
        .await
        .unwrap_or_default();
    nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let flags: Vec<&str> = fields.get(2)?.split(',').collect();
            // `fail?` (suspected) and `fail` both; `nofailover` is another flag.
            let serves = fields.len() > 8
                && flags.contains(&"master")
                && !flags.iter().any(|f| f.starts_with("fail"));
            serves.then(|| fields[0].to_string())
        })
        .collect()
}

async fn state_ok(url: &str) -> bool {
    query::<String>(url, &cmd(&["CLUSTER", "INFO"]))
        .await
        .is_some_and(|i| i.contains("cluster_state:ok"))
}

/// Whether `url`'s node knows `nodes` nodes, itself included.
async fn knows(url: &str, nodes: usize) -> bool {
    query::<String>(url, &cmd(&["CLUSTER", "INFO"]))
        .await
        .is_some_and(|i| i.contains(&format!("cluster_known_nodes:{nodes}\r")))
}

impl Cluster {
    /// Starts the six nodes, joins them, gives each primary a third of the slots and each
    /// replica its primary, and waits until every replica is in sync through its proxy.
    /// `None` (skipping) when the Redis tests are not configured.
    async fn start() -> Option<Cluster> {
        backend_url(URL_VAR)?;
        let started = Instant::now();
        let mut shards = Vec::new();
        for _ in SLOTS {
            // The proxy's port first: the primary announces it.
            let link = LinkProxy::start().await;
            let primary =
                Node::start(&["--cluster-announce-port".into(), link.port.to_string()]).await;
            link.forward_to(primary.port);
            let replica = Node::start(&[]).await;
            shards.push(Shard {
                primary,
                link,
                replica,
            });
        }
        let cluster = Cluster { shards, failed: 0 };

        let first = cluster.shards[0].primary.url();
        let mut meet = admin(&first).await;
        for node in cluster.nodes().skip(1) {
            let () = cmd(&[
                "CLUSTER",
                "MEET",
                "127.0.0.1",
                &node.port.to_string(),
                &node.bus_port.to_string(),
            ])
            .query_async(&mut meet)
            .await
            .unwrap();
        }
        for (shard, (from, to)) in cluster.shards.iter().zip(SLOTS) {
            let () = cmd(&[
                "CLUSTER",
                "ADDSLOTSRANGE",
                &from.to_string(),
                &to.to_string(),
            ])
            .query_async(&mut admin(&shard.primary.url()).await)
            .await
            .unwrap();
        }
        for shard in &cluster.shards {
            let id: String = query(&shard.primary.url(), &cmd(&["CLUSTER", "MYID"]))
                .await
                .unwrap();
            // Refused ("Unknown node") until the replica has met the primary.
            let url = shard.replica.url();
            eventually(
                "a replica knows its primary",
                Duration::from_secs(20),
                || {
                    let (url, id) = (url.clone(), id.clone());
                    async move {
                        let replicated = query::<()>(&url, &cmd(&["CLUSTER", "REPLICATE", &id]))
                            .await
                            .is_some();
                        seen(replicated, || "CLUSTER REPLICATE refused".into())
                    }
                },
            )
            .await;
        }
        for shard in &cluster.shards {
            let (primary, replica) = (shard.primary.url(), shard.replica.url());
            let through = format!("master_port:{}\r", shard.link.port);
            eventually(
                "a replica is in sync through its proxy",
                Duration::from_secs(20),
                || {
                    let (primary, replica, through) =
                        (primary.clone(), replica.clone(), through.clone());
                    async move {
                        let info = |url: String| async move {
                            query::<String>(&url, &cmd(&["INFO", "replication"]))
                                .await
                                .unwrap_or_default()
                        };
                        let (r, p) = (info(replica).await, info(primary).await);
                        // After a sync the primary counts the replica for `WAIT` only once
                        // its first acknowledgement arrived (`state=online`).
                        let synced = r.contains("master_link_status:up")
                            && r.contains(&through)
                            && p.contains("connected_slaves:1")
                            && p.contains("state=online");
                        seen(synced, || format!("replica: {r}\nprimary: {p}"))
                    }
                },
            )
            .await;
            assert_eq!(
                shard.link.replication_links(),
                1,
                "the replica's link is the one connection through the proxy that asked for the stream"
            );
        }
        // Every node was met through the first primary only: the others learn of each other
        // by gossip. A node that does not know a replica yet when its primary dies has no one
        // left to hear of it from, and never sees that replica's takeover (seen once in
        // `.ci/run`: a promoted replica unknown to another 30 s after it took over). So the
        // cluster is ready once every node knows all six, not only once the slots are served.
        let all = cluster.nodes().count();
        for node in cluster.nodes() {
            let url = node.url();
            eventually(
                "every node sees the cluster ok and knows every node",
                Duration::from_secs(30),
                || {
                    let url = url.clone();
                    async move {
                        let ready = state_ok(&url).await && knows(&url, all).await;
                        seen(ready, || {
                            format!("{url} not ok, or not knowing all {all} nodes")
                        })
                    }
                },
            )
            .await;
        }
        eprintln!(
            "reliability failover, redis-cluster: 3 primaries and 3 replicas up and in sync in {:.1?}",
            started.elapsed()
        );
        Some(cluster)
    }

    fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.shards.iter().flat_map(|s| [&s.primary, &s.replica])
    }

    /// Where a client starts: the primaries, as they announce themselves.
    fn entry_points(&self) -> Vec<String> {
        self.shards
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}", s.link.port))
            .collect()
    }

    /// The primaries of the first `failed` shards die at once (what their links still hold
    /// dies with them); each of their replicas takes over its slots with `CLUSTER FAILOVER
    /// TAKEOVER` (no vote: its primary cannot take part). Answers once every live node sees
    /// the cluster ok, with the promoted replicas and the surviving primaries, and only
    /// them, serving slots.
    async fn fail_over(&mut self, failed: usize) -> Duration {
        let mut serving_after = Vec::new();
        for shard in &self.shards[failed..] {
            serving_after.push(
                query::<String>(&shard.primary.url(), &cmd(&["CLUSTER", "MYID"]))
                    .await
                    .unwrap(),
            );
        }
        for shard in &mut self.shards[..failed] {
            shard.link.sever();
            shard.primary.kill();
        }
        self.failed = failed;
        let started = Instant::now();
        for shard in &self.shards[..failed] {
            let url = shard.replica.url();
            let () = cmd(&["CLUSTER", "FAILOVER", "TAKEOVER"])
                .query_async(&mut admin(&url).await)
                .await
                .unwrap();
            serving_after.push(
                query::<String>(&url, &cmd(&["CLUSTER", "MYID"]))
                    .await
                    .unwrap(),
            );
        }
        serving_after.sort();
        for url in self.serving() {
            eventually(
                "the promoted replicas and the surviving primaries serve every slot",
                Duration::from_secs(30),
                || {
                    let (url, promoted) = (url.clone(), serving_after.clone());
                    async move {
                        let mut serving = masters_with_slots(&url).await;
                        serving.sort();
                        if serving == promoted && state_ok(&url).await {
                            return Ok(());
                        }
                        let nodes: String = query(&url, &cmd(&["CLUSTER", "NODES"]))
                            .await
                            .unwrap_or_default();
                        let info: String = query(&url, &cmd(&["CLUSTER", "INFO"]))
                            .await
                            .unwrap_or_default();
                        Err(format!(
                            "{promoted:?} should serve; {url} sees {serving:?} serving:\n{nodes}\n{info}"
                        ))
                    }
                },
            )
            .await;
        }
        started.elapsed()
    }

    /// The nodes serving slots after [`fail_over`](Self::fail_over): the promoted replicas
    /// and the surviving primaries.
    fn serving(&self) -> Vec<String> {
        let (failed, survived) = self.shards.split_at(self.failed);
        let promoted = failed.iter().map(|s| s.replica.url());
        promoted
            .chain(survived.iter().map(|s| s.primary.url()))
            .collect()
    }
}

// --- the failover ---------------------------------------------------------------------

/// What a failover did to the keys run before it.
#[derive(Debug)]
struct Figures {
    keys: usize,
    /// Keys per shard, by their hash slots.
    per_shard: [usize; 3],
    /// How many shards (the first ones) failed over.
    failed: usize,
    /// Calls that returned Ok before the failover.
    acknowledged: usize,
    /// Acknowledged keys whose retry after the failover ran the body again.
    lost: usize,
    /// The same, by shard.
    lost_per_shard: [usize; 3],
    /// Keys whose body ran more than once, before and after the failover together.
    run_twice: usize,
    /// How long the keys took before the failover.
    took: Duration,
    /// From the kill to the promoted replicas serving every slot.
    failover: Duration,
}

async fn stores(cluster: &Cluster, replicas: u32) -> Vec<RedisStore> {
    let mut out = Vec::new();
    for _ in 0..ENGINES {
        let store = RedisStore::builder()
            .wait_for_replicas(replicas, replica_timeout())
            // The script and its WAIT share the command timeout; the engine's step
            // timeout is raised in `run_and_fail_over` to match.
            .command_timeout(replica_timeout() + Duration::from_secs(1))
            .open_cluster(cluster.entry_points())
            .await
            .unwrap();
        out.push(store);
    }
    out
}

/// Runs [`KEYS`] keys through engines on `stores`, kills the primaries of the first
/// `failed` shards right after the last answer, promotes their replicas, and retries every
/// key on the nodes that serve the slots then.
async fn run_and_fail_over(
    mut cluster: Cluster,
    stores: Vec<RedisStore>,
    failed: usize,
) -> Figures {
    let durable = stores[0].replicas().is_some();
    let scope = unique_scope("redis-cluster-failover");
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..KEYS).map(|_| AtomicU32::new(0)).collect());

    // Where the keys live: the shard whose range holds each record key's slot.
    let mut per_shard = [0; 3];
    let mut shard_of = Vec::new();
    let mut slots = admin(&cluster.shards[0].primary.url()).await;
    for k in 0..KEYS {
        let record = stores[0].record_key(&key(&scope, &k.to_string()));
        let slot: u16 = cmd(&["CLUSTER", "KEYSLOT", &record])
            .query_async(&mut slots)
            .await
            .unwrap();
        let shard = SLOTS.iter().position(|(_, to)| slot <= *to).unwrap();
        per_shard[shard] += 1;
        shard_of.push(shard);
    }
    assert!(
        per_shard.iter().all(|n| *n >= KEYS / 6),
        "the keys spread over the three shards: {per_shard:?}"
    );

    for shard in &cluster.shards {
        shard.link.hold_back(link_delay());
    }
    let started = Instant::now();
    let tasks: Vec<_> = stores
        .into_iter()
        .enumerate()
        .map(|(e, store)| {
            let (scope, runs) = (scope.clone(), runs.clone());
            tokio::spawn(async move {
                let idem = Idem::builder()
                    .store(store)
                    .store_timeout(replica_timeout() + Duration::from_secs(2))
                    .build()
                    .unwrap();
                let mut acknowledged = Vec::new();
                for k in (e..KEYS).step_by(ENGINES) {
                    let runs = runs.clone();
                    let res = idem
                        .call(key(&scope, &k.to_string()), Fingerprint::NONE)
                        .lease(lease())
                        .run(|| async move {
                            runs[k].fetch_add(1, Ordering::SeqCst);
                            format!("v{k}")
                        })
                        .await;
                    match res {
                        Ok(v) => {
                            assert_eq!(v, format!("v{k}"));
                            acknowledged.push(k);
                        }
                        Err(e) => eprintln!("key {k} before the failover: {e}"),
                    }
                }
                acknowledged
            })
        })
        .collect();
    let mut acknowledged = [false; KEYS];
    for task in tasks {
        for k in task.await.unwrap() {
            acknowledged[k] = true;
        }
    }
    let took = started.elapsed();
    let failover = cluster.fail_over(failed).await;

    let idem = Idem::new(
        RedisStore::builder()
            .open_cluster(cluster.serving())
            .await
            .unwrap(),
    );
    let mut lost_per_shard = [0; 3];
    for (k, acked) in acknowledged.iter().enumerate() {
        let before = runs[k].load(Ordering::SeqCst);
        let counter = runs.clone();
        let v = idem
            .call(key(&scope, &k.to_string()), Fingerprint::NONE)
            // A claim a promoted replica holds without its result: taken over once its
            // lease ends.
            .in_progress(InProgress::Wait)
            .wait_timeout(lease() + Duration::from_secs(1))
            .run(|| async move {
                counter[k].fetch_add(1, Ordering::SeqCst);
                format!("v{k}")
            })
            .await
            .unwrap_or_else(|e| panic!("key {k} after the failover: {e}"));
        assert_eq!(v, format!("v{k}"));
        if *acked && runs[k].load(Ordering::SeqCst) > before {
            lost_per_shard[shard_of[k]] += 1;
        }
    }
    let run_twice = runs.iter().filter(|r| r.load(Ordering::SeqCst) > 1).count();
    let figures = Figures {
        keys: KEYS,
        per_shard,
        failed,
        acknowledged: acknowledged.iter().filter(|a| **a).count(),
        lost: lost_per_shard.iter().sum(),
        lost_per_shard,
        run_twice,
        took,
        failover,
    };
    let level = if durable {
        "wait_for_replicas(1, ..)"
    } else {
        "off"
    };
    eprintln!(
        "reliability failover, redis-cluster, level {level}, {} of 3 primaries killed: {} keys ({:?} per shard), \
         link delayed {:?}: {} acknowledged in {:.1?}, {} lost ({:?} per shard), {} run twice; \
         every slot served again {:.1?} after the kill",
        figures.failed,
        figures.keys,
        figures.per_shard,
        link_delay(),
        figures.acknowledged,
        figures.took,
        figures.lost,
        figures.lost_per_shard,
        figures.run_twice,
        figures.failover
    );
    // A row of RELIABILITY.md's table.
    eprintln!(
        "| {level} | {} of 3 | {:?} | {} | {} | {} | {} | {} | {:.1?} | {:.1?} |",
        figures.failed,
        link_delay(),
        if durable {
            format!("{:?}", replica_timeout())
        } else {
            "-".into()
        },
        figures.keys,
        figures.acknowledged,
        figures.lost,
        figures.run_twice,
        figures.took,
        figures.failover
    );
    figures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_failover_cluster_without_the_level_loses_acknowledged_results() {
    let _turn = TURN.lock().await;
    let Some(cluster) = Cluster::start().await else {
        return;
    };
    let stores = stores(&cluster, 0).await;
    assert_eq!(stores[0].replicas(), None, "off by default");
    let figures = run_and_fail_over(cluster, stores, 3).await;
    assert_eq!(
        figures.acknowledged, figures.keys,
        "healthy primaries answer every call"
    );
    assert!(
        figures.lost > 0,
        "the replicas lagged {:?} behind, so results acknowledged by the primaries alone must have been lost: {figures:?}",
        link_delay()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_failover_cluster_with_one_replica_acknowledging_loses_nothing() {
    let _turn = TURN.lock().await;
    let Some(cluster) = Cluster::start().await else {
        return;
    };
    let stores = stores(&cluster, 1).await;
    assert_eq!(stores[0].replicas(), Some((1, replica_timeout())));
    let figures = run_and_fail_over(cluster, stores, 3).await;
    assert_eq!(
        figures.acknowledged, figures.keys,
        "each replica acknowledges within the timeout: {figures:?}"
    );
    assert_eq!(figures.lost, 0, "{figures:?}");
    assert_eq!(figures.run_twice, 0, "{figures:?}");
}

/// One shard fails over, the other two keep their primaries: only keys of that shard are
/// lost, and the others replay from the primaries that held them all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_failover_cluster_of_one_primary_loses_only_its_shards_results() {
    let _turn = TURN.lock().await;
    let Some(cluster) = Cluster::start().await else {
        return;
    };
    let stores = stores(&cluster, 0).await;
    let figures = run_and_fail_over(cluster, stores, 1).await;
    assert_eq!(figures.acknowledged, figures.keys);
    assert!(
        figures.lost_per_shard[0] > 0,
        "the failed shard's replica lagged {:?} behind: {figures:?}",
        link_delay()
    );
    assert_eq!(
        figures.lost_per_shard[1..],
        [0, 0],
        "the surviving primaries hold every result they acknowledged: {figures:?}"
    );
}
