//! Error responses as RFC 9457 `application/problem+json` bodies, and the HTTP status of
//! every [`idem_core::Error`].

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use serde::Serialize;

use crate::config::KeySource;

/// The media type of every error body the layer writes.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem: the status, a stable `type` URI naming what went wrong, a short
/// `title`, a `detail` for the reader, and the `Retry-After` seconds when retrying helps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// A URI naming the kind of problem, e.g. `urn:idem:problem:key-reuse`.
    #[serde(rename = "type")]
    pub kind: String,
    /// A short summary of the kind of problem.
    pub title: String,
    /// The HTTP status.
    #[serde(serialize_with = "status_code")]
    pub status: StatusCode,
    /// What went wrong with this request.
    pub detail: String,
    /// When a retry may succeed: sent as the `Retry-After` header, in whole seconds.
    #[serde(skip)]
    pub retry_after: Option<Duration>,
}

fn status_code<S: serde::Serializer>(status: &StatusCode, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u16(status.as_u16())
}

impl Problem {
    /// A problem of the kind `urn:idem:problem:<slug>`.
    pub fn new(status: StatusCode, slug: &str, title: &str, detail: impl Into<String>) -> Self {
        Problem {
            kind: format!("urn:idem:problem:{slug}"),
            title: title.to_owned(),
            status,
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// The same problem with a `Retry-After` hint (rounded up to whole seconds, at least 1).
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    pub(crate) fn missing_key(header: &HeaderName) -> Self {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "idempotency-key-missing",
            "Idempotency key missing",
            format!("this request requires an `{header}` header; send a unique key (a UUID) per logical request and the same key on every retry of it"),
        )
    }

    pub(crate) fn invalid_key(_header: &HeaderName, detail: String) -> Self {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "idempotency-key-invalid",
            "Invalid idempotency key",
            detail,
        )
    }

