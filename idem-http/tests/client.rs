//! The client half against a real server: one key per logical request, retried on what a
//! retry can fix, bounded, honouring `Retry-After`.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use idem_http::{IdempotentClient, RetryPolicy};
use support::Server;

/// Answers each attempt with the next status of its script (then 201), recording the key.
#[derive(Default)]
struct Script {
    statuses: Mutex<Vec<(u16, Option<&'static str>)>>,
    keys: Mutex<Vec<String>>,
}

async fn scripted(State(s): State<Arc<Script>>, headers: HeaderMap) -> axum::response::Response {
    let key = headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    s.keys.lock().unwrap().push(key);
    let next = {
        let mut statuses = s.statuses.lock().unwrap();
        (!statuses.is_empty()).then(|| statuses.remove(0))
    };
    match next {
        Some((status, retry_after)) => {
            let mut res = StatusCode::from_u16(status).unwrap().into_response();
            if let Some(after) = retry_after {
                res.headers_mut()
                    .insert("retry-after", after.parse().unwrap());
            }
            res
        }
        None => (StatusCode::CREATED, "done").into_response(),
    }
}

async fn serve(statuses: Vec<(u16, Option<&'static str>)>) -> (Server, Arc<Script>) {
    let script = Arc::new(Script {
        statuses: Mutex::new(statuses),
        ..Script::default()
    });
    let app = Router::new()
        .route("/op", post(scripted))
        .with_state(script.clone());
    (Server::start(app).await, script)
}

fn fast() -> IdempotentClient {
    IdempotentClient::new(reqwest::Client::new()).retry_policy(RetryPolicy {
        max_attempts: 4,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        ..RetryPolicy::default()
    })
}

#[tokio::test]
async fn retries_409_429_and_5xx_with_one_uuid_v4_key() {
    let (server, script) = serve(vec![(503, None), (409, Some("0")), (429, None)]).await;
    let res = fast()
        .post(server.url("/op"))
        .json(&1)
        .send()
        .await
        .unwrap();
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

#[tokio::test]
async fn gives_up_after_max_attempts_with_the_last_response() {
    let (server, script) = serve(vec![(500, None); 10]).await;
    let res = fast().post(server.url("/op")).send().await.unwrap();
    assert_eq!(res.status(), 500);
    assert_eq!(script.keys.lock().unwrap().len(), 4);
}

#[tokio::test]
async fn does_not_retry_other_4xx() {
    let (server, script) = serve(vec![(422, None)]).await;
    let res = fast().post(server.url("/op")).send().await.unwrap();
    assert_eq!(res.status(), 422);
    assert_eq!(script.keys.lock().unwrap().len(), 1);
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

/// The backoff here is 1 ms: only `Retry-After: 1` makes the client wait a second.
#[tokio::test]
async fn honours_retry_after() {
    let (server, _) = serve(vec![(503, Some("1"))]).await;
    let started = Instant::now();
    let res = fast().post(server.url("/op")).send().await.unwrap();
    assert_eq!(res.status(), 201);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
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
    assert!(err.is_connect(), "{err}");
}
