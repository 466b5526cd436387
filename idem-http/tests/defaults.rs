//! The layer's defaults keep the engine's promise, end to end: a real axum server
//! on 127.0.0.1, a real reqwest client (and `IdempotentClient` where the client matters),
//! on SQLite always and Postgres and Redis when configured.

#[macro_use]
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post as route_post;
use axum::Router;
use idem_http::{BodyFingerprint, IdempotencyLayer, IdempotentClient, RetryPolicy, RetrySafe};
use support::*;

fn layer(idem: &idem_core::Idem, test: &str) -> IdempotencyLayer {
    open_layer(idem.clone()).scope(unique_scope(test))
}

/// With the default layer (no `principal`), another client sending the first client's
/// key and body is a request of its own: it never sees the first one's response, nor learns
/// with a 422 that the key exists. Each client's own retry still replays.
async fn a_stored_response_never_reaches_another_client(backend: Backend) {
    let Some((idem, _, _dir)) = idem_on(backend).await else {
        return;
    };
    let shop = Arc::new(Shop::default());
    let server = Server::start(routes(shop.clone()).layer(layer(&idem, "clients"))).await;
    let c = client();
    let url = server.url("/charge");
    let alice = [("authorization", "Bearer alice-token")];
    let bob = [("authorization", "Bearer bob-token")];
    let carol = [("cookie", "theme=dark; session=carol-session")];

    let (s, r, alices) = parts(send(&c, &url, "order-1", &alice, ORDER).await).await;
    assert_eq!((s, r), (201, None));
    let (s, r, bobs) = parts(send(&c, &url, "order-1", &bob, ORDER).await).await;
    assert_eq!((s, r), (201, None), "bob is not served alice's response");
    assert_ne!(alices, bobs);
    let other = r#"{"order_id":"o-2","amount":1,"currency":"EUR"}"#;
    let (s, _, _) = parts(send(&c, &url, "order-1", &carol, other).await).await;
    assert_eq!(s, 201, "no 422 tells carol that the key exists");
    assert_eq!(shop.charges(), 3);

    // Their own retries replay (carol's cookies in another order).
    assert_eq!(
        parts(send(&c, &url, "order-1", &alice, ORDER).await).await,
        (201, Some("true".into()), alices)
    );
    assert_eq!(
        parts(send(&c, &url, "order-1", &bob, ORDER).await).await,
        (201, Some("true".into()), bobs)
    );
    let carol_again = [("cookie", "session=carol-session; theme=dark")];
    let (s, r, _) = parts(send(&c, &url, "order-1", &carol_again, other).await).await;
    assert_eq!((s, r.as_deref()), (201, Some("true")));
    assert_eq!(shop.charges(), 3);
}

/// Keys shared on purpose: the visible opt-out.
async fn shared_keys_are_an_opt_out(backend: Backend) {
    let Some((idem, _, _dir)) = idem_on(backend).await else {
        return;
    };
    let shop = Arc::new(Shop::default());
    let layer = layer(&idem, "shared").client_identity(idem_http::ClientIdentity::shared());
    let server = Server::start(routes(shop.clone()).layer(layer)).await;
    let c = client();
    let url = server.url("/charge");
    send(&c, &url, "k", &[("authorization", "Bearer a")], ORDER).await;
    let (s, r, _) = parts(send(&c, &url, "k", &[("authorization", "Bearer b")], ORDER).await).await;
    assert_eq!((s, r.as_deref()), (201, Some("true")));
    assert_eq!(shop.charges(), 1);
}

/// A handler that charges the account in its path.
async fn charge_account(
    State(charges): State<Arc<AtomicUsize>>,
    Path(acct): Path<String>,
) -> Response {
    charges.fetch_add(1, Ordering::SeqCst);
    (StatusCode::CREATED, format!("charged account {acct}")).into_response()
}

