//! axum integration: the [`IdempotencyKey`] extractor, and problem responses.

use axum_core::extract::FromRequestParts;
use axum_core::response::{IntoResponse, Response};
use http::request::Parts;

use crate::config::IDEMPOTENCY_KEY;
use crate::key::IdempotencyKey;
use crate::problem::{IdemError, Problem};

/// Why [`IdempotencyKey`] could not be extracted: a 400 problem naming what was wrong.
#[derive(Debug, Clone)]
pub struct IdempotencyKeyRejection(pub Problem);

impl IntoResponse for IdempotencyKeyRejection {
    fn into_response(self) -> Response {
        self.0.to_response()
    }
}

/// The key the [`IdempotencyLayer`](crate::IdempotencyLayer) validated (whatever header it
/// reads), or, on a route without the layer, the `Idempotency-Key` header checked by the
/// same rules. A request without one is rejected with 400.
impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = IdempotencyKeyRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        if let Some(key) = parts.extensions.get::<IdempotencyKey>() {
            return Ok(key.clone());
        }
        match IdempotencyKey::from_headers(&parts.headers, &IDEMPOTENCY_KEY) {
            Ok(Some(key)) => Ok(key),
            Ok(None) => Err(IdempotencyKeyRejection(Problem::missing_key(
                &IDEMPOTENCY_KEY,
            ))),
            Err(problem) => Err(IdempotencyKeyRejection(problem)),
        }
    }
}

/// The status and problem body of [`Problem::from_error`].
impl IntoResponse for IdemError {
    fn into_response(self) -> Response {
        self.to_response()
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        self.to_response()
    }
}
