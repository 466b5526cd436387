//! [`IdempotencyService`]: reads the key and the body, then runs the handler once per key
//! in a task of its own and answers every duplicate from the store.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use futures_util::FutureExt as _;
use http::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_core::{BoxError, Key};
use tower::Service;

use crate::body::ResponseBody;
use crate::config::{
    Config, KeySource, IDEMPOTENCY_KEY_EXPIRES, IDEMPOTENT_REPLAYED, IDEMPOTENT_RETRYABLE,
    IDEMPOTENT_STORED,
};
use crate::fingerprint::{self, BodyFingerprint};
use crate::future::ResponseFuture;
use crate::identity::{Client, Missing};
use crate::json::{Json, NotRead};
use crate::key::{stored_id, IdempotencyKey};
use crate::problem::Problem;
use crate::retry_safe::RetrySafe;
use crate::stored::{expires_at, expiry_header, StoredResponse};

/// The service made by [`IdempotencyLayer`](crate::IdempotencyLayer).
///
/// The request body must be buildable from the bytes read for the fingerprint
/// (`ReqBody: From<Bytes>`, as axum's `Body` and `Full<Bytes>` are). Responses have a
/// [`ResponseBody`]: the handler's own body when it passes through, else the bytes the
/// layer holds.
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
    ResBody: Body + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        if !self.config.methods.contains(req.method()) {
            let fut = self.inner.call(req);
            return ResponseFuture::new(async move { Ok(fut.await?.map(ResponseBody::inner)) });
        }
        // The service that was polled ready is the one that must be called; keep a fresh
        // clone for the next request (tower's documented pattern).
        let fresh = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, fresh);
        ResponseFuture::new(guarded(self.config.clone(), inner, req))
    }
}

type Answer<B, E> = Result<Response<ResponseBody<B>>, E>;

/// A guarded request: validate, read the body, then hand the rest to a task of its own.
///
/// Each step answers the request at once (a refusal), passes it to the handler unguarded
/// (no key, where one is optional), or goes on: the key in a header, the checks before
/// the body is read, the body, the key and fingerprint, then [`run_guarded`].
async fn guarded<S, ReqBody, ResBody>(
    config: Arc<Config>,
    inner: S,
    req: Request<ReqBody>,
) -> Answer<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    let (mut parts, body) = req.into_parts();
    let header_key = match header_key(&config, &parts) {
        Ok(key) => key,
        Err(Stop::Answer(problem)) => return Ok(problem.to_response()),
        Err(Stop::PassThrough) => {
            return pass_through(inner, Request::from_parts(parts, body)).await
        }
    };
    // Who sent it, before its body is read.
    let client = config.identity.of(&parts);
    if let Some(res) = refused_before_body(&config, &parts, &client, header_key.is_some()) {
        return Ok(res);
    }
    let bytes = match read_body(body, config.max_body).await {
        Ok(bytes) => bytes,
        Err(res) => return Ok(res),
    };
    let (guarded, client_key) = match identify(&config, &parts, &client, header_key, &bytes) {
        Ok(identified) => identified,
        Err(Stop::Answer(problem)) => return Ok(problem.to_response()),
        Err(Stop::PassThrough) => {
            let req = Request::from_parts(parts, ReqBody::from(bytes));
            return pass_through(inner, req).await;
        }
    };
    parts.extensions.insert(client_key);
    let req = Request::from_parts(parts, ReqBody::from(bytes));

    // The handler runs in its own task: a client that disconnects drops this future, not
    // the handler, so a charge is never stopped half way (and its claim never released
    // while it still runs). The tracker lets shutdown wait for it.
    let task = config
        .tracker
        .clone()
        .spawn(run_guarded(config, inner, req, guarded));
    match task.await {
        Ok(res) => res,
        Err(err) => Ok(Problem::handler_failed(format!(
            "the task of this idempotent request ended without an answer ({err})"
        ))
        .to_response()),
    }
}

/// Why a step of [`guarded`] does not go on.
enum Stop {
    /// The request is answered with this problem, and the handler not called.
    Answer(Problem),
    /// The request goes to the handler unguarded.
    PassThrough,
}

/// The key in the request's header, checked before the body is read: `None` when the key
/// comes from the body.
fn header_key(
    config: &Config,
    parts: &http::request::Parts,
) -> Result<Option<IdempotencyKey>, Stop> {
    let KeySource::Header = config.key_source else {
        return Ok(None);
    };
    match IdempotencyKey::from_headers(&parts.headers, &config.header) {
        Ok(Some(key)) => Ok(Some(key)),
        Ok(None) if config.key_required => Err(Stop::Answer(Problem::missing_key(&config.header))),
        Ok(None) => Err(Stop::PassThrough),
        Err(problem) => Err(Stop::Answer(problem)),
    }
}

