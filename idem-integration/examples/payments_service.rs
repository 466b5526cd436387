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
//!
//! Every request authenticates with an API key (`Authorization: Bearer sk_test_alice`, or
//! `sk_test_bob`): the authentication layer, outside the idempotency layer, leaves the
//! customer in the request's extensions, and the idempotency layer keeps each customer's
//! keys apart by it. `IDEM_HTTP_SCOPE` names the service's key space (default `payments`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
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
    /// The customer who was charged.
    customer: String,
    /// The key passed on to the payment provider, so that its side is idempotent too: the
    /// customer's key, under the customer.
    provider_idempotency_key: String,
}

/// The authenticated customer: what the authentication layer leaves in the request's
/// extensions, and what the idempotency layer tells clients apart by.
#[derive(Debug, Clone)]
struct Customer(String);

/// The API keys and their customers. A real service looks its keys up in its database.
const API_KEYS: &[(&str, &str)] = &[("sk_test_alice", "cus_alice"), ("sk_test_bob", "cus_bob")];

/// Authentication: `Authorization: Bearer <api key>` is its customer; anything else is 401.
async fn authenticate(mut req: Request, next: Next) -> Response {
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let customer = API_KEYS
        .iter()
        .find(|(key, _)| Some(*key) == token)
        .map(|(_, customer)| Customer((*customer).to_owned()));
    match customer {
        Some(customer) => {
            req.extensions_mut().insert(customer);
            next.run(req).await
        }
        None => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            Problem::new(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "Unauthenticated",
                "send `Authorization: Bearer <your API key>`",
            ),
        )
            .into_response(),
    }
}

#[derive(Default)]
struct Payments {
    next_id: AtomicU64,
    by_id: Mutex<HashMap<String, Payment>>,
}

/// Runs once per `Idempotency-Key`: the layer answers every retry from the store.
async fn charge(
    State(payments): State<Arc<Payments>>,
    Extension(customer): Extension<Customer>,
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
        // The provider sees every customer's charges under one account: the customer is
        // part of the key passed on, or two customers' equal keys would be one charge there.
        provider_idempotency_key: format!("{}/{}", customer.0, key.as_str()),
        customer: customer.0,
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

async fn get_payment(
    State(payments): State<Arc<Payments>>,
    Extension(customer): Extension<Customer>,
    Path(id): Path<String>,
) -> Response {
    match payments.by_id.lock().expect("not poisoned").get(&id) {
        // Another customer's payment is not found, not forbidden: its id tells nothing.
        Some(payment) if payment.customer == customer.0 => Json(payment.clone()).into_response(),
        _ => Problem::new(
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

    let scope = std::env::var("IDEM_HTTP_SCOPE").unwrap_or_else(|_| "payments".to_owned());
    // A client is the customer the authentication layer found: the layer reads it from the
    // request's extensions, never from a header a client could write.
    let idempotency = IdempotencyLayer::new(idem)
        .scope(scope)
        // The lease bounds how long a crashed instance's charges answer 409: a bit over
        // the handler's longest run (the provider's timeout), extended while it runs.
        .lease(std::time::Duration::from_secs(10))
        .principal(|parts| parts.extensions.get::<Customer>().map(|c| c.0.clone()));
    let drain = idempotency.drain_handle();
    let app = Router::new()
        .route("/payments/charge", post(charge))
        .route_layer(idempotency)
        .route("/payments/{id}", get(get_payment))
        // The later layer is the outer one: authentication runs before idempotency.
        .layer(middleware::from_fn(authenticate))
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