    /// The request's body carries no key where the layer looks for it.
    pub(crate) fn missing_body_key(source: &KeySource) -> Self {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "idempotency-key-missing",
            "Idempotency key missing",
            format!(
                "this request requires an idempotency key in its JSON body: {}",
                where_in_body(source)
            ),
        )
    }

    /// The key in the request's body is not one the layer accepts.
    pub(crate) fn invalid_body_key(source: &KeySource, reason: &str) -> Self {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "idempotency-key-invalid",
            "Invalid idempotency key",
            format!(
                "the idempotency key in the JSON body ({}) {reason}",
                where_in_body(source)
            ),
        )
    }

    /// The request carries none of the credentials the layer tells clients by: it is not
    /// run in a key space other clients share.
    pub(crate) fn client_unidentified() -> Self {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "client-unidentified",
            "Client not identified",
            "this request carries no credentials the server's idempotency layer tells clients by (an `Authorization` or API key header, a session cookie), so its idempotency key cannot be kept apart from other clients' keys; send your credentials with it",
        )
    }

    /// The principal function found no principal: most likely the authentication layer
    /// runs inside the idempotency layer and has not run yet.
    pub(crate) fn principal_missing() -> Self {
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "client-unidentified",
            "Client not identified",
            "the server's idempotency layer found no principal for this request, so its idempotency key cannot be kept apart from other clients' keys; the request was not run (the server's authentication layer most likely runs inside its idempotency layer, and has not run yet)",
        )
    }

    /// Stored for a request whose response went to its first client but was too large, or
    /// streamed, to store: a retry gets this instead of a second run.
    pub(crate) fn response_not_stored(key: &str, limit: usize) -> Self {
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "response-not-stored",
            "The response could not be stored",
            format!("the request with the idempotency key `{key}` ran, but its response was streamed or over the {limit} bytes the server stores, so it cannot be replayed; it is not run again"),
        )
    }

    /// The handler ran, but neither its response nor a record of it could be stored.
    pub(crate) fn not_stored_after_run(key: &str) -> Self {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "outcome-not-stored",
            "The outcome could not be stored",
            format!("the request with the idempotency key `{key}` ran, but the idempotency store failed before its outcome was stored; it may have taken effect, so do not resend it blindly"),
        )
    }

    /// A step of the request's operation may or may not have taken effect, so the key is
    /// held: no retry runs the handler or answers for it until the step is resolved.
    pub(crate) fn outcome_unknown(key: &str, step: &str) -> Self {
        Problem::new(
            StatusCode::CONFLICT,
            "outcome-unknown",
            "Outcome unknown",
            format!("the outcome of step `{step}` of the request with the idempotency key `{key}` is unknown (it may have taken effect); the key is held until the step is resolved as ran or not ran, and every request with it gets this answer until then"),
        )
    }

    pub(crate) fn body_too_large(limit: usize) -> Self {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "Request body too large",
            format!("the request body is over the {limit} bytes this endpoint reads for an idempotent request"),
        )
    }

    pub(crate) fn body_unreadable(err: &dyn std::error::Error) -> Self {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "body-unreadable",
            "Request body could not be read",
            format!("the request body could not be read: {err}"),
        )
    }

    pub(crate) fn shutting_down() -> Self {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting-down",
            "Shutting down",
            "the server is shutting down and takes no new idempotent requests; retry with the same key",
        )
        .with_retry_after(Duration::from_secs(1))
    }

    pub(crate) fn handler_failed(detail: String) -> Self {
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "handler-failed",
            "Handler failed",
            detail,
        )
    }

    /// The problem for an error of the idem engine, with the status this crate gives it:
    ///
    /// | error | status |
    /// | --- | --- |
    /// | `MissingKey`, `InvalidKey` | 400 |
    /// | `KeyReuse` | 422 |
    /// | `InProgress` | 409, `Retry-After` from the engine's hint (1 s by default) |
    /// | `WaitTimeout` | 409, `Retry-After: 1`: the first request still runs, and the same request later gets its result |
    /// | `Store`, `LeaseLost` | 503 (`Retry-After: 1` when retrying can help); the handler did not run, or its result was not stored |
    /// | `OutcomeUnknown` | 409, no `Retry-After`: a step's outcome is unknown and the key is held until someone resolves it (`idem resolve`), so retrying at once cannot help |
    /// | `Step` | 500: the handler runs a step where none can run (outside the call, a bad or repeated name), a bug to fix |
    /// | `Decode`, `Encode`, `InvalidOption`, `Connect` and others | 500 |
    pub fn from_error(err: &idem_core::Error) -> Self {
        use idem_core::Error as E;
        let detail = chain(err);
        match err {
            E::MissingKey { .. } => Problem::new(
                StatusCode::BAD_REQUEST,
                "idempotency-key-missing",
                "Idempotency key missing",
                detail,
            ),
            E::InvalidKey { .. } => Problem::new(
                StatusCode::BAD_REQUEST,
                "idempotency-key-invalid",
                "Invalid idempotency key",
                detail,
            ),
            E::KeyReuse { .. } => Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "key-reuse",
                "Idempotency key reused",
                format!("{detail}: this key was first used for a request with another method, path or body; use a new key for a new request"),
            ),
            E::InProgress { retry_after, .. } => Problem::new(
                StatusCode::CONFLICT,
                "in-progress",
                "Request in progress",
                format!("{detail}: a request with this key is still being processed; retry later with the same key"),
            )
            .with_retry_after(*retry_after),
            E::WaitTimeout { .. } => Problem::new(
                StatusCode::CONFLICT,
                "in-progress",
                "Request in progress",
                format!("{detail}: a request with this key is still being processed; retry later with the same key"),
            )
            .with_retry_after(Duration::from_secs(1)),
            E::Store { source, .. } => Problem::store_unavailable(source, detail),
            E::LeaseLost { .. } => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "lease-lost",
                "Idempotency lease lost",
                detail,
            )
            .with_retry_after(Duration::from_secs(1)),
            // No `Retry-After`, and never marked retryable: the key stays held until an
            // operator (or the reconcile hook) says whether the step took effect, and a
            // client retrying in a loop would only hammer the store.
            E::OutcomeUnknown { .. } => Problem::new(
                StatusCode::CONFLICT,
                "outcome-unknown",
                "Outcome unknown",
                detail,
            ),
            E::Step { .. } => Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "step-misused",
                "Step misused",
                detail,
            ),
            _ => Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "idempotency-failure",
                "Idempotency failure",
                detail,
            ),
        }
    }

    /// 503 for a store that failed, with a `Retry-After` when retrying can help.
    fn store_unavailable(source: &idem_core::StoreError, detail: String) -> Self {
        let p = Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store-unavailable",
            "Idempotency store unavailable",
            detail,
        );
        match source {
            // A store that lost its records says how long it refuses new keys.
            idem_core::StoreError::RecordsLost {
                retry_after: Some(after),
                ..
            } => p.with_retry_after(*after),
            s if s.is_temporary() => p.with_retry_after(Duration::from_secs(1)),
            _ => p,
        }
    }

    /// The problem the layer answers for `err`, about the key the client sent: the status
    /// of [`from_error`](Self::from_error), a detail that names the client's key rather than
    /// the stored one, and no store internals (those go to a `warn` event).
    pub(crate) fn for_client(err: &idem_core::Error, key: &str) -> Self {
        use idem_core::Error as E;
        let mut problem = Problem::from_error(err);
        problem.detail = match err {
            E::KeyReuse { .. } => format!("the idempotency key `{key}` was first used for a request with another method, path or body; use a new key for a new request"),
            E::InProgress { .. } | E::WaitTimeout { .. } => format!("a request with the idempotency key `{key}` is still being processed; retry later with the same key"),
            E::Store { .. } => format!("the idempotency store could not be reached, so the request with the key `{key}` was not processed; retry later with the same key"),
            E::LeaseLost { .. } => format!("the request with the idempotency key `{key}` ran, but its response could not be stored; retry later with the same key"),
            E::OutcomeUnknown { step, .. } => Problem::outcome_unknown(key, step).detail,
            E::Step { .. } => format!("the handler of the request with the idempotency key `{key}` ran a step where none can run (the server's log says which and why)"),
            _ => format!("the request with the idempotency key `{key}` failed in the idempotency layer"),
        };
        problem
    }

    /// The JSON body.
    pub fn body(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).expect("a problem always serializes"))
    }

    /// The response: status, `Content-Type: application/problem+json`, `Retry-After` when
    /// set, and the JSON body.
    pub fn to_response<B: From<Bytes>>(&self) -> Response<B> {
        let mut res = Response::new(B::from(self.body()));
        *res.status_mut() = self.status;
        let headers = res.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(after) = self.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(after)));
        }
        res
    }
}