/// Under `nest`, the fingerprint sees the path the client sent: account 2 with account
/// 1's key is another request (422), never account 1's response. Both with the layer as a
/// `route_layer` inside the nested router and as a `layer` on it.
async fn a_replay_is_never_served_for_another_path(backend: Backend) {
    let Some((idem, _, _dir)) = idem_on(backend).await else {
        return;
    };
    for (i, as_route_layer) in [true, false].into_iter().enumerate() {
        let charges = Arc::new(AtomicUsize::new(0));
        let l = layer(&idem, &format!("nest{i}"));
        let accounts: Router<Arc<AtomicUsize>> =
            Router::new().route("/charge", route_post(charge_account));
        let accounts = if as_route_layer {
            accounts.route_layer(l)
        } else {
            accounts.layer(l)
        };
        let app = Router::new()
            .nest("/accounts/{acct}", accounts)
            .with_state(charges.clone());
        let server = Server::start(app).await;
        let c = client();
        let (s, _, body) =
            parts(send(&c, &server.url("/accounts/1/charge"), "k", &[], ORDER).await).await;
        assert_eq!((s, body.as_str()), (201, "charged account 1"));
        let res = send(&c, &server.url("/accounts/2/charge"), "k", &[], ORDER).await;
        assert!(res.headers().get("idempotent-replayed").is_none());
        let (s, kind, _) = problem_type(res).await;
        assert_eq!(
            (s, kind.as_str()),
            (422, "urn:idem:problem:key-reuse"),
            "route_layer: {as_route_layer}"
        );
        let (s, r, body) =
            parts(send(&c, &server.url("/accounts/2/charge"), "k2", &[], ORDER).await).await;
        assert_eq!((s, r, body.as_str()), (201, None, "charged account 2"));
        let (_, r, _) =
            parts(send(&c, &server.url("/accounts/1/charge"), "k", &[], ORDER).await).await;
        assert_eq!(r.as_deref(), Some("true"));
        assert_eq!(charges.load(Ordering::SeqCst), 2);
    }
}

/// The routes of the retry-policy tests: each counts its runs.
#[derive(Default)]
struct Effects {
    runs: AtomicUsize,
    safe_runs: AtomicUsize,
}

async fn charge_then_500(State(e): State<Arc<Effects>>) -> Response {
    e.runs.fetch_add(1, Ordering::SeqCst);
    (StatusCode::INTERNAL_SERVER_ERROR, "charged, then failed").into_response()
}

async fn charge_then_panic(State(e): State<Arc<Effects>>) -> Response {
    e.runs.fetch_add(1, Ordering::SeqCst);
    panic!("the receipt printer caught fire");
}

/// Nothing happens on the first run (the provider was down), and it says so.
async fn safe_then_charge(State(e): State<Arc<Effects>>) -> Response {
    e.runs.fetch_add(1, Ordering::SeqCst);
    let n = e.safe_runs.fetch_add(1, Ordering::SeqCst) + 1;
    if n == 1 {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            RetrySafe,
            "nothing charged",
        )
            .into_response()
    } else {
        (StatusCode::CREATED, format!("charged on run {n}")).into_response()
    }
}

async fn outcome_server(idem: &idem_core::Idem, test: &str) -> (Server, Arc<Effects>) {
    let effects = Arc::new(Effects::default());
    let app = Router::new()
        .route("/fail", route_post(charge_then_500))
        .route("/panic", route_post(charge_then_panic))
        .route("/safe", route_post(safe_then_charge))
        .layer(layer(idem, test))
        .with_state(effects.clone());
    (Server::start(app).await, effects)
}

fn quick_client() -> IdempotentClient {
    IdempotentClient::new(client()).retry_policy(RetryPolicy {
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        ..RetryPolicy::default()
    })
}

/// One logical client request runs its side effect at most once: a handler that charges
/// and answers 500, or panics, runs once for one `IdempotentClient::send` and for every
/// retry after it; one that says nothing happened (`RetrySafe`) is retried and runs again.
async fn one_logical_request_runs_its_side_effect_once(backend: Backend) {
    let Some((idem, _, _dir)) = idem_on(backend).await else {
        return;
    };
    let (server, effects) = outcome_server(&idem, "outcome").await;
    let runs = || effects.runs.load(Ordering::SeqCst);
    let client = quick_client();

    let res = client
        .post(server.url("/fail"))
        .key("f")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 500);
    assert_eq!(runs(), 1, "one send, one run");
    let res = client
        .post(server.url("/fail"))
        .key("f")
        .send()
        .await
        .unwrap();
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    assert_eq!(res.text().await.unwrap(), "charged, then failed");
    assert_eq!(runs(), 1, "a retry gets the stored 500");

    let res = client
        .post(server.url("/panic"))
        .key("p")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 500);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    assert_eq!(runs(), 2);
    for _ in 0..3 {
        let res = client
            .post(server.url("/panic"))
            .key("p")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 500);
        assert_eq!(res.headers()["idempotent-replayed"], "true");
        let body = res.text().await.unwrap();
        assert!(body.contains("handler panicked"), "{body}");
    }
    assert_eq!(runs(), 2, "a panic after the side effect is not run again");

    let res = client
        .post(server.url("/safe"))
        .key("s")
        .send()
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        201,
        "the client retried what the handler marked safe"
    );
    assert_eq!(res.text().await.unwrap(), "charged on run 2");
    assert_eq!(runs(), 4);
}

