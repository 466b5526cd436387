//! [`RetrySafe`]: a handler's word that nothing happened, so a retry may run it again.

/// Put in a response's extensions by a handler that did nothing (it refused before any
/// side effect, or rolled everything back): the layer then stores nothing for the key,
/// sends this response with `Idempotent-Retryable: true`, and a retry with the same key
/// runs the handler again.
///
/// Without it, once a handler has started, its outcome is what every retry gets, a 5xx
/// included: the layer cannot know whether the side effect happened before the failure.
///
/// ```
/// use http::{Response, StatusCode};
/// use idem_http::RetrySafe;
///
/// // The payment provider was unreachable: nothing was charged.
/// let mut res = Response::new(String::from("provider unavailable, nothing charged"));
/// *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
/// res.extensions_mut().insert(RetrySafe);
/// ```
///
/// With the `axum` feature it is also a response part:
/// `(StatusCode::SERVICE_UNAVAILABLE, RetrySafe, "nothing charged")`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetrySafe;

#[cfg(feature = "axum")]
impl axum_core::response::IntoResponseParts for RetrySafe {
    type Error = std::convert::Infallible;

    fn into_response_parts(
        self,
        mut res: axum_core::response::ResponseParts,
    ) -> Result<axum_core::response::ResponseParts, Self::Error> {
        res.extensions_mut().insert(self);
        Ok(res)
    }
}
