//! What the Redis test files (`redis.rs`, `redis_faults.rs`, `redis_operations.rs`) share:
//! the shared test server of `IDEM_TEST_REDIS_URL`, a plain connection to poke it behind
//! the store's back, and a private `redis-server` a test owns (to count its commands, stop
//! it, freeze it or fill it without disturbing anyone).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem_core::testing::backend_url;
use idem_core::Key;
use idem_stores::RedisStore;

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
