//! A payments service whose charge endpoint is safe to retry: one `.route_layer(...)` line.
//!
//! ```sh
//! cargo run -p idem-integration --example payments_service
//! ```
//!
//! `IDEM_STORE_URL` names the store (default: SQLite in a temporary file; `postgres://...`
//! and `redis://...` with the `postgres` or `redis` feature); `PORT` the port on 127.0.0.1
//! (default 3000; 0 picks a free one). It prints `listening on http://...` when ready, and
//! on Ctrl-C waits for the charges still running before it exits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
// With the facade's `http-axum` feature these are `idem::http::...`; the example names the
// crate itself so that it runs without feature flags.
use idem_http::{IdempotencyKey, IdempotencyLayer, Problem};
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize)]
struct ChargeRequest {
    order_id: String,
    amount: u64,
    currency: String,
}

#[derive(Debug, Clone, Serialize)]
struct Payment {
    id: String,
    order_id: String,
    amount: u64,
    currency: String,
    status: &'static str,
    /// The key passed on to the payment provider, so that its side is idempotent too.
    provider_idempotency_key: String,
}

#[derive(Default)]
struct Payments {
    next_id: AtomicU64,
    by_id: Mutex<HashMap<String, Payment>>,
}

/// Runs once per `Idempotency-Key`: the layer answers every retry from the store.
async fn charge(
    State(payments): State<Arc<Payments>>,
    key: IdempotencyKey,
    Json(req): Json<ChargeRequest>,
) -> Response {
    if req.amount == 0 {
        return Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-amount",
            "Invalid amount",
            "the amount must be at least 1 (in the currency's minor unit)",
        )
        .into_response();
    }
    let id = format!(
        "pay_{}",
        payments.next_id.fetch_add(1, Ordering::SeqCst) + 1
    );
    let payment = Payment {
        id: id.clone(),
        order_id: req.order_id,
        amount: req.amount,
        currency: req.currency,
        status: "succeeded",
        provider_idempotency_key: key.into_string(),
    };
    payments
        .by_id
        .lock()
        .expect("not poisoned")
        .insert(id.clone(), payment.clone());
    let location = format!("/payments/{id}");
    (
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(payment),
    )
        .into_response()
}

async fn get_payment(State(payments): State<Arc<Payments>>, Path(id): Path<String>) -> Response {
    match payments.by_id.lock().expect("not poisoned").get(&id) {
        Some(payment) => Json(payment.clone()).into_response(),
        None => Problem::new(
            StatusCode::NOT_FOUND,
            "payment-not-found",
            "Payment not found",
            format!("there is no payment `{id}`"),
        )
        .into_response(),
    }
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
        Err(_) => 3000,
    };
    let idem = idem::connect(&url).await?;

    let idempotency = IdempotencyLayer::new(idem).scope("payments");
    let drain = idempotency.drain_handle();
    let app = Router::new()
        .route("/payments/charge", post(charge))
        .route_layer(idempotency)
        .route("/payments/{id}", get(get_payment))
        .with_state(Arc::new(Payments::default()));

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!(
        "listening on http://{} (store: {url})",
        listener.local_addr()?
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            tokio::signal::ctrl_c().await.ok();
        })
        .await?;
    drain.drain().await;
    Ok(())
}
