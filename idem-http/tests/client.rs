//! The client half against a real server: one key per logical request, retried only on what
//! a retry can fix without a second run, bounded by attempts, a deadline and the key's
//! expiry, honouring `Retry-After`.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use idem_http::{ClientError, IdempotentClient, RetryPolicy};
use support::Server;

/// One scripted answer: a status and its headers.
type Step = (u16, Vec<(&'static str, String)>);

/// Answers each attempt with the next step of its script (then 201), recording the key;
/// a step of status 0 sleeps 2 s before answering 201 (an attempt that times out).
#[derive(Default)]
struct Script {
    steps: Mutex<Vec<Step>>,
    keys: Mutex<Vec<String>>,
}

async fn scripted(State(s): State<Arc<Script>>, headers: HeaderMap) -> axum::response::Response {
    let key = headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    s.keys.lock().unwrap().push(key);
    let next = {
        let mut steps = s.steps.lock().unwrap();
        (!steps.is_empty()).then(|| steps.remove(0))
    };
    match next {
        Some((0, _)) => {
            tokio::time::sleep(Duration::from_secs(10)).await;
            (StatusCode::CREATED, "late").into_response()
        }
        Some((status, headers)) => {
            let mut res = StatusCode::from_u16(status).unwrap().into_response();
            for (name, value) in headers {
                res.headers_mut().insert(name, value.parse().unwrap());
            }
            res
        }
        None => (StatusCode::CREATED, "done").into_response(),
    }
}

async fn serve(steps: Vec<Step>) -> (Server, Arc<Script>) {
    let script = Arc::new(Script {
        steps: Mutex::new(steps),
        ..Script::default()
    });
    let app = Router::new()
        .route("/op", post(scripted))
        .with_state(script.clone());
    (Server::start(app).await, script)
}

/// POSTs the JSON body `1` to `/op` through `fast()`.
async fn post_one(server: &Server) -> reqwest::Response {
    fast()
        .post(server.url("/op"))
        .json(&1)
        .send()
        .await
        .unwrap()
}

fn fast() -> IdempotentClient {
    IdempotentClient::new(reqwest::Client::new()).retry_policy(RetryPolicy {
        max_attempts: 4,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        ..RetryPolicy::default()
    })
}

fn attempts(script: &Script) -> usize {
    script.keys.lock().unwrap().len()
}

const RETRYABLE: (&str, &str) = ("idempotent-retryable", "true");

fn h(pairs: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    pairs.iter().map(|(n, v)| (*n, (*v).to_owned())).collect()
}

#[tokio::test]
async fn retries_what_the_server_marks_429_and_an_in_progress_409_with_one_uuid_v4_key() {
    let (server, script) = serve(vec![
        (503, h(&[RETRYABLE])),
        (409, h(&[("retry-after", "0")])),
        (429, vec![]),
    ])
    .await;
    let res = post_one(&server).await;
    assert_eq!(res.status(), 201);
    let keys = script.keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 4);
    assert!(
        keys.iter().all(|k| k == &keys[0]),
        "one key for every attempt: {keys:?}"
    );
    let uuid: Vec<&str> = keys[0].split('-').collect();
    assert_eq!(
        uuid.iter().map(|p| p.len()).collect::<Vec<_>>(),
        [8, 4, 4, 4, 12]
    );
    assert!(uuid[2].starts_with('4'), "a version 4 UUID: {}", keys[0]);
}

/// A 5xx the server did not mark is the operation's stored outcome: a retry would only
/// replay it (or, against a server that does not store it, run the operation again).
#[tokio::test]
async fn a_plain_5xx_and_a_handlers_409_are_not_retried() {
    for status in [500, 502, 503, 409] {
        let (server, script) = serve(vec![(status, vec![])]).await;
        let res = fast().post(server.url("/op")).send().await.unwrap();
        assert_eq!(res.status(), status);
        assert_eq!(attempts(&script), 1, "status {status} was retried");
    }
}

#[tokio::test]
async fn gives_up_after_max_attempts_with_the_last_response() {
    let (server, script) = serve(vec![(429, vec![]); 10]).await;
    let res = fast().post(server.url("/op")).send().await.unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(attempts(&script), 4);
}

#[tokio::test]
async fn does_not_retry_other_4xx() {
    let (server, script) = serve(vec![(422, vec![])]).await;
    let res = fast().post(server.url("/op")).send().await.unwrap();
    assert_eq!(res.status(), 422);
    assert_eq!(attempts(&script), 1);
}

#[tokio::test]
async fn two_logical_requests_get_two_keys_and_a_given_key_is_kept() {
    let (server, script) = serve(vec![]).await;
    let client = fast();
    client.post(server.url("/op")).send().await.unwrap();
    client.post(server.url("/op")).send().await.unwrap();
    client
        .post(server.url("/op"))
        .key("mine")
        .send()
        .await
        .unwrap();
    let built = reqwest::Client::new()
        .post(server.url("/op"))
        .header("idempotency-key", "from-builder");
    client.send_idempotent(built).await.unwrap();
    let keys = script.keys.lock().unwrap().clone();
    assert_ne!(keys[0], keys[1]);
    assert_eq!(&keys[2..], ["mine", "from-builder"]);
}

/// A key a server would refuse is an error naming it, and nothing is sent (it panicked).
#[tokio::test]
async fn a_key_that_is_not_a_header_value_is_an_error_not_a_panic() {
    let (server, script) = serve(vec![]).await;
    let long = "k".repeat(256);
    for bad in ["line\nbreak", "", "caf\u{e9}", long.as_str()] {
        let err = fast()
            .post(server.url("/op"))
            .key(bad)
            .send()
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ClientError::InvalidKey { key, .. } if key == bad),
            "{err:?}"
        );
        assert!(err.to_string().contains("idempotency key"), "{err}");
    }
    assert_eq!(attempts(&script), 0, "nothing was sent");
}

