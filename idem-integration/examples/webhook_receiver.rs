//! A webhook receiver that acts once per event, however often the provider delivers it.
//!
//! ```sh
//! cargo run -p idem-integration --example webhook_receiver
//! ```
//!
//! Payment providers retry a webhook until they see a 2xx, and may deliver one event
//! twice anyway; the event's id is in the JSON body, not in a header. One layer option
//! takes the key from there: `.key_from_json("/id")`. Event ids are the provider's and shared
//! by every delivery, so the signature check in front of the idempotency layer is what keeps
//! anyone else from posting an event id first. `IDEM_STORE_URL` names the store (default:
//! SQLite in a temporary file); `PORT` the port on 127.0.0.1 (default 3001; 0 picks a free
//! one); `WEBHOOK_SECRET` the secret the provider signs with (default `whsec_demo`).
//!
//! ```sh
//! body='{"id": "evt_1", "type": "payment.succeeded", "data": {"order_id": "o-1"}}'
//! sig=$(printf '%s' "$body" | openssl dgst -sha256 -hmac whsec_demo | sed 's/.* //')
//! curl -i http://127.0.0.1:3001/webhooks/payments -H 'Content-Type: application/json' \
//!   -H "Webhook-Signature: sha256=$sig" -d "$body"
//! # HTTP/1.1 200 OK                     (the order is fulfilled)
//! # ... the same command again:
//! # HTTP/1.1 200 OK
//! # idempotent-replayed: true           (nothing fulfilled twice)
//! ```

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
// With the facade's `http-axum` feature these are `idem::http::...`.
use idem_http::{ClientIdentity, IdempotencyLayer};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Event {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    data: serde_json::Value,
}

/// What the receiver did: one entry per event acted on.
#[derive(Debug, Default)]
pub struct Fulfilled {
    /// The ids of the events acted on, in order.
    pub events: Mutex<Vec<String>>,
}

/// The secret the provider signs each delivery with.
fn secret() -> Vec<u8> {
    std::env::var("WEBHOOK_SECRET")
        .unwrap_or_else(|_| "whsec_demo".to_owned())
        .into_bytes()
}

/// `sha256=<hex>`: the HMAC-SHA256 of `body` under `secret`, as the provider sends it in
/// `Webhook-Signature`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).expect("any key length");
    mac.update(body);
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256={hex}")
}

/// Lets through only deliveries signed with the provider's secret (compared in constant
/// time); anything else is 401 before the idempotency layer sees it, so nobody else can
/// hold an event id.
async fn verify_signature(req: Request, next: Next) -> Response {
    use hmac::Mac;
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, 1024 * 1024).await else {
        return (StatusCode::PAYLOAD_TOO_LARGE, "body over 1 MiB").into_response();
    };
    let sent = parts
        .headers
        .get("webhook-signature")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("sha256="))
        .and_then(from_hex);
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&secret()).expect("any key length");
    mac.update(&body);
    match sent {
        Some(sent) if mac.verify_slice(&sent).is_ok() => {
            next.run(Request::from_parts(parts, Body::from(body))).await
        }
        _ => (StatusCode::UNAUTHORIZED, "bad or missing Webhook-Signature").into_response(),
    }
}

fn from_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Runs once per event id: the layer answers every redelivery from the store.
async fn payment_event(State(done): State<Arc<Fulfilled>>, Json(event): Json<Event>) -> Response {
    if event.kind != "payment.succeeded" {
        // Acknowledged and stored, so the provider stops redelivering it.
        return (StatusCode::OK, "ignored").into_response();
    }
    let order = event.data["order_id"].as_str().unwrap_or("?").to_owned();
    done.events
        .lock()
        .expect("not poisoned")
        .push(event.id.clone());
    println!("fulfilled order {order} for event {}", event.id);
    (StatusCode::OK, format!("fulfilled order {order}")).into_response()
}

/// The receiver's routes on `idem`: the event id at `/id` is the key. Event ids are the
/// provider's, and webhooks carry no user's credentials, so keys are shared, written down
/// with `ClientIdentity::shared()` (a signature check, in front of this layer, is what tells
/// the provider's requests from others: without it, anyone who posts an event id first
/// holds it). The scope names this receiver, so that another service on the same store,
/// seeing the same event ids, never answers from its records.
pub fn app(idem: idem::Idem, done: Arc<Fulfilled>) -> Router {
    let idempotency = IdempotencyLayer::new(idem)
        .scope("webhook_receiver.payments")
        .key_from_json("/id")
        .client_identity(ClientIdentity::shared());
    Router::new()
        .route("/webhooks/payments", post(payment_event))
        .route_layer(idempotency)
        // The later layer is the outer one: the signature is checked first.
        .route_layer(middleware::from_fn(verify_signature))
        .with_state(done)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Kept alive until main returns: the default store's file lives in it.
    let tmp = tempfile::tempdir()?;
    let url = std::env::var("IDEM_STORE_URL")
        .unwrap_or_else(|_| format!("sqlite://{}", tmp.path().join("idem.db").display()));
    let port: u16 = match std::env::var("PORT") {
        Ok(p) => p
            .parse()
            .map_err(|e| format!("PORT={p:?} is not a port number: {e}"))?,
        Err(_) => 3001,
    };
    let idem = idem::connect(&url).await?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "listening on http://{} (store: {url})",
        listener.local_addr()?
    );
    axum::serve(listener, app(idem, Arc::default()))
        .with_graceful_shutdown(async {
            tokio::signal::ctrl_c().await.ok();
        })
        .await?;
    Ok(())
}