/// Where in the body the layer looks for the key, for a reader.
fn where_in_body(source: &KeySource) -> String {
    match source {
        KeySource::JsonPointer(pointer) => format!("a string at `{pointer}`"),
        KeySource::Body(_) | KeySource::Header => {
            "as the service's key function reads it".to_owned()
        }
    }
}

/// Whole seconds, rounded up, at least 1: `Retry-After: 0` would invite a busy loop.
fn retry_after_secs(after: Duration) -> u64 {
    let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    secs.max(1)
}

/// The error's message and its sources', so that the reader sees the cause.
fn chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// An [`idem_core::Error`] that is a response: for handlers that use `#[idempotent]` or the
/// engine directly and return its errors (`Result<Json<Receipt>, IdemError>`). The status of
/// each error is in [`Problem::from_error`]. (`idem::Error` itself cannot implement axum's
/// `IntoResponse` outside its crate: the orphan rule.)
#[derive(Debug)]
pub struct IdemError(pub idem_core::Error);

impl IdemError {
    /// The problem this error is answered with.
    pub fn problem(&self) -> Problem {
        Problem::from_error(&self.0)
    }

    /// The response: [`Problem::from_error`]'s status and body.
    pub fn to_response<B: From<Bytes>>(&self) -> Response<B> {
        self.problem().to_response()
    }
}

impl From<idem_core::Error> for IdemError {
    fn from(err: idem_core::Error) -> Self {
        IdemError(err)
    }
}

impl std::fmt::Display for IdemError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for IdemError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}
