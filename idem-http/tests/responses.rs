//! The status and problem body of every engine error, and the key extractor, through axum.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use http_body_util::BodyExt;
use idem_core::{Error, Key, StoreError};
use idem_http::{IdemError, IdempotencyKey};
use tower::ServiceExt;

fn key() -> Key {
    Key::new("billing::charge", "o-1").unwrap()
}

async fn answer(err: Error) -> (StatusCode, Option<String>, serde_json::Value) {
    let res = IdemError(err).into_response();
    let status = res.status();
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let retry_after = res
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, retry_after, serde_json::from_slice(&body).unwrap())
}

#[tokio::test]
async fn every_error_has_its_status() {
    let cases: Vec<(Error, u16, Option<&str>, &str)> = vec![
        (
            Error::InProgress {
                key: key(),
                retry_after: Duration::from_millis(2500),
            },
            409,
            Some("3"),
            "in-progress",
        ),
        (
            Error::WaitTimeout {
                key: key(),
                waited: Duration::from_secs(10),
            },
            409,
            Some("1"),
            "in-progress",
        ),
        (Error::KeyReuse { key: key() }, 422, None, "key-reuse"),
        (
            Error::Store {
                key: key(),
                source: StoreError::Unavailable {
                    backend: "redis",
                    source: "refused".into(),
                },
            },
            503,
            Some("1"),
            "store-unavailable",
        ),
        (
            Error::Store {
                key: key(),
                source: StoreError::RecordsLost {
                    backend: "redis",
                    retry_after: Some(std::time::Duration::from_millis(41_500)),
                },
            },
            503,
            Some("42"),
            "store-unavailable",
        ),
        (
            Error::Store {
                key: key(),
                source: StoreError::RecordsLost {
                    backend: "redis",
                    retry_after: None,
                },
            },
            503,
            None,
            "store-unavailable",
        ),
        (
            Error::Store {
                key: key(),
                source: StoreError::NotSetUp {
                    backend: "postgres",
                    message: "call migrate()".into(),
                },
            },
            503,
            None,
            "store-unavailable",
        ),
        (
            Error::LeaseLost { key: key() },
            503,
            Some("1"),
            "lease-lost",
        ),
        (
            Error::MissingKey {
                scope: "billing::charge".into(),
            },
            400,
            None,
            "idempotency-key-missing",
        ),
        (
            Error::InvalidKey {
                scope: "billing::charge".into(),
                id: Some(String::new()),
                reason: "empty".into(),
            },
            400,
            None,
            "idempotency-key-invalid",
        ),
        (
            Error::OutcomeUnknown {
                key: key(),
                step: "charge".into(),
            },
            409,
            None,
            "outcome-unknown",
        ),
        (
            Error::Step {
                key: Some(key()),
                step: "charge".into(),
                reason: "this body already ran a step of this name".into(),
            },
            500,
            None,
            "step-misused",
        ),
        (
            Error::Connect {
                message: "no such scheme".into(),
                source: None,
            },
            500,
            None,
            "idempotency-failure",
        ),
    ];
    for (err, status, retry_after, kind) in cases {
        let text = err.to_string();
        let (s, r, body) = answer(err).await;
        assert_eq!((s.as_u16(), r.as_deref()), (status, retry_after), "{text}");
        assert_eq!(body["type"], format!("urn:idem:problem:{kind}"), "{text}");
        assert!(
            body["detail"].as_str().unwrap().starts_with(&text),
            "the detail says what: {body}"
        );
    }
}

#[tokio::test]
async fn the_extractor_reads_the_key_or_rejects_with_a_problem() {
    let app = Router::new().route(
        "/",
        get(|key: IdempotencyKey| async move { key.into_string() }),
    );
    let ok = app
        .clone()
        .oneshot(
            Request::get("/")
                .header("idempotency-key", "\"k-1\"")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.into_body().collect().await.unwrap().to_bytes(), "k-1");

    let missing = app
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(missing.status(), 400);
    assert_eq!(
        missing.headers()["content-type"],
        "application/problem+json"
    );
    let body: serde_json::Value =
        serde_json::from_slice(&missing.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["type"], "urn:idem:problem:idempotency-key-missing");
}