/// The marker reaches the client as a header.
async fn a_retry_safe_response_says_so(backend: Backend) {
    let Some((idem, _, _dir)) = idem_on(backend).await else {
        return;
    };
    let (server, effects) = outcome_server(&idem, "marker").await;
    let res = post(&client(), &server.url("/safe"), Some("s"), ORDER).await;
    assert_eq!(res.status(), 503);
    assert_eq!(res.headers()["idempotent-retryable"], "true");
    let res = post(&client(), &server.url("/safe"), Some("s"), ORDER).await;
    assert_eq!(res.status(), 201);
    assert_eq!(effects.runs.load(Ordering::SeqCst), 2);
}

/// Answers `status` with the headers a replay needs, counting its runs.
fn statuses_app(runs: Arc<AtomicUsize>) -> Router {
    let handler = |status: u16| {
        let runs = runs.clone();
        route_post(move || {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                (
                    StatusCode::from_u16(status).unwrap(),
                    [
                        ("retry-after", "7"),
                        ("cache-control", "no-store"),
                        ("content-type", "text/plain"),
                    ],
                    format!("run {n}"),
                )
            }
        })
    };
    let mut app = Router::new();
    for status in [401, 403, 408, 409, 429, 503] {
        app = app.route(&format!("/{status}"), handler(status));
    }
    app
}

/// 401, 403, 408, 429 and a handler's 409 are not the operation's result: they pass
/// through unstored, and a retry runs again. A stored response keeps `Retry-After` and
/// `Cache-Control`.
async fn answers_that_are_not_the_result_are_not_stored(backend: Backend) {
    let Some((idem, _, _dir)) = idem_on(backend).await else {
        return;
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let server = Server::start(statuses_app(runs.clone()).layer(layer(&idem, "unstored"))).await;
    let c = client();
    for status in [401u16, 403, 408, 409, 429] {
        let url = server.url(&format!("/{status}"));
        let key = format!("k{status}");
        let first = post(&c, &url, Some(&key), ORDER).await;
        assert_eq!(first.status(), status);
        let before = runs.load(Ordering::SeqCst);
        let again = post(&c, &url, Some(&key), ORDER).await;
        assert_eq!(again.status(), status);
        assert!(
            again.headers().get("idempotent-replayed").is_none(),
            "{status} replayed"
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            before + 1,
            "{status} was not run again"
        );
        assert!(
            again.headers().get("idempotency-key-expires").is_none(),
            "{status}: no record, no expiry"
        );
        let retryable = again.headers().get("idempotent-retryable").is_some();
        assert_eq!(retryable, status == 408 || status == 429, "{status}");
    }
    let url = server.url("/503");
    post(&c, &url, Some("k503"), ORDER).await;
    let replay = post(&c, &url, Some("k503"), ORDER).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.headers()["retry-after"], "7");
    assert_eq!(replay.headers()["cache-control"], "no-store");
}

