//! What the end-to-end tests share: stores per backend, a test app, a real server.
#![allow(dead_code, unused_macros)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing;
use axum::{Json, Router};
use idem_core::{
    async_trait, Bytes, Claim, Fingerprint, Idem, Key, Record, Store, StoreError, Token,
};
use idem_http::IdempotencyKey;
use tokio::sync::{oneshot, Notify, Semaphore};

/// A store for one backend, or `None` (skipped) when its server is not configured.
pub enum Backend {
    Sqlite,
    Postgres,
    Redis,
}

/// An engine on `backend`, wrapped in [`Watched`]; the tempdir keeps a SQLite file alive.
pub async fn idem_on(backend: Backend) -> Option<(Idem, Arc<Watched>, Option<tempfile::TempDir>)> {
    let (store, dir): (Arc<dyn Store>, _) = match backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().expect("tempdir");
            let store = idem_stores::SqliteStore::open(dir.path().join("idem.db"))
                .await
                .expect("sqlite store");
            store.migrate().await.expect("migrate");
            (Arc::new(store), Some(dir))
        }
        Backend::Postgres => {
            let url = idem_core::testing::backend_url("IDEM_TEST_POSTGRES_URL")?;
            let store = idem_stores::PostgresStore::connect(&url)
                .await
                .expect("postgres store")
                .with_table("idem_http_test_records")
                .expect("table name");
            store.migrate().await.expect("migrate");
            (Arc::new(store), None)
        }
        Backend::Redis => {
            let url = idem_core::testing::backend_url("IDEM_TEST_REDIS_URL")?;
            let store = idem_stores::RedisStore::builder()
                .prefix("idem-http-test:")
                .open(&url)
                .await
                .expect("redis store");
            (Arc::new(store), None)
        }
    };
    let watched = Arc::new(Watched::new(store));
    let idem = Idem::builder()
        .shared_store(watched.clone())
        .build()
        .expect("engine");
    Some((idem, watched, dir))
}

/// A scope no other run shares, so that parallel runs on one server cannot interfere.
pub fn unique_scope(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("http_{test}_{}_{nanos}", std::process::id())
}

/// A store that counts the claims answered `InProgress`, so that a test can wait until a
/// duplicate has really met a running request.
#[derive(Debug)]
pub struct Watched {
    inner: Arc<dyn Store>,
    pub in_progress_claims: AtomicUsize,
    pub changed: Notify,
}

impl Watched {
    fn new(inner: Arc<dyn Store>) -> Self {
        Watched {
            inner,
            in_progress_claims: AtomicUsize::new(0),
            changed: Notify::new(),
        }
    }

    /// Waits until at least `n` claims were answered `InProgress`.
    pub async fn until_in_progress(&self, n: usize) {
        within(async {
            loop {
                let notified = self.changed.notified();
                if self.in_progress_claims.load(Ordering::SeqCst) >= n {
                    return;
                }
                notified.await;
            }
        })
        .await
    }
}

/// Every step but the claim is the inner store's, through `StoreWrapper`'s defaults.
#[async_trait]
impl idem_core::StoreWrapper for Watched {
    type Inner = dyn Store;
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }
    async fn claim(
        &self,
        key: &Key,
        fp: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let claim = self.inner.claim(key, fp, token, lease).await?;
        if matches!(claim, Claim::InProgress { .. }) {
            self.in_progress_claims.fetch_add(1, Ordering::SeqCst);
            self.changed.notify_waiters();
        }
        Ok(claim)
    }
}

/// A store whose server is down: every step fails as unreachable.
#[derive(Debug)]
pub struct DownStore;

fn down() -> StoreError {
    StoreError::Unavailable {
        backend: "down",
        source: "connection refused".into(),
    }
}

#[async_trait]
impl Store for DownStore {
    async fn claim(
        &self,
        _: &Key,
        _: &Fingerprint,
        _: Token,
        _: Duration,
    ) -> Result<Claim, StoreError> {
        Err(down())
    }
    async fn complete(&self, _: &Key, _: Token, _: Bytes, _: Duration) -> Result<(), StoreError> {
        Err(down())
    }
    async fn release(&self, _: &Key, _: Token) -> Result<(), StoreError> {
        Err(down())
    }
    async fn extend(&self, _: &Key, _: Token, _: Duration) -> Result<(), StoreError> {
        Err(down())
    }
    async fn get(&self, _: &Key) -> Result<Option<Record>, StoreError> {
        Err(down())
    }
    async fn delete(&self, _: &Key) -> Result<bool, StoreError> {
        Err(down())
    }
}

/// A bound on every wait of a test, so that a broken promise fails instead of hanging.
pub async fn within<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .expect("the awaited event did not happen within 20 s")
}

/// The test app's side effects, and the gate that holds a charge until the test opens it.
#[derive(Default)]
pub struct Shop {
    pub charges: AtomicUsize,
    pub declines: AtomicUsize,
    pub failures: AtomicUsize,
    pub reads: AtomicUsize,
    /// When set, a charge waits for one permit before it charges.
    pub gate: Mutex<Option<Arc<Semaphore>>>,
    /// Notified when a charge has started (before the gate).
    pub entered: Notify,
    pub keys_seen: Mutex<Vec<String>>,
}