/// The refusals that need no body: a request whose client the layer cannot tell, when a
/// header holds its key (a key from the body is read first, since a body without one may
/// pass); a layer draining for shutdown; a declared length over the limit.
fn refused_before_body<B>(
    config: &Config,
    parts: &http::request::Parts,
    client: &Client,
    header_key: bool,
) -> Option<Response<ResponseBody<B>>> {
    if header_key && matches!(client, Client::Unidentified(_)) {
        return Some(unidentified(config, client).to_response());
    }
    if config.draining.load(Ordering::SeqCst) {
        return Some(retryable(Problem::shutting_down().to_response()));
    }
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > config.max_body as u64) {
        return Some(Problem::body_too_large(config.max_body).to_response());
    }
    None
}

/// The request's body, whole, up to `max_body` bytes.
async fn read_body<ReqBody, B>(
    body: ReqBody,
    max_body: usize,
) -> Result<Bytes, Response<ResponseBody<B>>>
where
    ReqBody: Body,
    ReqBody::Error: Into<BoxError>,
{
    match Limited::new(body, max_body).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => {
            Err(Problem::body_too_large(max_body).to_response())
        }
        Err(err) => Err(Problem::body_unreadable(&*err).to_response()),
    }
}

/// The stored key and the fingerprint of a request whose body has been read, with the
/// client's own key (which the handler finds in the request's extensions).
fn identify(
    config: &Config,
    parts: &http::request::Parts,
    client: &Client,
    header_key: Option<IdempotencyKey>,
    bytes: &Bytes,
) -> Result<(Guarded, IdempotencyKey), Stop> {
    let key_from_body = !matches!(config.key_source, KeySource::Header);
    let json_counts =
        config.body_fingerprint == BodyFingerprint::JsonValue && fingerprint::is_json(parts);
    let reading = if key_from_body || json_counts {
        Some(Json::parse(bytes))
    } else {
        None
    };
    let client_key = match header_key {
        Some(key) => key,
        None => match body_key(&config.key_source, bytes, reading.as_ref()) {
            Some(Ok(key)) => key,
            Some(Err(reason)) => {
                let problem = Problem::invalid_body_key(&config.key_source, &reason);
                return Err(Stop::Answer(problem));
            }
            None if config.key_required => {
                let problem = Problem::missing_body_key(&config.key_source);
                return Err(Stop::Answer(problem));
            }
            None => return Err(Stop::PassThrough),
        },
    };
    // Method, path as the client sent it (with the query) and body: the same key on another
    // endpoint or with another payload is a different request, refused with 422.
    let json = match reading {
        Some(Ok(json)) if json_counts => Some(json),
        _ => None,
    };
    let fingerprint = fingerprint::of_request(parts, bytes, json.as_ref());
    let (Some(scope), Some(id)) = (config.scope.as_deref(), stored_id(client, &client_key)) else {
        return Err(Stop::Answer(unidentified(config, client)));
    };
    // The error's own text would show the stored id, which may hold a credentials digest.
    let Ok(key) = Key::new(scope, id) else {
        let problem = Problem::invalid_key(
            &config.header,
            "the idempotency key, with its client's name, is over the store's key length; send a shorter key".to_owned(),
        );
        return Err(Stop::Answer(problem));
    };
    let guarded = Guarded {
        key,
        client_key: client_key.as_str().to_owned(),
        fingerprint,
    };
    Ok((guarded, client_key))
}

/// A request the layer does not guard: the handler's response as it is.
async fn pass_through<S, ReqBody, ResBody>(
    mut inner: S,
    req: Request<ReqBody>,
) -> Answer<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    Ok(inner.call(req).await?.map(ResponseBody::inner))
}

