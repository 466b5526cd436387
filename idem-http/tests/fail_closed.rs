//! The layer fails closed: no default shares a key space between clients or between
//! services, a signed request is one client across its retries, a store dump or a log
//! reveals no credential, streams stream, and what misled an operator says what happened.
//! A real axum server on 127.0.0.1 and a real reqwest client throughout.

#[macro_use]
mod support;

use std::convert::Infallible;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::post as route_post;
use axum::Router;
use base64::Engine as _;
use idem_core::{async_trait, Bytes, Capabilities, Claim, Fingerprint, Idem, Key, Record, Store};
use idem_core::{StoreError, Token};
use idem_http::{ClientIdentity, IdempotencyLayer};
use idem_stores::MemoryStore;
use support::*;
use tokio::sync::Semaphore;
use tower::Layer as _;

const SECRET: &[u8] = b"the deployment's secret";

/// The layer as a service sets it up: its scope, credentials digested with its secret.
fn keyed(idem: &Idem, scope: &str) -> IdempotencyLayer {
    IdempotencyLayer::new(idem.clone())
        .scope(unique_scope(scope))
        .client_identity(ClientIdentity::credentials().keyed(SECRET))
}

// --- 1. a request whose client the layer cannot tell ---------------------------------------

/// An application that authenticates in a way the default identity does not read (a custom
/// header, mTLS, a cookie of its own): neither client is run in a shared key space, so B
/// never gets A's receipt nor learns that A's key exists.
async fn an_unrecognised_client_is_refused_never_shared(backend: Backend) {
    let Some((idem, _, _dir)) = idem_on(backend).await else {
        return;
    };
    let shop = Arc::new(Shop::default());
    let server = Server::start(routes(shop.clone()).layer(keyed(&idem, "unrecognised"))).await;
    let c = client();
    let url = server.url("/charge");
    for who in [
        &[("x-custom-token", "alice")][..],
        &[("cookie", "my_auth=alice")],
        &[], // mTLS: the credential is in the connection, not the request
    ] {
        let (status, kind, body) = problem_type(send(&c, &url, "order-1", who, ORDER).await).await;
        assert_eq!(
            (status, kind.as_str()),
            (400, "urn:idem:problem:client-unidentified")
        );
        assert!(body["detail"].as_str().unwrap().contains("credentials"));
    }
    assert_eq!(
        shop.charges(),
        0,
        "no handler ran for a client nobody could tell"
    );
}

/// The session cookies and API key headers of common frameworks are clients of their own.
async fn common_credentials_are_clients_of_their_own(backend: Backend) {
    let Some((idem, _, _dir)) = idem_on(backend).await else {
        return;
    };
    let shop = Arc::new(Shop::default());
    let server = Server::start(routes(shop.clone()).layer(keyed(&idem, "frameworks"))).await;
    let c = client();
    let url = server.url("/charge");
    let cases: &[(&str, &str)] = &[
        ("cookie", "SESSION"),
        ("cookie", "_shop_session"),
        ("cookie", "__Host-session"),
        ("cookie", "__Secure-next-auth.session-token"),
        ("cookie", ".AspNetCore.Cookies"),
        ("cookie", "jwt"),
        ("api-key", ""),
        ("x-auth-token", ""),
    ];
    for (i, (header, name)) in cases.iter().enumerate() {
        let key = format!("order-{i}");
        let value = |user: &str| {
            if *header == "cookie" {
                format!("{name}={user}; _ga=GA1.{i}")
            } else {
                user.to_owned()
            }
        };
        let (alice, bob) = (value("alice"), value("bob"));
        let (s, r, first) = parts(send(&c, &url, &key, &[(header, &alice)], ORDER).await).await;
        assert_eq!((s, r), (201, None), "{header} {name}");
        let (s, r, _) = parts(send(&c, &url, &key, &[(header, &bob)], ORDER).await).await;
        assert_eq!(
            (s, r),
            (201, None),
            "{header} {name}: bob is not served alice's"
        );
        let (s, r, again) = parts(send(&c, &url, &key, &[(header, &alice)], ORDER).await).await;
        assert_eq!(
            (s, r.as_deref(), again),
            (201, Some("true"), first),
            "{header} {name}"
        );
    }
    assert_eq!(shop.charges(), 2 * cases.len());
}