/// A JSON body re-encoded on a retry (another member order, spacing) is the same
/// request; a number written otherwise (`2.0` for `2`, which a `u64` field refuses) is not;
/// with `BodyFingerprint::Bytes` neither is.
async fn a_reserialized_json_body_is_the_same_request(backend: Backend) {
    let Some((idem, _, _dir)) = idem_on(backend).await else {
        return;
    };
    let shop = Arc::new(Shop::default());
    let server = Server::start(routes(shop.clone()).layer(layer(&idem, "json"))).await;
    let c = client();
    let url = server.url("/charge");
    let (s, _, first) = parts(post(&c, &url, Some("k"), r#"{"a":1,"b":2}"#).await).await;
    assert_eq!(s, 201);
    assert_eq!(
        parts(post(&c, &url, Some("k"), "{ \"b\": 2,\n \"a\": 1 }").await).await,
        (201, Some("true".into()), first)
    );
    let (s, _, _) = problem_type(post(&c, &url, Some("k"), r#"{"a":1,"b":2.0}"#).await).await;
    assert_eq!(s, 422, "2.0 is not 2 to a handler");
    let (s, _, _) = problem_type(post(&c, &url, Some("k"), r#"{"a":1,"b":3}"#).await).await;
    assert_eq!(s, 422, "another value is another request");
    assert_eq!(shop.charges(), 1);

    let exact = Server::start(
        routes(shop.clone())
            .layer(layer(&idem, "json-bytes").body_fingerprint(BodyFingerprint::Bytes)),
    )
    .await;
    let url = exact.url("/charge");
    post(&c, &url, Some("k"), r#"{"a":1,"b":2}"#).await;
    let (s, _, _) = problem_type(post(&c, &url, Some("k"), r#"{"b":2,"a":1}"#).await).await;
    assert_eq!(s, 422, "byte-exact on request");
}

/// A response that created or replayed a record says when its key expires.
async fn the_key_expiry_is_told(backend: Backend) {
    let Some((idem, _, _dir)) = idem_on(backend).await else {
        return;
    };
    let shop = Arc::new(Shop::default());
    let ttl = Duration::from_secs(3600);
    let server = Server::start(routes(shop).layer(layer(&idem, "expiry").ttl(ttl))).await;
    let c = client();
    let url = server.url("/charge");
    for res in [
        post(&c, &url, Some("k"), ORDER).await,
        post(&c, &url, Some("k"), ORDER).await,
    ] {
        let header = res.headers()["idempotency-key-expires"].to_str().unwrap();
        let at = httpdate::parse_http_date(header).expect("an HTTP date");
        let expected = SystemTime::now() + ttl;
        let off = at.duration_since(expected).unwrap_or_else(|e| e.duration());
        assert!(off < Duration::from_secs(120), "{header} is {off:?} off");
    }
}

/// A store whose `complete` always fails: the handler runs, its outcome cannot be stored.
#[derive(Debug)]
struct CompleteFails(idem_stores::MemoryStore);

#[idem_core::async_trait]
impl idem_core::Store for CompleteFails {
    async fn claim(
        &self,
        key: &idem_core::Key,
        fp: &idem_core::Fingerprint,
        token: idem_core::Token,
        lease: Duration,
    ) -> Result<idem_core::Claim, idem_core::StoreError> {
        self.0.claim(key, fp, token, lease).await
    }
    async fn complete(
        &self,
        _: &idem_core::Key,
        _: idem_core::Token,
        _: idem_core::Bytes,
        _: Duration,
    ) -> Result<(), idem_core::StoreError> {
        Err(idem_core::StoreError::Unavailable {
            backend: "memory",
            source: "the store went away".into(),
        })
    }
    async fn release(
        &self,
        key: &idem_core::Key,
        token: idem_core::Token,
    ) -> Result<(), idem_core::StoreError> {
        self.0.release(key, token).await
    }
    async fn extend(
        &self,
        key: &idem_core::Key,
        token: idem_core::Token,
        lease: Duration,
    ) -> Result<(), idem_core::StoreError> {
        self.0.extend(key, token, lease).await
    }
    async fn get(
        &self,
        key: &idem_core::Key,
    ) -> Result<Option<idem_core::Record>, idem_core::StoreError> {
        self.0.get(key).await
    }
    async fn delete(&self, key: &idem_core::Key) -> Result<bool, idem_core::StoreError> {
        self.0.delete(key).await
    }
}

/// The store fails after the handler charged: the client gets the handler's own answer,
/// not a 503 marked retryable, so one `IdempotentClient::send` charges once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_failure_after_the_handler_ran_is_not_announced_as_retryable() {
    let idem = idem_core::Idem::new(CompleteFails(idem_stores::MemoryStore::new()));
    let shop = Arc::new(Shop::default());
    let app = routes(shop.clone()).layer(
        open_layer(idem)
            .scope(unique_scope("complete-fails"))
            .lease(Duration::from_millis(400)),
    );
    let server = Server::start(app).await;
    let res = quick_client()
        .post(server.url("/charge"))
        .header("content-type", "application/json")
        .body(ORDER)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201, "the handler's own response");
    assert!(res.headers().get("idempotent-retryable").is_none());
    assert_eq!(shop.charges(), 1);
}

per_backend!(
    a_stored_response_never_reaches_another_client,
    shared_keys_are_an_opt_out,
    a_replay_is_never_served_for_another_path,
    one_logical_request_runs_its_side_effect_once,
    a_retry_safe_response_says_so,
    answers_that_are_not_the_result_are_not_stored,
    a_reserialized_json_body_is_the_same_request,
    the_key_expiry_is_told,
);
