//! A handler whose operation has several side effects runs each as a step
//! (`idem_core::step`) behind the layer: a step whose outcome is unknown holds the key, and
//! every request with it gets 409 `outcome-unknown` (no `Retry-After`, not marked
//! retryable) until the step is resolved; a first attempt that fails after a step completed
//! is retried without running that step again.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use http_body_util::BodyExt;
use idem_core::{Idem, Key, Resolution, Resolved, Step};
use idem_http::IdempotencyLayer;
use tower::ServiceExt;

/// What the checkout handler's steps can fail with.
#[derive(Debug)]
enum Failed {
    /// The gateway did not answer in time: the charge may have happened.
    Timeout,
    /// The mail server is down: no mail went out.
    MailDown,
    /// The step itself could not run or be recorded.
    Idem(idem_core::Error),
}

impl From<idem_core::Error> for Failed {
    fn from(err: idem_core::Error) -> Self {
        Failed::Idem(err)
    }
}

/// The handler's side effects, counted, and the switches that make them fail.
#[derive(Default)]
struct Shop {
    handler_runs: AtomicUsize,
    charges: AtomicUsize,
    emails: AtomicUsize,
    gateway_times_out: AtomicBool,
    mail_down: AtomicBool,
}

/// Charges (a step whose timeout leaves its outcome unknown), then mails (a plain step):
/// 201 with the charge's id, or 502 / 503 when a step failed.
async fn checkout(State(shop): State<Arc<Shop>>) -> Response {
    shop.handler_runs.fetch_add(1, SeqCst);
    let run = async {
        let charge: String = Step::new("charge")
            .unknown_if(|e: &Failed| matches!(e, Failed::Timeout))
            .run(|| async {
                let n = shop.charges.fetch_add(1, SeqCst) + 1;
                if shop.gateway_times_out.load(SeqCst) {
                    return Err(Failed::Timeout);
                }
                Ok(format!("ch_{n}"))
            })
            .await?;
        idem_core::step("email", || async {
            if shop.mail_down.load(SeqCst) {
                return Err(Failed::MailDown);
            }
            shop.emails.fetch_add(1, SeqCst);
            Ok(())
        })
        .await?;
        Ok::<_, Failed>(charge)
    };
    match run.await {
        Ok(charge) => (StatusCode::CREATED, charge).into_response(),
        Err(Failed::Timeout) => (StatusCode::BAD_GATEWAY, "the gateway timed out").into_response(),
        Err(Failed::MailDown) => (StatusCode::SERVICE_UNAVAILABLE, "mail is down").into_response(),
        Err(Failed::Idem(err)) => idem_http::IdemError(err).to_response(),
    }
}

fn app(
    idem: &Idem,
    shop: &Arc<Shop>,
    layer: impl FnOnce(IdempotencyLayer) -> IdempotencyLayer,
) -> Router {
    Router::new()
        .route("/checkout", post(checkout))
        .with_state(shop.clone())
        .layer(layer(open_layer(idem.clone())))
}

/// The answer to one POST with the key `k-1`: status, headers, body.
async fn send(app: &Router) -> (StatusCode, http::HeaderMap, String) {
    let req = Request::post("/checkout")
        .header("idempotency-key", "k-1")
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

/// The key the layer stores for the anonymous client's `k-1`, as an operator gives it to
/// `idem resolve` (the layer's `warn` event names it).
fn stored_key() -> Key {
    Key::new(STEPS_SCOPE, "-:k-1").unwrap()
}

fn assert_outcome_unknown(status: StatusCode, headers: &http::HeaderMap, body: &str) {
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(headers["content-type"], "application/problem+json");
    assert!(
        headers.get("retry-after").is_none(),
        "a held key has no Retry-After"
    );
    assert!(
        headers.get("idempotent-retryable").is_none(),
        "a held key is not marked retryable"
    );
    let problem: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(problem["type"], "urn:idem:problem:outcome-unknown");
    assert_eq!(problem["status"], 409);
    let detail = problem["detail"].as_str().unwrap();
    for part in ["`k-1`", "`charge`", "held until the step is resolved"] {
        assert!(detail.contains(part), "the detail names {part}: {detail}");
    }
}

#[tokio::test]
async fn a_step_of_unknown_outcome_holds_the_key_until_it_is_resolved() {
    let idem = Idem::new(idem_stores::MemoryStore::new());
    let shop = Arc::new(Shop::default());
    let app = app(&idem, &shop, |l| l);
    shop.gateway_times_out.store(true, SeqCst);

    // The handler answered 502, but nobody knows whether the charge happened: the client
    // gets 409 outcome-unknown, not the 502.
    let (status, headers, body) = send(&app).await;
    assert_outcome_unknown(status, &headers, &body);
    assert_eq!(shop.handler_runs.load(SeqCst), 1);

    // The gateway is back, but the key stays held: the handler does not run again.
    shop.gateway_times_out.store(false, SeqCst);
    let (status, headers, body) = send(&app).await;
    assert_outcome_unknown(status, &headers, &body);
    assert_eq!(
        shop.handler_runs.load(SeqCst),
        1,
        "a held key runs no handler"
    );
    assert_eq!(shop.charges.load(SeqCst), 1);

    // The operator learns from the gateway that the charge went through, as `ch_1`.
    let resolved = idem
        .resolve(&stored_key(), "charge", Resolution::ran("ch_1").unwrap())
        .await
        .unwrap();
    assert_eq!(resolved, Resolved::Resolved);

    // The retry runs the handler, which gets the charge from its record and sends the mail.
    retry_finishes_without_charging_then_replays(&app, &shop, "the resolved charge").await;
}

/// The retry runs the handler a second time, which answers the first charge's value
/// (`charge` is not run again) and sends the one email; from then on the stored response is
/// replayed.
async fn retry_finishes_without_charging_then_replays(app: &Router, shop: &Shop, charge: &str) {
    let (status, headers, body) = send(app).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::CREATED, "ch_1"),
        "the first charge's value"
    );
    assert!(headers.get("idempotent-replayed").is_none());
    assert_eq!(shop.handler_runs.load(SeqCst), 2);
    assert_eq!(shop.charges.load(SeqCst), 1, "{charge} is not run again");
    assert_eq!(shop.emails.load(SeqCst), 1);

    let (status, headers, body) = send(app).await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, "ch_1"));
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(shop.handler_runs.load(SeqCst), 2);
}