/// The problem a request whose client was not told gets, with a warning (once per layer
/// and cause) that says what to change.
fn unidentified(config: &Config, client: &Client) -> Problem {
    let why = match client {
        Client::Unidentified(why) => *why,
        // Only a layer built without its checks has no scope.
        _ => Missing::Secret,
    };
    let bit = 1u8 << (why as u8);
    let first = config.warned_unidentified.fetch_or(bit, Ordering::Relaxed) & bit == 0;
    match why {
        Missing::Credentials => {
            if first {
                tracing::warn!(target: "idem_http", "a guarded request carried none of the credentials that tell clients apart (Authorization, an API key header, a session cookie, a signature's key id) and was answered 400 client-unidentified; if the service authenticates otherwise (mTLS, another header or cookie), name the client with `.principal(..)` from what the authentication layer found, or `ClientIdentity::credentials().with_header(..)` / `.cookies(..)`; `.share_anonymous()` shares one key space among such requests on purpose (warned once)");
            }
            Problem::client_unidentified()
        }
        Missing::Principal => {
            if first {
                tracing::warn!(target: "idem_http", "the idempotency layer's principal function answered None, so the request was answered 500 client-unidentified: is the authentication layer inside the idempotency layer? With axum the later `.layer(..)`/`.route_layer(..)` call is the outer one: `.route_layer(idempotency).route_layer(auth)` (warned once)");
            }
            Problem::principal_missing()
        }
        Missing::Secret => {
            if first {
                tracing::error!(target: "idem_http", "the idempotency layer runs without its setup (a scope and a keyed client identity): `IdempotencyLayer::check` says what is missing (warned once)");
            }
            Problem::handler_failed(
                "the server's idempotency layer is not set up; the request was not run".to_owned(),
            )
        }
    }
}

/// The key a body carries, as [`KeySource`] says: `None` when it has none. The key must be
/// a JSON string (or what the service's function answers), with a header key's rules; a
/// body with a member twice has no key one can trust.
fn body_key(
    source: &KeySource,
    bytes: &[u8],
    reading: Option<&Result<Json, NotRead>>,
) -> Option<Result<IdempotencyKey, String>> {
    match reading? {
        Ok(_) => {}
        Err(NotRead::Invalid) => return None,
        Err(NotRead::Duplicate(name)) => {
            return Some(Err(format!(
                "cannot be read: the body has the member `{}` twice",
                name.escape_debug()
            )))
        }
    }
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let text = match source {
        KeySource::Header => return None,
        KeySource::JsonPointer(pointer) => match value.pointer(pointer)? {
            serde_json::Value::String(text) => text.clone(),
            serde_json::Value::Null => return None,
            other => {
                let kind = match other {
                    serde_json::Value::Number(_) => "a number",
                    serde_json::Value::Bool(_) => "a boolean",
                    serde_json::Value::Array(_) => "an array",
                    _ => "an object",
                };
                return Some(Err(format!("is {kind}; it must be a JSON string")));
            }
        },
        KeySource::Body(f) => f(&value)?,
    };
    Some(IdempotencyKey::from_body_value(&text))
}

/// One guarded request's key: the stored one (whose `Display` never shows a credentials
/// digest) and the client's own.
struct Guarded {
    key: Key,
    client_key: String,
    fingerprint: idem_core::Fingerprint,
}

/// Why the engine's body ended without a response to store.
enum Failure<B> {
    /// The engine refused or failed (duplicate, key reuse, store outage).
    Idem(idem_core::Error),
    /// A response that is not the operation's result (401, 429, ..., or one the handler
    /// marked [`RetrySafe`]): sent to this caller only; the key is released.
    NotStored(Response<ResponseBody<B>>),
}

impl<B> From<idem_core::Error> for Failure<B> {
    fn from(err: idem_core::Error) -> Self {
        Failure::Idem(err)
    }
}

/// Claims the key, runs the handler, stores its outcome; or answers from the store.
///
/// Once the handler has started, its outcome is what every retry gets: a 5xx is stored, a
/// panic is stored as a 500 problem, and so is an error of the inner service or of the
/// response body; a response too large or streaming to store goes to this caller, and a
/// retry gets a problem saying so. Only what the handler marked [`RetrySafe`], and
/// answers that are not the operation's result, release the key.
async fn run_guarded<S, ReqBody, ResBody>(
    config: Arc<Config>,
    mut inner: S,
    req: Request<ReqBody>,
    guarded: Guarded,
) -> Answer<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body,
    ResBody::Error: Into<BoxError>,
{
    let Guarded {
        key,
        client_key,
        fingerprint,
    } = guarded;
    let request = GuardedRequest {
        config: &config,
        client_key: &client_key,
        // For the log of a held key: the operator resolves the stored key, not the client's.
        stored_key: key.clone(),
        scope: key.scope().to_owned(),
        expires: expires_at(config.ttl.unwrap_or_else(|| config.idem.ttl())),
    };
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
    let run = HandlerRun::default();
    let outcome = call
        .with_outcome()
        .run_fallible(|| run.handle(&request, &mut inner, req))
        .await;
    match outcome {
        Ok(outcome) if !outcome.is_replay() => {
            if let Some(err) = run.inner_error() {
                return Err(err);
            }
            Ok(match run.first() {
                Some(res) => res,
                None => rebuilt(outcome.value()),
            })
        }
        Ok(outcome) => Ok(replay(outcome.value())),
        Err(Failure::Idem(err)) => run.failed(&request, err),
        Err(Failure::NotStored(res)) => Ok(res),
    }
}

