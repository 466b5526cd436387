//! [`IdempotencyService`]: reads the key and the body, then runs the handler once per key
//! in a task of its own and answers every duplicate from the store.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_LENGTH};
use http::{response, Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_core::{BoxError, Fingerprint, Key};
use tower::Service;

use crate::config::{Config, IDEMPOTENT_REPLAYED};
use crate::future::ResponseFuture;
use crate::key::{stored_id, IdempotencyKey};
use crate::problem::Problem;
use crate::stored::StoredResponse;

/// The service made by [`IdempotencyLayer`](crate::IdempotencyLayer).
///
/// The request body must be buildable from the bytes read for the fingerprint
/// (`ReqBody: From<Bytes>`, as axum's `Body` and `Full<Bytes>` are), and so must the
/// response body, for replays and problems.
#[derive(Debug, Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> IdempotencyService<S> {
    pub(crate) fn new(inner: S, config: Arc<Config>) -> Self {
        IdempotencyService { inner, config }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body + From<Bytes> + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<Response<ResBody>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        if !self.config.methods.contains(req.method()) {
            return ResponseFuture::new(self.inner.call(req));
        }
        // The service that was polled ready is the one that must be called; keep a fresh
        // clone for the next request (tower's documented pattern).
        let fresh = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, fresh);
        ResponseFuture::new(guarded(self.config.clone(), inner, req))
    }
}

/// A guarded request: validate, read the body, then hand the rest to a task of its own.
async fn guarded<S, ReqBody, ResBody>(
    config: Arc<Config>,
    mut inner: S,
    req: Request<ReqBody>,
) -> Result<Response<ResBody>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body + From<Bytes> + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    let (mut parts, body) = req.into_parts();
    let client_key = match IdempotencyKey::from_headers(&parts.headers, &config.header) {
        Ok(Some(key)) => key,
        Ok(None) if config.key_required => {
            return Ok(Problem::missing_key(&config.header).to_response())
        }
        Ok(None) => return inner.call(Request::from_parts(parts, body)).await,
        Err(problem) => return Ok(problem.to_response()),
    };
    if config.draining.load(Ordering::SeqCst) {
        return Ok(Problem::shutting_down().to_response());
    }
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > config.max_body as u64) {
        return Ok(Problem::body_too_large(config.max_body).to_response());
    }
    let bytes = match Limited::new(body, config.max_body).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => {
            return Ok(Problem::body_too_large(config.max_body).to_response())
        }
        Err(err) => return Ok(Problem::body_unreadable(&*err).to_response()),
    };
    // Method, path (with the query) and body digest: the same key on another endpoint or
    // with another payload is a different request, refused with 422.
    let fingerprint = Fingerprint::of(&(
        parts.method.as_str(),
        parts.uri.path(),
        parts.uri.query(),
        blake3::hash(&bytes).as_bytes(),
    ));
    let principal = config.principal.as_ref().and_then(|f| f(&parts));
    let key = match Key::new(
        config.scope.as_str(),
        stored_id(principal.as_deref(), &client_key),
    ) {
        Ok(key) => key,
        Err(err) => return Ok(Problem::from_error(&err).to_response()),
    };
    let key_text = client_key.as_str().to_owned();
    parts.extensions.insert(client_key);
    let req = Request::from_parts(parts, ReqBody::from(bytes));

    // The handler runs in its own task: a client that disconnects drops this future, not
    // the handler, so a charge is never stopped half way (and its claim never released
    // while it still runs). The tracker lets shutdown wait for it.
    let task =
        config
            .tracker
            .clone()
            .spawn(run_guarded(config, inner, req, key, key_text, fingerprint));
    match task.await {
        Ok(res) => res,
        Err(err) => Ok(Problem::handler_failed(format!(
            "the handler of this idempotent request failed ({err}); its key was released, so a retry runs it again"
        ))
        .to_response()),
    }
}

/// Why the engine's body ended without a response to store.
enum Failure<E> {
    /// The engine refused or failed (duplicate, key reuse, store outage).
    Idem(idem_core::Error),
    /// The inner service failed: passed to the caller as is.
    Inner(E),
    /// The response body failed while it was read.
    Body(BoxError),
    /// A response whose status is not stored: sent to this caller only; the key is released.
    NotStored(response::Parts, Bytes),
}

impl<E> From<idem_core::Error> for Failure<E> {
    fn from(err: idem_core::Error) -> Self {
        Failure::Idem(err)
    }
}

/// Claims the key, runs the handler, stores its response; or answers from the store.
async fn run_guarded<S, ReqBody, ResBody>(
    config: Arc<Config>,
    mut inner: S,
    req: Request<ReqBody>,
    key: Key,
    client_key: String,
    fingerprint: Fingerprint,
) -> Result<Response<ResBody>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body + From<Bytes>,
    ResBody::Error: Into<BoxError>,
{
    let mut call = config
        .idem
        .call(key, fingerprint)
        .in_progress(config.in_progress);
    if let Some(timeout) = config.wait_timeout {
        call = call.wait_timeout(timeout);
    }
    if let Some(ttl) = config.ttl {
        call = call.ttl(ttl);
    }
    if let Some(lease) = config.lease {
        call = call.lease(lease);
    }
    // The first caller gets the handler's response whole (every header); the store keeps
    // the chosen headers only, for replays.
    let first: Mutex<Option<(response::Parts, Bytes)>> = Mutex::new(None);
    let outcome = call
        .with_outcome()
        .run_fallible(|| async {
            let res = inner.call(req).await.map_err(Failure::Inner)?;
            let (parts, body) = res.into_parts();
            let bytes = body
                .collect()
                .await
                .map_err(|e| Failure::Body(e.into()))?
                .to_bytes();
            if !config.stores_status(parts.status) {
                return Err(Failure::NotStored(parts, bytes));
            }
            let stored = StoredResponse::new(&parts, &bytes, &config.stored_headers);
            *first.lock().expect("not poisoned") = Some((parts, bytes));
            Ok(stored)
        })
        .await;
    match outcome {
        Ok(outcome) if !outcome.is_replay() => {
            let first = first.lock().expect("not poisoned").take();
            Ok(match first {
                Some((parts, bytes)) => Response::from_parts(parts, ResBody::from(bytes)),
                None => replay(outcome.value()),
            })
        }
        Ok(outcome) => Ok(replay(outcome.value())),
        Err(Failure::Idem(err)) => {
            let problem = Problem::for_client(&err, &client_key);
            if problem.status.is_server_error() {
                tracing::warn!(target: "idem_http", error = &err as &dyn std::error::Error, status = problem.status.as_u16(), "idempotent request failed in the layer");
            } else {
                tracing::debug!(target: "idem_http", error = %err, status = problem.status.as_u16(), "idempotent request refused");
            }
            Ok(problem.to_response())
        }
        Err(Failure::NotStored(parts, bytes)) => Ok(Response::from_parts(parts, ResBody::from(bytes))),
        Err(Failure::Inner(err)) => Err(err),
        Err(Failure::Body(err)) => Ok(Problem::handler_failed(format!(
            "the handler's response body failed: {err}; its key was released, so a retry runs it again"
        ))
        .to_response()),
    }
}

/// The stored response, marked as a replay.
fn replay<B: From<Bytes>>(stored: &StoredResponse) -> Response<B> {
    match stored.to_response::<B>() {
        Some(mut res) => {
            res.headers_mut()
                .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            res
        }
        None => Problem::handler_failed(format!(
            "the stored response (status {}) could not be rebuilt",
            stored.status
        ))
        .to_response(),
    }
}
