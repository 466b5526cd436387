//! # idem-http: the `Idempotency-Key` header for tower and axum services
//!
//! [`IdempotencyLayer`] gives any tower service (an axum `Router`, a single route) the
//! semantics of the IETF draft "The Idempotency-Key HTTP Header Field" on any idem store:
//! a guarded request runs its handler once per key, and every retry gets the stored response.
//!
//! ```
//! use std::convert::Infallible;
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::{BodyExt, Full};
//! use idem_core::Idem;
//! use idem_http::{ClientIdentity, IdempotencyLayer};
//! use tower::{service_fn, Layer, ServiceExt};
//! # use idem_stores::MemoryStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! # let secret_from_config = "a secret from the deployment's configuration";
//! let layer = IdempotencyLayer::new(Idem::new(MemoryStore::new()))
//!     .scope("payments") // this service's own key space
//!     .client_identity(ClientIdentity::credentials().keyed(secret_from_config));
//! let service = layer.layer(service_fn(|_req: Request<Full<Bytes>>| async {
//!     Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("charged"))))
//! }));
//! let charge = || {
//!     Request::post("/charge")
//!         .header("authorization", "Bearer a-token-of-this-client")
//!         .header("idempotency-key", "7c9e6679-7425-40de-944b-e07fc1f90ae7")
//!         .body(Full::new(Bytes::from(r#"{"amount":1000}"#)))
//!         .unwrap()
//! };
//! let first = service.clone().oneshot(charge()).await.unwrap();
//! let retry = service.clone().oneshot(charge()).await.unwrap();
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! assert_eq!(retry.into_body().collect().await.unwrap().to_bytes(), "charged");
//!
//! let no_key = Request::post("/charge")
//!     .header("authorization", "Bearer a-token-of-this-client")
//!     .body(Full::new(Bytes::new()))
//!     .unwrap();
//! let res = service.clone().oneshot(no_key).await.unwrap();
//! assert_eq!(res.status(), StatusCode::BAD_REQUEST);
//!
//! // No credentials the layer tells clients by: refused, never run in a shared key space.
//! let nobody = Request::post("/charge")
//!     .header("idempotency-key", "7c9e6679-7425-40de-944b-e07fc1f90ae7")
//!     .body(Full::new(Bytes::from(r#"{"amount":1000}"#)))
//!     .unwrap();
//! let res = service.oneshot(nobody).await.unwrap();
//! assert_eq!(res.status(), StatusCode::BAD_REQUEST);
//! # let _ = first;
//! # }
//! ```
//!
//! ## What a guarded request gets
//!
//! POST and PATCH are guarded by default; other methods pass through untouched. Every error
//! is an RFC 9457 `application/problem+json` body ([`Problem`]) saying what was wrong.
//!
//! | request | response |
//! | --- | --- |
//! | first request with a key | the handler's response; stored as below |
//! | same key, same client, same method, path, query and body | the stored status, stored headers and body, `Idempotent-Replayed: true` |
//! | same key while the first still runs | 409 with `Retry-After` (or the first's response, with [`InProgress::Wait`](idem_core::InProgress::Wait)) |
//! | same key, another method, path, query or body | 422 |
//! | same key from another client ([`ClientIdentity`]) | a request of its own |
//! | no credentials the identity tells clients by (or a principal of `None`) | 400 (500) `client-unidentified`; the handler does not run |
//! | no key, when required (the default) | 400 |
//! | several keys, an empty key, a key over 255 characters, or not printable ASCII (a key from the body too) | 400 |
//! | a body over [`IdempotencyLayer::max_body`] | 413; the handler does not run |
//! | the store is unreachable | 503; the handler does not run |
//! | the server is draining ([`Drain::drain`]) | 503 with `Retry-After` |
//! | a step of the handler ([`idem_core::step`]) whose outcome is unknown ([`Step::unknown_if`](idem_core::Step::unknown_if)), and every later request with the key until the step is resolved | 409 `urn:idem:problem:outcome-unknown`, no `Retry-After`, not retryable |
//!
//! Once a handler has started, its outcome is what every retry gets: the layer cannot know
//! whether a side effect happened before a failure. So a 5xx is stored, and a panic is
//! stored as a 500 problem. Not stored (the key is released, a retry runs again): 401, 403,
//! 408, 409 and 429, which are not the operation's result
//! ([`IdempotencyLayer::unstored_statuses`]), and a response the handler marked
//! [`RetrySafe`]. A response over [`IdempotencyLayer::max_response_body`] (4 MiB), an
//! event stream, or a body of no known length that does not end within 250 ms and 64 KiB
//! ([`IdempotencyLayer::unsized_response`]) streams to its client; a retry gets a problem
//! saying it could not be stored. Answers after which resending is safe carry
//! `Idempotent-Retryable: true` ([`IDEMPOTENT_RETRYABLE`]); a stored or replayed response
//! says when its key expires ([`IDEMPOTENCY_KEY_EXPIRES`]); a handler's response whose
//! outcome the store failed to keep says `Idempotent-Stored: false` ([`IDEMPOTENT_STORED`])
//! instead.
//!
//! A key belongs to a client ([`ClientIdentity`]: by default a keyed digest of its
//! credentials, the `Authorization`, `X-Api-Key`, `Api-Key`, `X-Auth-Token` and
//! `X-Access-Token` headers (a signed scheme by its stable part), the `keyid` of the
//! `Signature-Input` and `Signature` headers and the session cookies; or the principal
//! your authentication layer found), so no client is ever
//! served another's response; a request whose client the layer cannot tell is refused, and
//! keys are shared only where the service says so ([`ClientIdentity::shared`]). Each
//! service names its own key space ([`IdempotencyLayer::scope`]): the layer does not build
//! without it, nor with an unkeyed digest unless asked by name. The
//! request is its method, its path and query as the client sent them (before axum's `nest`
//! stripped a prefix), and its body: a JSON body by its value ([`BodyFingerprint`]). The
//! handler runs in a task of its own: a client that disconnects does not cancel it, and its
//! retry gets the stored response. [`Drain`] lets a shutdown wait for handlers still
//! running. Webhooks, whose id is in the body, take their key from there with
//! [`IdempotencyLayer::key_from_json`].
//!
//! ## Features
//!
//! - `axum`: [`IdempotencyKey`] as an extractor, and `IntoResponse` for [`IdemError`] and
//!   [`Problem`], for handlers that use `#[idempotent]` directly.
//! - `client`: `IdempotentClient`, the client half on `reqwest`: one key per logical
//!   request, retried with the same key on what a retry can fix without a second run,
//!   within a deadline. `rustls` adds reqwest's rustls TLS.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod body;
mod config;
mod fingerprint;
mod future;
mod identity;
mod json;
mod key;
mod layer;
mod problem;
mod retry_safe;
mod service;
mod stored;

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
mod extract;