/// What every stage of one guarded request's run reads.
struct GuardedRequest<'a> {
    config: &'a Config,
    /// The client's own key, which answers and logs name.
    client_key: &'a str,
    stored_key: Key,
    scope: String,
    /// When its stored outcome expires (unix seconds).
    expires: Option<u64>,
}

/// What the handler's run leaves beside the outcome the engine stores.
struct HandlerRun<B, E> {
    /// The first caller gets the handler's response whole (every header, or the body as it
    /// streams); the store keeps the chosen headers only, for replays.
    first: Mutex<Option<Response<ResponseBody<B>>>>,
    /// The inner service's own error, which the first caller gets.
    inner_error: Mutex<Option<E>>,
    /// Set once the handler has been called: from then on a failure of the engine is not
    /// "nothing happened", whatever it says.
    ran: AtomicBool,
}

impl<B, E> Default for HandlerRun<B, E> {
    fn default() -> Self {
        HandlerRun {
            first: Mutex::new(None),
            inner_error: Mutex::new(None),
            ran: AtomicBool::new(false),
        }
    }
}

impl<B, E> HandlerRun<B, E>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    fn first(&self) -> Option<Response<ResponseBody<B>>> {
        self.first.lock().expect("not poisoned").take()
    }

    fn inner_error(&self) -> Option<E> {
        self.inner_error.lock().expect("not poisoned").take()
    }

    fn ran(&self) -> bool {
        self.ran.load(Ordering::SeqCst)
    }

    /// The engine's body: calls the handler, and answers what the store keeps of its
    /// response (a problem in place of a failure or panic).
    async fn handle<S, ReqBody>(
        &self,
        request: &GuardedRequest<'_>,
        inner: &mut S,
        req: Request<ReqBody>,
    ) -> Result<StoredResponse, Failure<B>>
    where
        S: Service<Request<ReqBody>, Response = Response<B>, Error = E>,
    {
        let (client_key, expires) = (request.client_key, request.expires);
        self.ran.store(true, Ordering::SeqCst);
        // The call itself inside the catch: a service may panic before its future.
        let called = AssertUnwindSafe(async { inner.call(req).await }).catch_unwind();
        let res = match called.await {
            Ok(Ok(res)) => res,
            Ok(Err(err)) => {
                *self.inner_error.lock().expect("not poisoned") = Some(err);
                let problem = Problem::handler_failed(format!(
                    "the service failed while it handled the request with the idempotency key `{client_key}`; it may have taken effect, so a retry gets this answer"
                ));
                return Ok(StoredResponse::problem(&problem, expires));
            }
            Err(panic) => {
                tracing::error!(target: "idem_http", panic = panic_message(&*panic), "an idempotent request's handler panicked; its outcome is stored as a 500");
                let problem = Problem::handler_failed(format!(
                    "the handler panicked while it handled the request with the idempotency key `{client_key}`; it may have taken effect, so a retry gets this answer"
                ));
                return Ok(StoredResponse::problem(&problem, expires));
            }
        };
        self.keep(request, res).await
    }

    /// What the store keeps of the handler's response: the response read whole, or a
    /// problem when it is too large or its body fails; a response that is not the
    /// operation's result is not stored.
    async fn keep(
        &self,
        request: &GuardedRequest<'_>,
        res: Response<B>,
    ) -> Result<StoredResponse, Failure<B>> {
        let (config, client_key, expires) = (request.config, request.client_key, request.expires);
        let marked = res.extensions().get::<RetrySafe>().is_some();
        if marked || !config.stores_status(res.status()) {
            let mut res = res.map(ResponseBody::inner);
            if marked || config.retryable_unstored(res.status()) {
                res = retryable(res);
            }
            return Err(Failure::NotStored(res));
        }
        let (mut parts, body) = res.into_parts();
        if let Some(value) = expires.and_then(expiry_header) {
            parts.headers.insert(IDEMPOTENCY_KEY_EXPIRES, value);
        }
        let read = AssertUnwindSafe(read_bounded(body, config, &parts))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| {
                Read::Failed(format!("it panicked: {}", panic_message(&*panic)).into())
            });
        let first = |res| *self.first.lock().expect("not poisoned") = Some(res);
        match read {
            Read::Whole(bytes) => {
                let stored = StoredResponse::new(&parts, &bytes, &config.stored_headers, expires);
                first(Response::from_parts(parts, ResponseBody::full(bytes)));
                Ok(stored)
            }
            Read::TooLarge { read, rest } => {
                tracing::warn!(target: "idem_http", limit = config.max_response_body, "an idempotent response is too large or streaming to store; a retry gets a problem response");
                first(Response::from_parts(
                    parts,
                    ResponseBody::resumed(read, rest),
                ));
                let problem = Problem::response_not_stored(client_key, config.max_response_body);
                Ok(StoredResponse::problem(&problem, expires))
            }
            Read::Failed(err) => {
                let problem = Problem::handler_failed(format!(
                    "the handler's response body failed ({err}) after the request with the idempotency key `{client_key}` ran; it may have taken effect, so a retry gets this answer"
                ));
                Ok(StoredResponse::problem(&problem, expires))
            }
        }
    }

    /// The answer when the engine refused or failed.
    fn failed(self, request: &GuardedRequest<'_>, err: idem_core::Error) -> Answer<B, E> {
        let (client_key, scope) = (request.client_key, &request.scope);
        match err {
            // A step of the handler's failed in a way that leaves its outcome unknown (this
            // request), or an earlier request's did (a retry): the key is held, and whatever
            // the handler answered is not what the client gets, since nobody knows yet
            // whether the operation took effect. Neither a `Retry-After` nor the retryable
            // mark: a retry can only get this answer again until the step is resolved.
            idem_core::Error::OutcomeUnknown { ref step, .. } => {
                if self.ran() {
                    tracing::warn!(target: "idem_http", key = %request.stored_key, step = %step,
                        "an idempotent request's step has an unknown outcome: its key is held until the step is resolved (`idem steps` / `idem resolve` with this key; `idem get --scope .. --idempotency-key ..` finds a key whose client is `@[client]`)");
                } else {
                    tracing::debug!(target: "idem_http", scope = %scope, idempotency_key = %client_key.escape_debug(), step = %step,
                        "a request on a held key: its step's outcome is still unknown");
                }
                self.inner_error();
                Ok(Problem::for_client(&err, client_key).to_response())
            }
            err if self.ran() => {
                // The handler ran, but its outcome could not be stored (the store failed at
                // the end): the claim is kept until its lease ends. The first caller gets
                // the handler's own response if there is one; else a problem that is not
                // marked retryable, since a retry after the lease would run it again.
                tracing::warn!(target: "idem_http", scope = %scope, idempotency_key = %client_key.escape_debug(), error = %without_key(&err), "an idempotent request ran but its outcome could not be stored");
                if let Some(err) = self.inner_error() {
                    return Err(err);
                }
                let res = match self.first() {
                    Some(res) => res,
                    None => Problem::not_stored_after_run(client_key).to_response(),
                };
                Ok(not_stored(res))
            }
            err => Ok(refused(&err, client_key, scope)),
        }
    }
}