#[tokio::test]
async fn resolved_as_not_ran_the_step_runs_on_the_retry() {
    let idem = Idem::new(idem_stores::MemoryStore::new());
    let shop = Arc::new(Shop::default());
    let app = app(&idem, &shop, |l| l);
    shop.gateway_times_out.store(true, SeqCst);
    let (status, headers, body) = send(&app).await;
    assert_outcome_unknown(status, &headers, &body);
    shop.gateway_times_out.store(false, SeqCst);
    idem.resolve(&stored_key(), "charge", Resolution::NotRan)
        .await
        .unwrap();
    let (status, _, body) = send(&app).await;
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, "ch_2"));
    assert_eq!(shop.charges.load(SeqCst), 2, "not ran: the charge runs");
}

#[tokio::test]
async fn a_failed_attempt_after_a_step_is_retried_without_running_the_step_again() {
    let idem = Idem::new(idem_stores::MemoryStore::new());
    let shop = Arc::new(Shop::default());
    // A 5xx the layer does not store: the claim is given back, and the retry runs the
    // handler again.
    let app = app(&idem, &shop, |l| l.store_server_errors(false));
    shop.mail_down.store(true, SeqCst);

    let (status, headers, body) = send(&app).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "mail is down")
    );
    assert_eq!(headers["idempotent-retryable"], "true");
    assert_eq!(shop.charges.load(SeqCst), 1);

    shop.mail_down.store(false, SeqCst);
    retry_finishes_without_charging_then_replays(&app, &shop, "the completed charge").await;
}

/// A handler that runs a step wrongly (the same name twice) gets `Error::Step`, which
/// `IdemError` answers 500 `step-misused`.
#[tokio::test]
async fn a_misused_step_is_a_500() {
    async fn twice() -> Response {
        let once = idem_core::step("charge", || async { Ok::<_, idem_core::Error>(1) }).await;
        let again = idem_core::step("charge", || async { Ok::<_, idem_core::Error>(2) }).await;
        match (once, again) {
            (Ok(_), Err(err)) => idem_http::IdemError(err).to_response(),
            other => panic!("the second step of one name ran: {other:?}"),
        }
    }
    let idem = Idem::new(idem_stores::MemoryStore::new());
    let app = Router::new()
        .route("/checkout", post(twice))
        .layer(open_layer(idem));
    let (status, headers, body) = send(&app).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(headers["content-type"], "application/problem+json");
    let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(problem["type"], "urn:idem:problem:step-misused");
    assert!(
        problem["detail"].as_str().unwrap().contains("`charge`"),
        "{problem}"
    );
}

/// The scope of the layer under test.
const STEPS_SCOPE: &str = "steps";

/// A layer with the scope, credentials digested with a secret, and requests without
/// credentials sharing one key space (written down).
fn open_layer(idem: Idem) -> IdempotencyLayer {
    IdempotencyLayer::new(idem)
        .scope(STEPS_SCOPE)
        .client_identity(
            idem_http::ClientIdentity::credentials()
                .keyed("the tests' deployment secret")
                .share_anonymous(),
        )
}

/// A handler that charges the body's amount in a step, then answers 409 (a status the layer
/// does not store: the key is given back) until stock is back.
async fn pay(State(shop): State<Arc<Shop>>, body: String) -> Response {
    shop.handler_runs.fetch_add(1, SeqCst);
    let charge = idem_core::step("charge", || async {
        shop.charges.fetch_add(1, SeqCst);
        Ok::<_, idem_core::Error>(format!("ch_for_{body}"))
    })
    .await;
    match charge {
        Err(err) => idem_http::IdemError(err).to_response(),
        Ok(_) if shop.mail_down.load(SeqCst) => {
            (StatusCode::CONFLICT, "stock changed").into_response()
        }
        Ok(charge) => (StatusCode::CREATED, format!("paid {body} with {charge}")).into_response(),
    }
}

#[tokio::test]
async fn a_retry_with_another_body_after_a_step_is_key_reuse_not_the_first_bodys_charge() {
    let idem = Idem::new(idem_stores::MemoryStore::new());
    let shop = Arc::new(Shop::default());
    shop.mail_down.store(true, SeqCst);
    let app = Router::new()
        .route("/pay", post(pay))
        .with_state(shop.clone())
        .layer(open_layer(idem));
    let send = |amount: &'static str| {
        let app = app.clone();
        async move {
            let req = Request::post("/pay")
                .header("idempotency-key", "k-pay")
                .body(Body::from(amount))
                .unwrap();
            let res = app.oneshot(req).await.unwrap();
            let status = res.status();
            let body = res.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8(body.to_vec()).unwrap())
        }
    };
    assert_eq!(send("100").await.0, StatusCode::CONFLICT);
    shop.mail_down.store(false, SeqCst);
    let (status, body) = send("5000").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (status, body) = send("100").await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::CREATED, "paid 100 with ch_for_100")
    );
    assert_eq!(shop.charges.load(SeqCst), 1, "charged twice");
}