#[derive(Clone)]
struct Customer(String);

/// An authentication layer: `Authorization: Bearer <name>-token` is the customer `<name>`;
/// anything else is 401.
async fn authenticate(mut req: Request, next: Next) -> Response {
    let customer = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|t| t.strip_suffix("-token"))
        .map(str::to_owned);
    match customer {
        Some(name) => {
            req.extensions_mut().insert(Customer(name));
            next.run(req).await
        }
        None => StatusCode::UNAUTHORIZED.into_response(),
    }
}

/// A `principal` that answers `None` is never a shared key space: with the authentication
/// layer placed inside the idempotency layer (the easy mistake with axum's layer order),
/// every request is refused with a problem that names the likely cause, and a request
/// without credentials never gets another's response. Placed outside, each customer is
/// its own client.
async fn a_principal_of_none_names_the_layer_order(backend: Backend) {
    let Some((idem, _, _dir)) = idem_on(backend).await else {
        return;
    };
    let layer = |name: &str| {
        IdempotencyLayer::new(idem.clone())
            .scope(unique_scope(name))
            .principal(|parts| parts.extensions.get::<Customer>().map(|c| c.0.clone()))
    };
    let c = client();
    let alice = [("authorization", "Bearer alice-token")];
    let bob = [("authorization", "Bearer bob-token")];

    // Wrong: the later route_layer is the outer one, so idempotency runs first.
    let shop = Arc::new(Shop::default());
    let wrong = routes(shop.clone())
        .route_layer(axum::middleware::from_fn(authenticate))
        .route_layer(layer("inside"));
    let server = Server::start(wrong).await;
    let url = server.url("/charge");
    for who in [&alice[..], &bob, &[]] {
        let (status, kind, body) = problem_type(send(&c, &url, "k", who, ORDER).await).await;
        assert_eq!(
            (status, kind.as_str()),
            (500, "urn:idem:problem:client-unidentified")
        );
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("authentication layer most likely runs inside"),
            "{body}"
        );
    }
    assert_eq!(shop.charges(), 0);

    // Right: authentication outside.
    let shop = Arc::new(Shop::default());
    let right = routes(shop.clone())
        .route_layer(layer("outside"))
        .route_layer(axum::middleware::from_fn(authenticate));
    let server = Server::start(right).await;
    let url = server.url("/charge");
    let (s, r, a) = parts(send(&c, &url, "k", &alice, ORDER).await).await;
    assert_eq!((s, r), (201, None));
    let (s, r, b) = parts(send(&c, &url, "k", &bob, ORDER).await).await;
    assert_eq!((s, r), (201, None));
    assert_ne!(a, b);
    let (s, _, _) = parts(send(&c, &url, "k", &[], ORDER).await).await;
    assert_eq!(s, 401, "no credentials: the authentication layer answers");
    let (s, r, again) = parts(send(&c, &url, "k", &alice, ORDER).await).await;
    assert_eq!((s, r.as_deref(), again), (201, Some("true"), a));
    assert_eq!(shop.charges(), 2);
}

// --- 2. two services on one store ------------------------------------------------------------

/// A layer without a scope does not build: a default scope would be every service's.
#[test]
fn a_layer_without_a_scope_or_a_secret_does_not_build() {
    let idem = Idem::new(MemoryStore::new());
    let err = IdempotencyLayer::new(idem.clone())
        .client_identity(ClientIdentity::shared())
        .check()
        .unwrap_err()
        .to_string();
    assert!(err.contains("no scope"), "{err}");
    let err = IdempotencyLayer::new(idem.clone())
        .scope("payments")
        .check()
        .unwrap_err()
        .to_string();
    assert!(err.contains("secret of the deployment"), "{err}");
    assert!(IdempotencyLayer::new(idem.clone())
        .scope("payments")
        .client_identity(ClientIdentity::credentials().unkeyed())
        .check()
        .is_ok());
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        IdempotencyLayer::new(idem).layer(tower::service_fn(|_: http::Request<Body>| async {
            Ok::<_, Infallible>(http::Response::new(Body::empty()))
        }))
    }));
    assert!(panicked.is_err(), "the layer does not build");
}