impl Shop {
    pub fn charges(&self) -> usize {
        self.charges.load(Ordering::SeqCst)
    }

    /// Makes the next charges wait until [`open`](Self::open).
    pub fn close_gate(&self) -> Arc<Semaphore> {
        let gate = Arc::new(Semaphore::new(0));
        *self.gate.lock().unwrap() = Some(gate.clone());
        gate
    }
}

pub const ORDER: &str = r#"{"order_id":"o-1","amount":1000,"currency":"EUR"}"#;

async fn charge(State(shop): State<Arc<Shop>>, key: IdempotencyKey, body: Bytes) -> Response {
    shop.entered.notify_one();
    let gate = shop.gate.lock().unwrap().clone();
    if let Some(gate) = gate {
        gate.acquire().await.expect("gate open").forget();
    }
    shop.keys_seen.lock().unwrap().push(key.into_string());
    let n = shop.charges.fetch_add(1, Ordering::SeqCst) + 1;
    let order: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    (
        StatusCode::CREATED,
        [
            ("location", format!("/charges/{n}")),
            ("x-first-only", "1".into()),
        ],
        Json(serde_json::json!({ "charge": n, "order": order })),
    )
        .into_response()
}

async fn decline(State(shop): State<Arc<Shop>>) -> Response {
    let n = shop.declines.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::PAYMENT_REQUIRED,
        Json(serde_json::json!({ "declined": n })),
    )
        .into_response()
}

/// Fails the first time (500), succeeds after.
async fn flaky(State(shop): State<Arc<Shop>>) -> Response {
    let n = shop.failures.fetch_add(1, Ordering::SeqCst) + 1;
    if n == 1 {
        (StatusCode::INTERNAL_SERVER_ERROR, "try again").into_response()
    } else {
        (StatusCode::OK, format!("attempt {n}")).into_response()
    }
}

async fn read(State(shop): State<Arc<Shop>>, _headers: HeaderMap) -> Response {
    let n = shop.reads.fetch_add(1, Ordering::SeqCst) + 1;
    (StatusCode::OK, format!("read {n}")).into_response()
}

/// The routes: `POST /charge`, `POST /decline` (402), `POST /flaky` (500 once), `GET /charge`.
pub fn routes(shop: Arc<Shop>) -> Router {
    Router::new()
        .route("/charge", routing::post(charge).get(read))
        .route("/decline", routing::post(decline))
        .route("/flaky", routing::post(flaky))
        .with_state(shop)
}

/// A real server on 127.0.0.1:0.
pub struct Server {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    pub async fn start(app: Router) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    stopped.await.ok();
                })
                .await
                .expect("serve");
        });
        Server {
            addr,
            stop: Some(stop),
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Stops accepting, and waits for the open connections to finish.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            stop.send(()).ok();
        }
        within(&mut self.task).await.expect("server task");
    }
}

/// A client that opens a fresh connection per request, so that a server restart is clean.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client")
}

/// Sends one POST with `key` (if any) and `body`.
pub async fn post(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: &str,
) -> reqwest::Response {
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    req.send().await.expect("request")
}

/// Sends one POST with `key`, `body` and the given extra headers.
pub async fn send(
    c: &reqwest::Client,
    url: &str,
    key: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> reqwest::Response {
    let mut req = c
        .post(url)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body.to_owned());
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.send().await.expect("request")
}

/// Status, the replay header, and the body, read.
pub async fn parts(res: reqwest::Response) -> (u16, Option<String>, String) {
    let status = res.status().as_u16();
    let replayed = res
        .headers()
        .get("idempotent-replayed")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, replayed, res.text().await.expect("body"))
}

/// The problem's `type`, after checking the media type.
pub async fn problem_type(res: reqwest::Response) -> (u16, String, serde_json::Value) {
    let status = res.status().as_u16();
    assert_eq!(
        res.headers()["content-type"],
        "application/problem+json",
        "an error body is a problem"
    );
    let body: serde_json::Value = res.json().await.expect("problem json");
    assert_eq!(body["status"], status, "the problem repeats the status");
    (status, body["type"].as_str().unwrap().to_owned(), body)
}

/// Stamps one `#[tokio::test]` per backend for each scenario `async fn name(Backend)`:
/// `sqlite::name` always runs; `postgres::name` and `redis::name` skip (or fail, with
/// `IDEM_REQUIRE_BACKENDS=1`) when their server is not configured.
macro_rules! per_backend {
    ($($scenario:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() { super::$scenario(super::Backend::Sqlite).await })*
        }
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() { super::$scenario(super::Backend::Postgres).await })*
        }
        mod redis {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() { super::$scenario(super::Backend::Redis).await })*
        }
    };
}

/// The secret the tests key credential digests with.
pub const TEST_SECRET: &[u8] = b"the tests' deployment secret";

/// The layer as the tests of other behaviours set it up: a scope of its own, credentials
/// digested with [`TEST_SECRET`], and requests without credentials sharing one key space
/// (written down: `share_anonymous`).
pub fn open_layer(idem: Idem) -> idem_http::IdempotencyLayer {
    idem_http::IdempotencyLayer::new(idem)
        .scope(unique_scope("open"))
        .client_identity(
            idem_http::ClientIdentity::credentials()
                .keyed(TEST_SECRET)
                .share_anonymous(),
        )
}