/// The answer when the engine refused a request before its handler ran: nothing ran for
/// an answer marked retryable (or it still runs), so the same request later is safe.
fn refused<B: From<Bytes>>(err: &idem_core::Error, client_key: &str, scope: &str) -> Response<B> {
    use idem_core::Error as E;
    let problem = Problem::for_client(err, client_key);
    if problem.status.is_server_error() {
        tracing::warn!(target: "idem_http", scope = %scope, error = %without_key(err), status = problem.status.as_u16(), "idempotent request failed in the layer");
    } else {
        tracing::debug!(target: "idem_http", scope = %scope, error = %without_key(err), status = problem.status.as_u16(), "idempotent request refused");
    }
    let safe = matches!(
        err,
        E::InProgress { .. } | E::WaitTimeout { .. } | E::Store { .. }
    );
    let res = problem.to_response();
    if safe {
        retryable(res)
    } else {
        res
    }
}

/// What reading a response body for the store gave.
enum Read<B> {
    /// All of it, within the limit.
    Whole(Bytes),
    /// Over the limit, or a stream (`text/event-stream`, or a known length over the limit):
    /// what was read, and the rest, to pass through.
    TooLarge {
        read: VecDeque<Bytes>,
        rest: std::pin::Pin<Box<B>>,
    },
    /// The body failed.
    Failed(BoxError),
}