/// Two services on one store, each with its scope, the same event posted to both: each
/// handler runs, neither answers from the other's record.
async fn two_services_on_one_store_never_answer_each_other(backend: Backend) {
    let Some((idem, _, _dir)) = idem_on(backend).await else {
        return;
    };
    let (orders, webhooks) = (Arc::new(Shop::default()), Arc::new(Shop::default()));
    let shared = |scope: &str| {
        IdempotencyLayer::new(idem.clone())
            .scope(unique_scope(scope))
            .key_from_json("/order_id")
            .client_identity(ClientIdentity::shared())
    };
    let a = Server::start(routes(orders.clone()).layer(shared("orders"))).await;
    let b = Server::start(routes(webhooks.clone()).layer(shared("webhooks"))).await;
    let c = client();
    let (s, r, _) = parts(post(&c, &a.url("/charge"), None, ORDER).await).await;
    assert_eq!((s, r), (201, None));
    let (s, r, _) = parts(post(&c, &b.url("/charge"), None, ORDER).await).await;
    assert_eq!(
        (s, r),
        (201, None),
        "the second service ran its own handler"
    );
    assert_eq!((orders.charges(), webhooks.charges()), (1, 1));
}

// --- 3. signed requests ------------------------------------------------------------------------

/// Each signature scheme, three attempts of one logical request whose nonce, date and
/// signature change: one run; another signer is a client of its own.
async fn a_signed_request_is_one_client_across_retries(backend: Backend) {
    let Some((idem, _, _dir)) = idem_on(backend).await else {
        return;
    };
    let shop = Arc::new(Shop::default());
    let server = Server::start(routes(shop.clone()).layer(keyed(&idem, "signed"))).await;
    let c = client();
    let url = server.url("/charge");
    type Signer = fn(&str, usize) -> Vec<(&'static str, String)>;
    let schemes: &[(&str, Signer)] = &[
        ("digest", |user, n| {
            vec![(
                "authorization",
                format!(
                    r#"Digest username="{user}", realm="api", uri="/charge", algorithm=SHA-256, nonce="n{n}", nc=0000000{n}, cnonce="c{n}", qop=auth, response="{n:064}""#
                ),
            )]
        }),
        ("sigv4", |user, n| {
            vec![
                ("authorization", format!("AWS4-HMAC-SHA256 Credential={user}/2026120{n}/eu-west-1/execute-api/aws4_request, SignedHeaders=host;x-amz-date, Signature={n:064}")),
                ("x-amz-date", format!("2026120{n}T000000Z")),
            ]
        }),
        ("http message signatures", |user, n| {
            vec![
                (
                    "signature-input",
                    format!(
                        r#"sig1=("@method" "@target-uri" "content-digest");created=17000000{n};keyid="{user}";nonce="{n}""#
                    ),
                ),
                (
                    "signature",
                    format!(
                        "sig1=:{}:",
                        base64::engine::general_purpose::STANDARD.encode(format!("sig{n}"))
                    ),
                ),
            ]
        }),
        ("cavage signature", |user, n| {
            vec![(
                "authorization",
                format!(
                    r#"Signature keyId="{user}",algorithm="hmac-sha256",headers="(request-target) date",signature="{n:044}""#
                ),
            )]
        }),
        ("hawk", |user, n| {
            vec![(
                "authorization",
                format!(r#"Hawk id="{user}", ts="135383223{n}", nonce="j4h3g{n}", mac="{n:044}""#),
            )]
        }),
        ("hmac", |user, n| {
            vec![("authorization", format!("HMAC-SHA256 Credential={user}/2026120{n}, SignedHeaders=host, Signature={n:064}"))]
        }),
    ];
    for (i, (scheme, sign)) in schemes.iter().enumerate() {
        let key = format!("order-{i}");
        let mut answers = Vec::new();
        for attempt in 1..=3 {
            let headers = sign("alice", attempt);
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            answers.push(parts(send(&c, &url, &key, &headers, ORDER).await).await);
        }
        assert_eq!(answers[0].1, None, "{scheme}");
        assert_eq!(
            answers[1].1.as_deref(),
            Some("true"),
            "{scheme}: a retry replays"
        );
        assert_eq!(answers[2].2, answers[0].2, "{scheme}");
        let headers = sign("mallory", 4);
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let (s, r, _) = parts(send(&c, &url, &key, &headers, ORDER).await).await;
        assert_eq!((s, r), (201, None), "{scheme}: another signer runs its own");
    }
    assert_eq!(shop.charges(), 2 * schemes.len());
}

// --- 4. store dumps and logs -------------------------------------------------------------------

/// A store that keeps every key it was asked to claim: what a dump of it shows.
#[derive(Debug, Default)]
struct Dumped {
    inner: MemoryStore,
    keys: Mutex<Vec<Key>>,
    fail_complete: bool,
}

#[async_trait]
impl Store for Dumped {
    async fn claim(
        &self,
        key: &Key,
        fp: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.keys.lock().unwrap().push(key.clone());
        self.inner.claim(key, fp, token, lease).await
    }
    async fn complete(
        &self,
        key: &Key,
        token: Token,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        if self.fail_complete {
            return Err(StoreError::NotReplicated {
                backend: "memory",
                step: "complete",
                acknowledged: 0,
                required: 1,
                after: Duration::from_millis(10),
            });
        }
        self.inner.complete(key, token, payload, ttl).await
    }
    async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError> {
        self.inner.release(key, token).await
    }
    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
        self.inner.extend(key, token, lease).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }
    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        self.inner.delete(key).await
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn backend(&self) -> &'static str {
        "memory"
    }
}

