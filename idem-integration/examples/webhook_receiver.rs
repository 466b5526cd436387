//! A webhook receiver that acts once per event, however often the provider delivers it.
//!
//! ```sh
//! cargo run -p idem-integration --example webhook_receiver
//! ```
//!
//! Payment providers retry a webhook until they see a 2xx, and may deliver one event
//! twice anyway; the event's id is in the JSON body, not in a header. One layer option
//! takes the key from there: `.key_from_json("/id")`. `IDEM_STORE_URL` names the store
//! (default: SQLite in a temporary file); `PORT` the port on 127.0.0.1 (default 3001; 0
//! picks a free one).
//!
//! ```sh
//! curl -i http://127.0.0.1:3001/webhooks/payments -H 'Content-Type: application/json' \
//!   -d '{"id": "evt_1", "type": "payment.succeeded", "data": {"order_id": "o-1"}}'
//! # HTTP/1.1 200 OK                     (the order is fulfilled)
//! # ... the same command again:
//! # HTTP/1.1 200 OK
//! # idempotent-replayed: true           (nothing fulfilled twice)
//! ```

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
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