/// Without a Content-Length, the limit is enforced while the body is read.
#[tokio::test]
async fn a_streamed_body_over_the_limit_is_413_before_the_handler() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let app = Router::new()
        .route(
            "/",
            axum::routing::post(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { "ran" }
            }),
        )
        .layer(open_layer(idem_core::Idem::new(idem_stores::MemoryStore::new())).max_body(8));
    let chunks = futures_chunks(vec!["12345", "67890"]);
    let res = app
        .oneshot(
            Request::post("/")
                .header("idempotency-key", "k")
                .body(chunks)
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A body of several chunks and no declared length.
fn futures_chunks(chunks: Vec<&'static str>) -> Body {
    Body::from_stream(futures_util::stream::iter(
        chunks
            .into_iter()
            .map(|c| Ok::<_, std::io::Error>(bytes::Bytes::from(c))),
    ))
}

fn memory_idem() -> idem_core::Idem {
    idem_core::Idem::new(idem_stores::MemoryStore::new())
}

/// A counting route behind `layer`; answers "run <n>" with `status`.
fn counted(
    layer: idem_http::IdempotencyLayer,
    status: StatusCode,
) -> (Router, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let app = Router::new()
        .route(
            "/",
            axum::routing::post(move || {
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                async move { (status, format!("run {n}")) }
            }),
        )
        .layer(layer);
    (app, runs)
}

async fn send(app: &Router, header: Option<(&str, &str)>) -> (StatusCode, Option<String>, String) {
    let mut req = Request::post("/");
    if let Some((name, value)) = header {
        req = req.header(name, value);
    }
    let res = app
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let replayed = res
        .headers()
        .get("idempotent-replayed")
        .map(|v| v.to_str().unwrap().to_owned());
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, replayed, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn an_optional_key_lets_keyless_requests_through_and_guards_the_others() {
    let (app, _) = counted(
        open_layer(memory_idem()).key_required(false),
        StatusCode::OK,
    );
    assert_eq!(
        send(&app, None).await,
        (StatusCode::OK, None, "run 1".into())
    );
    assert_eq!(
        send(&app, None).await,
        (StatusCode::OK, None, "run 2".into())
    );
    assert_eq!(
        send(&app, Some(("idempotency-key", "k"))).await,
        (StatusCode::OK, None, "run 3".into())
    );
    assert_eq!(
        send(&app, Some(("idempotency-key", "k"))).await,
        (StatusCode::OK, Some("true".into()), "run 3".into())
    );
}

#[tokio::test]
async fn a_custom_header_name_is_the_one_read() {
    let layer =
        open_layer(memory_idem()).header(axum::http::HeaderName::from_static("x-request-id"));
    let (app, _) = counted(layer, StatusCode::OK);
    assert_eq!(
        send(&app, Some(("idempotency-key", "k"))).await.0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        send(&app, Some(("x-request-id", "k"))).await,
        (StatusCode::OK, None, "run 1".into())
    );
    assert_eq!(
        send(&app, Some(("x-request-id", "k"))).await,
        (StatusCode::OK, Some("true".into()), "run 1".into())
    );
}

#[tokio::test]
async fn server_errors_are_stored_unless_turned_off_and_client_errors_skipped_when_asked() {
    let (app, _) = counted(open_layer(memory_idem()), StatusCode::BAD_GATEWAY);
    assert_eq!(
        send(&app, Some(("idempotency-key", "k"))).await,
        (StatusCode::BAD_GATEWAY, None, "run 1".into())
    );
    assert_eq!(
        send(&app, Some(("idempotency-key", "k"))).await,
        (StatusCode::BAD_GATEWAY, Some("true".into()), "run 1".into())
    );

    // Turned off: the 5xx is released, and says a retry is safe.
    let (app, _) = counted(
        open_layer(memory_idem()).store_server_errors(false),
        StatusCode::BAD_GATEWAY,
    );
    let res = app
        .clone()
        .oneshot(
            Request::post("/")
                .header("idempotency-key", "k")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.headers()["idempotent-retryable"], "true");
    assert_eq!(
        send(&app, Some(("idempotency-key", "k"))).await,
        (StatusCode::BAD_GATEWAY, None, "run 2".into())
    );

    let (app, _) = counted(
        open_layer(memory_idem()).store_client_errors(false),
        StatusCode::BAD_REQUEST,
    );
    assert_eq!(
        send(&app, Some(("idempotency-key", "k"))).await,
        (StatusCode::BAD_REQUEST, None, "run 1".into())
    );
    assert_eq!(
        send(&app, Some(("idempotency-key", "k"))).await,
        (StatusCode::BAD_REQUEST, None, "run 2".into())
    );
}

#[tokio::test]
async fn guarded_methods_are_configurable() {
    let layer = open_layer(memory_idem()).methods([axum::http::Method::PUT]);
    let (app, _) = counted(layer, StatusCode::OK);
    // POST is not guarded: no key needed, runs every time.
    assert_eq!(
        send(&app, None).await,
        (StatusCode::OK, None, "run 1".into())
    );
    assert_eq!(
        send(&app, Some(("idempotency-key", "k"))).await,
        (StatusCode::OK, None, "run 2".into())
    );
}

#[test]
#[should_panic(expected = "IdempotencyLayer::scope(\"billing/charge\")")]
fn an_invalid_scope_is_refused_at_setup() {
    let _ = open_layer(memory_idem()).scope("billing/charge");
}

/// A service that panics in `call` itself, before its future: the panic is still the
/// request's stored outcome, not a released key that a retry runs again.
#[tokio::test]
async fn a_panic_in_call_or_in_the_response_body_is_stored() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tower::Layer;

    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let panics_in_call = tower::service_fn(move |_req: Request<Body>| {
        counter.fetch_add(1, Ordering::SeqCst);
        if true {
            panic!("before the future");
        }
        async { Ok::<_, std::convert::Infallible>(axum::response::Response::new(Body::empty())) }
    });
    let service = open_layer(memory_idem()).layer(panics_in_call);
    let counter = runs.clone();
    let panics_in_body = tower::service_fn(move |_req: Request<Body>| {
        counter.fetch_add(1, Ordering::SeqCst);
        async {
            let chunks = futures_util::StreamExt::map(
                futures_util::stream::iter([0]),
                |_| -> Result<bytes::Bytes, std::io::Error> { panic!("while the body streams") },
            );
            Ok::<_, std::convert::Infallible>(axum::response::Response::new(Body::from_stream(
                chunks,
            )))
        }
    });
    let body_service = open_layer(memory_idem()).layer(panics_in_body);
    let req = || {
        Request::post("/")
            .header("idempotency-key", "k")
            .body(Body::empty())
            .unwrap()
    };
    for attempt in 0..3 {
        let res = service.clone().oneshot(req()).await.unwrap();
        assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            res.headers().get("idempotent-replayed").is_some(),
            attempt > 0
        );
        let res = body_service.clone().oneshot(req()).await.unwrap();
        assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            res.headers().get("idempotent-replayed").is_some(),
            attempt > 0
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2, "each ran once");
}

/// A layer with a scope, credentials digested with a secret, and requests without
/// credentials sharing one key space (written down).
fn open_layer(idem: idem_core::Idem) -> idem_http::IdempotencyLayer {
    idem_http::IdempotencyLayer::new(idem)
        .scope("responses")
        .client_identity(
            idem_http::ClientIdentity::credentials()
                .keyed("the tests' deployment secret")
                .share_anonymous(),
        )
}