/// The credentials digest as anyone who has read this crate computes it without a secret:
/// what an attacker with a store dump tests password guesses against.
fn unkeyed_digest(authorization: &str) -> String {
    let mut h = blake3::Hasher::new_derive_key("idem-http 2026-12 client credentials v1");
    h.update(b"h");
    h.update(&13u64.to_le_bytes());
    h.update(b"authorization");
    h.update(&(authorization.len() as u64).to_le_bytes());
    h.update(authorization.as_bytes());
    h.finalize().as_bytes()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn basic(user: &str, password: &str) -> String {
    let pair = format!("{user}:{password}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

/// What a dump of the store holds for a Basic-auth client: no guess of its password, the
/// right one included, reproduces the stored id without the deployment's secret. With the
/// opt-out by name (`unkeyed`) the same guess does: this is what the test would catch.
#[tokio::test]
async fn a_store_dump_does_not_let_a_password_be_guessed() {
    let guesses = [
        "123456", "password", "letmein", "hunter2", "pa55word", "qwerty",
    ];
    let authorization = basic("alice", "hunter2");
    for unkeyed in [false, true] {
        let store = Arc::new(Dumped::default());
        let idem = Idem::builder().shared_store(store.clone()).build().unwrap();
        let identity = if unkeyed {
            ClientIdentity::credentials().unkeyed()
        } else {
            ClientIdentity::credentials().keyed(SECRET)
        };
        let layer = IdempotencyLayer::new(idem)
            .scope("payments")
            .client_identity(identity.clone());
        let server = Server::start(routes(Arc::default()).layer(layer)).await;
        let c = client();
        let (s, _, _) = parts(
            send(
                &c,
                &server.url("/charge"),
                "order-1",
                &[("authorization", &authorization)],
                ORDER,
            )
            .await,
        )
        .await;
        assert_eq!(s, 201);
        let dump: Vec<String> = store
            .keys
            .lock()
            .unwrap()
            .iter()
            .map(|k| k.as_str().to_owned())
            .collect();
        assert!(dump
            .iter()
            .all(|k| !k.contains("hunter2") && !k.contains("YWxp")));
        // What an operator computes from the customer's key and credential (`idem get
        // --scope`) is the key the layer stored.
        let request = http::Request::post("/")
            .header("authorization", &authorization)
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let looked_up = idem_http::stored_key("payments", &identity, &request, "order-1");
        assert_eq!(looked_up.unwrap().as_str(), dump[0]);
        let cracked = guesses.iter().find(|guess| {
            let digest = unkeyed_digest(&basic("alice", guess));
            dump.iter().any(|k| k.contains(&digest))
        });
        if unkeyed {
            assert_eq!(
                cracked,
                Some(&"hunter2"),
                "the opt-out is guessable: {dump:?}"
            );
        } else {
            assert_eq!(cracked, None, "a keyed digest resists guessing: {dump:?}");
        }
        server.stop().await;
    }
}

/// Everything a subscriber is given, as text.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// A subscriber for this thread: every event and span close, every field.
    fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync {
        let out = self.clone();
        tracing_subscriber::fmt()
            .with_writer(move || out.clone())
            .with_max_level(tracing::Level::TRACE)
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
            .finish()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// No span or event (the engine's `idem.call` span, the layer's warning that the store failed
/// after the handler ran) carries the credential or any digest of it: the stored key shows
/// its client as `@[client]`.
#[tokio::test]
async fn the_logs_hold_no_credential_and_no_digest() {
    let captured = Captured::default();
    let _guard = tracing::subscriber::set_default(captured.subscriber());
    let store = Arc::new(Dumped {
        fail_complete: true,
        ..Dumped::default()
    });
    let idem = Idem::builder().shared_store(store.clone()).build().unwrap();
    let layer = IdempotencyLayer::new(idem)
        .scope("payments")
        .lease(Duration::from_millis(300))
        .client_identity(ClientIdentity::credentials().keyed(SECRET));
    let server = Server::start(routes(Arc::default()).layer(layer)).await;
    let authorization = basic("alice", "hunter2");
    let res = send(
        &client(),
        &server.url("/charge"),
        "order-1",
        &[("authorization", &authorization)],
        ORDER,
    )
    .await;
    assert_eq!(res.status(), 201);
    server.stop().await;
    let logs = captured.text();
    let stored = store.keys.lock().unwrap()[0].id().to_owned();
    let keyed_digest = &stored[1..33];
    assert!(logs.contains("could not be stored"), "{logs}");
    assert!(!logs.contains("hunter2") && !logs.contains(&authorization[6..]));
    assert!(!logs.contains(&unkeyed_digest(&authorization)));
    assert!(
        logs.contains("idem.call") && logs.contains("@[client]:order-1"),
        "the engine's span shows the key with its client left out: {logs}"
    );
    assert!(
        !logs.contains(keyed_digest),
        "no span or event carries the digest: {logs}"
    );
}

// --- 5. streams ------------------------------------------------------------------------------

/// A body with no known length that does not end at once (NDJSON progress) reaches its
/// client as it streams: the status line and the first line arrive while the handler still
/// writes. A retry gets the "response not stored" problem, never a second run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_of_no_known_length_streams_and_is_never_run_twice() {
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let (counted, held) = (runs.clone(), gate.clone());
    let app = Router::new()
        .route(
            "/export",
            route_post(move || {
                let (counted, held) = (counted.clone(), held.clone());
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let first = futures_util::stream::iter([Ok::<_, Infallible>(Bytes::from(
                        "{\"progress\":1}\n",
                    ))]);
                    let rest = futures_util::stream::once(async move {
                        held.acquire().await.expect("gate").forget();
                        Ok::<_, Infallible>(Bytes::from("{\"done\":true}\n"))
                    });
                    (
                        [("content-type", "application/x-ndjson")],
                        Body::from_stream(futures_util::StreamExt::chain(first, rest)),
                    )
                }
            }),
        )
        .layer(open_layer(Idem::new(MemoryStore::new())));
    let server = Server::start(app).await;
    let c = client();
    let url = server.url("/export");
    // Bounded: the gate is still shut, so only a streamed response can arrive.
    let mut res = tokio::time::timeout(Duration::from_secs(10), post(&c, &url, Some("k"), "{}"))
        .await
        .expect("the status line arrives while the handler still writes");
    assert_eq!(res.status(), 200);
    let first = within(res.chunk()).await.unwrap().unwrap();
    assert_eq!(first, "{\"progress\":1}\n");

    let (status, kind, _) = problem_type(post(&c, &url, Some("k"), "{}").await).await;
    assert_eq!(
        (status, kind.as_str()),
        (500, "urn:idem:problem:response-not-stored")
    );

    gate.add_permits(1);
    let rest = within(res.bytes()).await.unwrap();
    assert_eq!(rest, "{\"done\":true}\n");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

// --- 6. keys and fingerprints a handler tells apart -------------------------------------------

/// A key from the body is a JSON string that obeys a header key's rules: a number is not
/// the string of its digits, a control character never reaches the handler, and a body with
/// the key's member twice has no key. The JSON fingerprint keeps apart what a serde-derive
/// handler reads differently, and still not re-ordered members.
async fn body_keys_and_fingerprints_a_handler_tells_apart(backend: Backend) {
    let Some((idem, _, _dir)) = idem_on(backend).await else {
        return;
    };
    let shop = Arc::new(Shop::default());
    let layer = IdempotencyLayer::new(idem)
        .scope(unique_scope("body-keys"))
        .key_from_json("/id")
        .client_identity(ClientIdentity::shared());
    let server = Server::start(routes(shop.clone()).layer(layer)).await;
    let c = client();
    let url = server.url("/charge");
    for (body, says) in [
        (r#"{"id":1,"amount":100}"#, "a number"),
        (
            r#"{"id":"evt\u0000\nINFO forged","amount":100}"#,
            "printable ASCII",
        ),
        (r#"{"id":"évt","amount":100}"#, "printable ASCII"),
        (r#"{"id":"a","id":"b","amount":100}"#, "twice"),
        (r#"{"id":"1","amount":100,"amount":100}"#, "twice"),
        (r#"{"id":"","amount":100}"#, "empty"),
    ] {
        let (status, kind, problem) = problem_type(post(&c, &url, None, body).await).await;
        assert_eq!(
            (status, kind.as_str()),
            (400, "urn:idem:problem:idempotency-key-invalid"),
            "{body}"
        );
        assert!(
            problem["detail"].as_str().unwrap().contains(says),
            "{body}: {problem}"
        );
    }
    assert_eq!(shop.charges(), 0);

    let (s, r, first) = parts(post(&c, &url, None, r#"{"id":"1","amount":100}"#).await).await;
    assert_eq!((s, r), (201, None));
    let reordered = "{ \"amount\" : 100,\n \"id\" : \"1\" }";
    assert_eq!(
        parts(post(&c, &url, None, reordered).await).await,
        (201, Some("true".into()), first)
    );
    for other in [
        r#"{"id":"1","amount":1e2}"#,
        r#"{"id":"1","amount":100.0}"#,
        r#"{"id":"1","amount":100.0000000000000001}"#,
    ] {
        let (status, kind, _) = problem_type(post(&c, &url, None, other).await).await;
        assert_eq!(
            (status, kind.as_str()),
            (422, "urn:idem:problem:key-reuse"),
            "{other}"
        );
    }
    let zero = |amount: &str| format!(r#"{{"id":"z","amount":{amount}}}"#);
    post(&c, &url, None, &zero("0")).await;
    let (status, _, _) = problem_type(post(&c, &url, None, &zero("-0")).await).await;
    assert_eq!(status, 422, "-0 is not 0");
    assert_eq!(shop.charges(), 2);
}

/// Hostile JSON through a real listener: a body nested far deeper than serde_json reads, a
/// number of ten thousand digits, one past `f64`: each is a request like any other (its
/// retry replays, another body is 422), and the server lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_json_is_a_request_like_any_other() {
    let shop = Arc::new(Shop::default());
    let app = routes(shop.clone()).layer(open_layer(Idem::new(MemoryStore::new())));
    let server = Server::start(app).await;
    let c = client();
    let url = server.url("/charge");
    let deep = format!("{}{}", "[".repeat(200_000), "]".repeat(200_000));
    let digits = "7".repeat(10_000);
    let long = format!(r#"{{"amount":{digits}}}"#);
    let longer = format!(r#"{{"amount":{digits}8}}"#);
    let bodies = [deep.as_str(), long.as_str(), r#"{"amount":1e999999}"#];
    for (i, body) in bodies.iter().enumerate() {
        let key = format!("hostile-{i}");
        let (s, r, first) = parts(post(&c, &url, Some(&key), body).await).await;
        assert_eq!((s, r), (201, None), "body {i}");
        let (s, r, again) = parts(post(&c, &url, Some(&key), body).await).await;
        assert_eq!(
            (s, r.as_deref(), again),
            (201, Some("true"), first),
            "body {i}"
        );
    }
    let (status, _, _) = problem_type(post(&c, &url, Some("hostile-1"), &longer).await).await;
    assert_eq!(status, 422, "one digit more is another request");
    assert_eq!(shop.charges(), bodies.len());
}

#[derive(Clone)]
struct PeerCertificate(String);

/// mTLS: the TLS acceptor leaves the client certificate's subject in the extensions, and
/// the principal is read from there: two certificates are two clients, a connection without
/// one is refused.
async fn mtls_clients_are_their_certificates(backend: Backend) {
    let Some((idem, _, _dir)) = idem_on(backend).await else {
        return;
    };
    let shop = Arc::new(Shop::default());
    let layer = IdempotencyLayer::new(idem)
        .scope(unique_scope("mtls"))
        .principal(|parts| {
            parts
                .extensions
                .get::<PeerCertificate>()
                .map(|c| c.0.clone())
        });
    // Stands for the TLS acceptor: what it verified, as an extension (here from a header
    // only the test writes).
    let acceptor = axum::middleware::from_fn(|mut req: Request, next: Next| async move {
        let subject = req
            .headers()
            .get("x-test-peer")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if let Some(subject) = subject {
            req.extensions_mut().insert(PeerCertificate(subject));
        }
        next.run(req).await
    });
    let app = routes(shop.clone()).route_layer(layer).layer(acceptor);
    let server = Server::start(app).await;
    let c = client();
    let url = server.url("/charge");
    let a = [("x-test-peer", "CN=shop-a")];
    let b = [("x-test-peer", "CN=shop-b")];
    let (_, r1, first) = parts(send(&c, &url, "k", &a, ORDER).await).await;
    let (_, r2, other) = parts(send(&c, &url, "k", &b, ORDER).await).await;
    let (_, r3, again) = parts(send(&c, &url, "k", &a, ORDER).await).await;
    assert_eq!((r1, r2, r3.as_deref()), (None, None, Some("true")));
    assert_ne!(first, other);
    assert_eq!(first, again);
    let (status, _, _) = problem_type(send(&c, &url, "k", &[], ORDER).await).await;
    assert_eq!(status, 500);
    assert_eq!(shop.charges(), 2);
}

// --- 7. what misled ------------------------------------------------------------------------------

/// The store fails after the handler ran (a durability level not met): the handler's
/// response reaches its client without `Idempotency-Key-Expires` (nothing was stored) and
/// with `Idempotent-Stored: false`.
#[tokio::test]
async fn an_outcome_not_stored_says_so_and_no_expiry() {
    let store = Arc::new(Dumped {
        fail_complete: true,
        ..Dumped::default()
    });
    let idem = Idem::builder().shared_store(store).build().unwrap();
    let layer = open_layer(idem).lease(Duration::from_millis(300));
    let server = Server::start(routes(Arc::default()).layer(layer)).await;
    let res = post(&client(), &server.url("/charge"), Some("k"), ORDER).await;
    assert_eq!(res.status(), 201, "the handler's own response");
    assert!(res.headers().get("idempotency-key-expires").is_none());
    assert_eq!(res.headers()["idempotent-stored"], "false");
    assert!(res.headers().get("idempotent-retryable").is_none());
}

/// A handler's panic is logged with its message.
#[tokio::test]
async fn a_panic_is_logged_with_its_message() {
    let captured = Captured::default();
    let _guard = tracing::subscriber::set_default(captured.subscriber());
    let app = Router::new()
        .route(
            "/charge",
            route_post(|body: String| async move {
                let card = "4242";
                if body.contains("amount") {
                    panic!("the provider's answer was not understood (card ending {card})");
                }
                "unreachable"
            }),
        )
        .layer(open_layer(Idem::new(MemoryStore::new())));
    let server = Server::start(app).await;
    let res = post(&client(), &server.url("/charge"), Some("k"), ORDER).await;
    assert_eq!(res.status(), 500);
    server.stop().await;
    let logs = captured.text();
    assert!(
        logs.contains("the provider's answer was not understood (card ending 4242)"),
        "{logs}"
    );
    assert!(!logs.contains("(not text)"));
}

per_backend!(
    an_unrecognised_client_is_refused_never_shared,
    common_credentials_are_clients_of_their_own,
    a_principal_of_none_names_the_layer_order,
    two_services_on_one_store_never_answer_each_other,
    a_signed_request_is_one_client_across_retries,
    body_keys_and_fingerprints_a_handler_tells_apart,
    mtls_clients_are_their_certificates,
);