/// Reads `body` up to the limit, never more: a larger or endless body is handed back with
/// what was read of it. A body of no known length is read only while it ends quickly
/// (`unsized_response_wait` and `_bytes`): one that does not streams to its client.
async fn read_bounded<B>(body: B, config: &Config, parts: &http::response::Parts) -> Read<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut body = Box::pin(body);
    let sized = body.size_hint().exact().is_some();
    let (limit, deadline) = if sized {
        (config.max_response_body, None)
    } else {
        (
            config.max_response_body.min(config.unsized_response_bytes),
            Some(tokio::time::Instant::now() + config.unsized_response_wait),
        )
    };
    let streaming = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.split(';')
                .next()
                .is_some_and(|e| e.trim().eq_ignore_ascii_case("text/event-stream"))
        });
    if streaming || body.size_hint().lower() > limit as u64 {
        return Read::TooLarge {
            read: VecDeque::new(),
            rest: body,
        };
    }
    let mut read = VecDeque::new();
    let mut len = 0usize;
    loop {
        let frame = match deadline {
            None => body.frame().await,
            // Dropping `frame()` loses nothing: it only polls the body.
            Some(at) => match tokio::time::timeout_at(at, body.frame()).await {
                Ok(frame) => frame,
                Err(_) => return Read::TooLarge { read, rest: body },
            },
        };
        match frame {
            None => break,
            Some(Err(err)) => return Read::Failed(err.into()),
            Some(Ok(frame)) => {
                // Trailers cannot be stored; the data is what a replay sends.
                let Ok(mut data) = frame.into_data() else {
                    continue;
                };
                let chunk = data.copy_to_bytes(data.remaining());
                len += chunk.len();
                read.push_back(chunk);
                if len > limit {
                    return Read::TooLarge { read, rest: body };
                }
            }
        }
    }
    Read::Whole(match read.len() {
        0 => Bytes::new(),
        1 => read.pop_front().unwrap_or_default(),
        _ => {
            let mut all = Vec::with_capacity(len);
            for chunk in read {
                all.extend_from_slice(&chunk);
            }
            Bytes::from(all)
        }
    })
}

/// A panic's message, when it is text.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(not text)")
}

/// A response whose outcome the store did not keep: it says so, and says no expiry, since
/// no record was made that a retry would find.
fn not_stored<B>(mut res: Response<B>) -> Response<B> {
    res.headers_mut().remove(IDEMPOTENCY_KEY_EXPIRES);
    res.headers_mut()
        .insert(IDEMPOTENT_STORED, HeaderValue::from_static("false"));
    res
}

/// An engine error for a log line, without its key (whose id may hold a digest of the
/// client's credentials): the store's failure, or what kind of error it is.
fn without_key(err: &idem_core::Error) -> String {
    use idem_core::Error as E;
    let mut out = match err {
        E::Store { source, .. } => source.to_string(),
        E::InProgress { .. } | E::WaitTimeout { .. } => {
            "a request with the key is in progress".to_owned()
        }
        E::KeyReuse { .. } => "the key was used for another request".to_owned(),
        E::LeaseLost { .. } => "the claim's lease was lost".to_owned(),
        E::Decode { .. } => "the stored record could not be decoded".to_owned(),
        E::Encode { .. } => "the response could not be encoded".to_owned(),
        _ => "the idempotency engine failed".to_owned(),
    };
    let mut source = match err {
        E::Store { source, .. } => std::error::Error::source(source),
        _ => None,
    };
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

/// Marks a response after which the same request with the same key is safe to resend.
fn retryable<B>(mut res: Response<B>) -> Response<B> {
    res.headers_mut()
        .insert(IDEMPOTENT_RETRYABLE, HeaderValue::from_static("true"));
    res
}

/// The stored response, marked as a replay.
fn replay<B: From<Bytes>>(stored: &StoredResponse) -> Response<B> {
    let mut res = rebuilt(stored);
    res.headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    res
}

/// The stored response as sent.
fn rebuilt<B: From<Bytes>>(stored: &StoredResponse) -> Response<B> {
    stored.to_response::<B>().unwrap_or_else(|| {
        Problem::handler_failed(format!(
            "the stored response (status {}) could not be rebuilt",
            stored.status
        ))
        .to_response()
    })
}