/// The backoff here is 1 ms: only `Retry-After: 1` makes the client wait a second.
#[tokio::test]
async fn honours_retry_after() {
    let (server, _) = serve(vec![(429, h(&[("retry-after", "1")]))]).await;
    let started = Instant::now();
    let res = fast().post(server.url("/op")).send().await.unwrap();
    assert_eq!(res.status(), 201);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

/// A total deadline bounds a logical request: no retry starts past it, and an attempt that
/// hangs is cut at it (and at the per-attempt timeout, which retries).
#[tokio::test]
async fn a_deadline_bounds_the_whole_request() {
    let client = IdempotentClient::new(reqwest::Client::new()).retry_policy(RetryPolicy {
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        deadline: Duration::from_secs(3),
        attempt_timeout: Some(Duration::from_secs(1)),
        ..RetryPolicy::default()
    });
    // Retry-After asks for 5 s; the deadline is 3 s away: the 429 is the answer. (The
    // bounds here leave a loaded machine seconds, and stay below what an unbounded
    // request would take: the Retry-After, or a hang of 10 s.)
    let (server, script) = serve(vec![(429, h(&[("retry-after", "5")]))]).await;
    let started = Instant::now();
    let res = client.post(server.url("/op")).send().await.unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(attempts(&script), 1);
    assert!(started.elapsed() < Duration::from_secs(2));

    // Every attempt hangs for 10 s: each is cut at 1 s and retried until the deadline.
    let (server, script) = serve(vec![(0, vec![]); 10]).await;
    let started = Instant::now();
    let err = client.post(server.url("/op")).send().await.unwrap_err();
    let took = started.elapsed();
    assert!(
        err.as_reqwest().is_some_and(reqwest::Error::is_timeout),
        "{err:?}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(attempts(&script) >= 2, "a timed-out attempt is retried");
    let keys = script.keys.lock().unwrap().clone();
    assert!(keys.iter().all(|k| k == &keys[0]));
}

/// A retry that would come after the key's expiry would be a new request: not sent.
#[tokio::test]
async fn stops_when_the_key_expires_before_the_retry() {
    let soon = httpdate::fmt_http_date(SystemTime::now() + Duration::from_millis(500));
    let (server, script) = serve(vec![(
        409,
        vec![
            ("retry-after", "2".to_owned()),
            ("idempotency-key-expires", soon),
        ],
    )])
    .await;
    let res = fast().post(server.url("/op")).send().await.unwrap();
    assert_eq!(res.status(), 409);
    assert_eq!(attempts(&script), 1);
}

#[tokio::test]
async fn returns_the_connect_error_when_attempts_run_out() {
    // A port with nothing listening: bind, read the port, close.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let err = fast()
        .post(format!("http://{addr}/op"))
        .send()
        .await
        .unwrap_err();
    assert!(
        err.as_reqwest().is_some_and(reqwest::Error::is_connect),
        "{err}"
    );
}

/// A key held by a step whose outcome is unknown is answered 409 `outcome-unknown` with no
/// `Retry-After` and no retryable mark: the client stops after one attempt instead of
/// spinning on a key only an operator can release.
#[tokio::test]
async fn a_held_key_is_not_retried() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let idem = idem_core::Idem::new(idem_stores::MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let app = Router::new()
        .route(
            "/op",
            post(move || {
                counter.fetch_add(1, SeqCst);
                async {
                    let charged = idem_core::Step::new("charge")
                        .unknown_if(|_: &idem_core::Error| true)
                        .run(|| async {
                            Err::<(), _>(idem_core::Error::Config {
                                message: "the gateway timed out".into(),
                                source: None,
                            })
                        })
                        .await;
                    match charged {
                        Ok(()) => StatusCode::CREATED.into_response(),
                        Err(_) => StatusCode::BAD_GATEWAY.into_response(),
                    }
                }
            }),
        )
        .layer(support::open_layer(idem));
    let server = Server::start(app).await;
    let res = post_one(&server).await;
    assert_eq!(res.status(), 409);
    assert!(res.headers().get("retry-after").is_none());
    let problem: serde_json::Value = res.json().await.unwrap();
    assert_eq!(problem["type"], "urn:idem:problem:outcome-unknown");
    assert_eq!(runs.load(SeqCst), 1, "one attempt, one run");
}