#[cfg(feature = "client")]
mod client;

pub use body::ResponseBody;
pub use config::{
    DEFAULT_MAX_BODY, DEFAULT_MAX_RESPONSE_BODY, DEFAULT_UNSIZED_RESPONSE_BYTES,
    DEFAULT_UNSIZED_RESPONSE_WAIT, IDEMPOTENCY_KEY, IDEMPOTENCY_KEY_EXPIRES, IDEMPOTENT_REPLAYED,
    IDEMPOTENT_RETRYABLE, IDEMPOTENT_STORED, MAX_KEY_LEN,
};
pub use fingerprint::BodyFingerprint;
pub use future::ResponseFuture;
pub use identity::{ClientIdentity, SESSION_COOKIES};
pub use key::{stored_key, IdempotencyKey};
pub use layer::{Drain, IdempotencyLayer, LayerSetupError};
pub use problem::{IdemError, Problem, PROBLEM_JSON};
pub use retry_safe::RetrySafe;
pub use service::IdempotencyService;

#[cfg(feature = "axum")]
pub use extract::IdempotencyKeyRejection;

#[cfg(feature = "client")]
#[cfg_attr(docsrs, doc(cfg(feature = "client")))]
pub use client::{ClientError, IdempotentClient, IdempotentRequest, RetryPolicy};
