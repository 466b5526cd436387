//! [`IdempotencyLayer`]: the options, and the handle that drains running handlers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use http::request::Parts;
use http::{Method, StatusCode};
use idem_core::{Idem, InProgress};
use tokio_util::task::TaskTracker;

use crate::config::{Config, KeySource};
use crate::fingerprint::BodyFingerprint;
use crate::identity::ClientIdentity;
use crate::service::IdempotencyService;

/// A [`tower::Layer`](https://docs.rs/tower/0.5/tower/trait.Layer.html) that gives a service the semantics of the `Idempotency-Key` header
/// (IETF draft-ietf-httpapi-idempotency-key-header) on any idem store.
///
/// A guarded request (POST or PATCH by default) with a key runs the handler once per key
/// and client ([`ClientIdentity`]); a retry from the same client gets the stored response
/// with `Idempotent-Replayed: true`. See the crate documentation for every status it
/// answers and which responses are stored.
///
/// The layer builds only once the service has said two things, since their defaults would
/// share something: its key space ([`scope`](Self::scope), its own on a store other
/// services use too), and how a client is told ([`principal`](Self::principal), or the
/// default credentials digest keyed with a secret of the deployment:
/// [`ClientIdentity::keyed`]). Without them [`tower::Layer::layer`](https://docs.rs/tower/0.5/tower/trait.Layer.html#tymethod.layer) panics when the router
/// is built, naming what is missing; [`check`](Self::check) says the same without panicking.
///
/// ```
/// use idem_core::Idem;
/// use idem_http::IdempotencyLayer;
/// # use idem_stores::MemoryStore;
///
/// /// What the service's authentication layer leaves in the request's extensions.
/// #[derive(Clone)]
/// struct Customer { id: String }
///
/// let idem = Idem::new(MemoryStore::new());
/// let layer = IdempotencyLayer::new(idem)
///     .scope("payments")
///     .max_body(64 * 1024)
///     .principal(|parts| parts.extensions.get::<Customer>().map(|c| c.id.clone()));
/// assert!(layer.check().is_ok());
/// ```
///
/// The authentication layer goes outside this one, so that it has run when the principal
/// is read: with axum, the later `.route_layer(..)` (or `.layer(..)`) call is the outer one:
/// `.route_layer(idempotency).route_layer(authentication)`.
#[derive(Debug, Clone)]
#[must_use]
pub struct IdempotencyLayer {
    config: Config,
}

impl IdempotencyLayer {
    /// A layer on `idem` with the defaults: POST and PATCH guarded, the key required in
    /// `Idempotency-Key`, each client's keys its own (known by its credentials:
    /// [`ClientIdentity::credentials`], which needs a secret), request bodies up to 1 MiB,
    /// JSON bodies compared by value, every outcome of a handler that ran stored (5xx and
    /// panics included) but 401, 403, 408, 409 and 429, responses up to 4 MiB stored (a
    /// body of no known length only if it ends within 250 ms and 64 KiB), a concurrent
    /// duplicate answered 409. It builds once [`scope`](Self::scope) and the identity are
    /// given.
    pub fn new(idem: Idem) -> Self {
        IdempotencyLayer {
            config: Config::new(idem),
        }
    }

    /// The methods guarded (default POST and PATCH); others pass through untouched.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config.methods = methods.into_iter().collect();
        self
    }

    /// Whether a guarded request without a key is refused with 400 (the default) or passes
    /// through without idempotency.
    pub fn key_required(mut self, required: bool) -> Self {
        self.config.key_required = required;
        self
    }

    /// The header the key is read from (default `Idempotency-Key`).
    pub fn header(mut self, name: HeaderName) -> Self {
        self.config.header = name;
        self
    }

    /// The largest request body read for the fingerprint, in bytes (default 1 MiB). A
    /// larger body is answered 413 and never reaches the handler.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.config.max_body = bytes;
        self
    }

    /// The response headers stored and replayed (default `content-type`,
    /// `content-language`, `content-location`, `location`, `etag`, `last-modified`,
    /// `cache-control`, `retry-after`). The first response keeps all of its headers; a
    /// replay carries only these.
    pub fn stored_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.config.stored_headers = names.into_iter().collect();
        self
    }

    /// The key is read from the JSON body at `pointer` (RFC 6901, e.g. `/event_id`), which
    /// must be a JSON string, instead of a header: for webhooks, whose providers put the
    /// event's id in the body. The string obeys a header key's rules (1 to 255 characters
    /// of printable ASCII), taken as it is; a number, or a string that breaks them, is 400,
    /// so `1` and `"1"` are never one key. A body without it is 400 (or passes through,
    /// with [`key_required(false)`](Self::key_required)), and so is a body with a member
    /// twice (which key it carries is ambiguous). Webhooks usually come with no
    /// credentials the default [`ClientIdentity`] reads, so their keys are shared on
    /// purpose ([`ClientIdentity::shared`]): a signature check belongs in front of this
    /// layer.
    pub fn key_from_json(mut self, pointer: impl Into<String>) -> Self {
        self.config.key_source = KeySource::JsonPointer(pointer.into());
        self
    }

    /// The key is what `key` finds in the parsed JSON body, instead of a header (see
    /// [`key_from_json`](Self::key_from_json)): the text it answers obeys a header key's
    /// rules, or the request is 400. Turning a number into text is the function's choice
    /// (say `n.to_string()`), written where a reader sees it.
    pub fn key_from_body<F>(mut self, key: F) -> Self
    where
        F: Fn(&serde_json::Value) -> Option<String> + Send + Sync + 'static,
    {
        self.config.key_source = KeySource::Body(Arc::new(key));
        self
    }

    /// The largest response body stored, in bytes (default 4 MiB). A larger response, or
    /// a `text/event-stream`, passes through to its client as it streams, never buffered
    /// whole; the key then keeps a problem response ("the response could not be stored"),
    /// so a retry neither runs the handler again nor gets the body.
    pub fn max_response_body(mut self, bytes: usize) -> Self {
        self.config.max_response_body = bytes;
        self
    }

    /// How long, and how far, the layer reads a response body of no known length (chunked,
    /// a stream) before it gives up storing it (default 250 ms and 64 KiB): a body that
    /// ends within both is stored as any other; one that does not (NDJSON progress, a long
    /// poll) streams to its client from then on, what was read first, and the key keeps
    /// the "response not stored" problem, as for a body over
    /// [`max_response_body`](Self::max_response_body). The client gets its status line
    /// without waiting for the end.
    pub fn unsized_response(mut self, wait: Duration, bytes: usize) -> Self {
        self.config.unsized_response_wait = wait;
        self.config.unsized_response_bytes = bytes;
        self
    }

    /// The statuses that are not an operation's result, so never stored: the response
    /// goes to its client, the key is released, and a retry runs the handler again.
    /// Default 401, 403, 408, 409 (the handler's own; the layer's in-progress 409 is not
    /// a handler's response) and 429.
    pub fn unstored_statuses(mut self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        self.config.unstored_statuses = statuses.into_iter().collect();
        self
    }

    /// Whether 4xx responses (but the [unstored ones](Self::unstored_statuses)) are stored
    /// and replayed (default true: a declined request stays declined). When false, the key
    /// is released and a retry runs the handler again.
    pub fn store_client_errors(mut self, store: bool) -> Self {
        self.config.store_client_errors = store;
        self
    }

    /// Whether 5xx responses are stored and replayed (default true: a handler that failed
    /// half way may have charged, so a retry gets its answer). Turn it off only when every
    /// handler behind the layer undoes all it did before it answers 5xx; such a 5xx then
    /// releases the key and says `Idempotent-Retryable: true`. A single handler says so
    /// for one response with [`RetrySafe`](crate::RetrySafe) instead.
    pub fn store_server_errors(mut self, store: bool) -> Self {
        self.config.store_server_errors = store;
        self
    }

    /// What identifies a client (default [`ClientIdentity::credentials`], which needs
    /// [`keyed`](ClientIdentity::keyed) before the layer builds): a stored response is only
    /// ever replayed to the client that sent its key.
    pub fn client_identity(mut self, identity: ClientIdentity) -> Self {
        self.config.identity = identity;
        self
    }

    /// A client is its principal (the authenticated user, a tenant):
    /// `client_identity(ClientIdentity::principal(principal))`. Runs after the layers
    /// outside this one, so an authentication layer there can leave what it found in the
    /// request's extensions; take it from there, never from a header the client writes
    /// (`x-tenant`), which any client can forge. `None` is never a shared key space: the
    /// request is answered 500 `client-unidentified`, naming the likely cause (the
    /// authentication layer placed inside this one).
    pub fn principal<F>(self, principal: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.client_identity(ClientIdentity::principal(principal))
    }

    /// How the body counts in the fingerprint (default [`BodyFingerprint::JsonValue`]: a
    /// JSON body by its value, any other by its bytes).
    pub fn body_fingerprint(mut self, mode: BodyFingerprint) -> Self {
        self.config.body_fingerprint = mode;
        self
    }

    /// What a duplicate that arrives while the first request runs gets:
    /// [`InProgress::Reject`] (the default) answers 409 with `Retry-After`;
    /// [`InProgress::Wait`] waits for the first response (up to
    /// [`wait_timeout`](Self::wait_timeout), then 409).
    pub fn in_progress(mut self, mode: InProgress) -> Self {
        self.config.in_progress = mode;
        self
    }

    /// How long a duplicate waits in [`InProgress::Wait`] mode (default: the engine's).
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.config.wait_timeout = Some(timeout);
        self
    }

    /// How long responses are kept (default: the engine's ttl, 24 h unless set).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.config.ttl = Some(ttl);
        self
    }

    /// The lease of a running request's claim (default: the engine's).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = Some(lease);
        self
    }

    /// The scope of the stored keys: the service's own key space, which no other service on
    /// the same store may use (name it after the service: `"payments"`,
    /// `"orders.webhooks"`). Required: a default would be the same in every service, and
    /// two services on one store would answer each other's requests from it. Keep it
    /// across deploys (a new scope forgets the stored keys: their retries run again); give
    /// two layers in one service the same scope only when they guard the same operations.
    ///
    /// # Panics
    ///
    /// When `scope` is not a valid key scope (empty, over 256 bytes, or with a `/`): a
    /// mistake in the service's setup, not in a request, so it stops the service at startup
    /// rather than answering every request 400.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        let scope = scope.into();
        if let Err(err) = idem_core::Key::new(scope.as_str(), "-") {
            panic!("IdempotencyLayer::scope({scope:?}): {err}");
        }
        self.config.scope = Some(scope);
        self
    }

    /// Whether the layer builds: `Err` names each choice still missing (the scope, or the
    /// secret of the default client identity). [`tower::Layer::layer`](https://docs.rs/tower/0.5/tower/trait.Layer.html#tymethod.layer) panics with the same
    /// message, when the router is built.
    pub fn check(&self) -> Result<(), LayerSetupError> {
        let mut missing = Vec::new();
        if self.config.scope.is_none() {
            missing.push("no scope: name the service's own key space with `.scope(\"payments\")`, so that two services on one store never answer each other's requests");
        }
        if let Some(identity) = self.config.identity.setup_error() {
            missing.push(identity);
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(LayerSetupError { missing })
        }
    }

    /// A handle that waits for the guarded handlers still running, for a graceful shutdown.
    pub fn drain_handle(&self) -> Drain {
        Drain {
            tracker: self.config.tracker.clone(),
            draining: self.config.draining.clone(),
        }
    }
}

impl<S> tower::Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    /// # Panics
    ///
    /// When the layer is not set up ([`IdempotencyLayer::check`]): a service that would
    /// share its keys with other services or store a guessable digest of its clients'
    /// credentials stops at startup instead.
    fn layer(&self, inner: S) -> Self::Service {
        if let Err(err) = self.check() {
            panic!("{err}");
        }
        IdempotencyService::new(inner, Arc::new(self.config.clone()))
    }
}

/// What an [`IdempotencyLayer`] still needs before it builds ([`IdempotencyLayer::check`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerSetupError {
    missing: Vec<&'static str>,
}

impl std::fmt::Display for LayerSetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the IdempotencyLayer is not set up: ")?;
        f.write_str(&self.missing.join("; and "))
    }
}

impl std::error::Error for LayerSetupError {}

/// Waits for the guarded handlers of one [`IdempotencyLayer`] (and every service it made).
///
/// Guarded handlers run in tasks of their own, so that a client that disconnects cannot
/// cancel one half way; a server that stops must then wait for them:
///
/// ```no_run
/// # async fn f(layer: idem_http::IdempotencyLayer, serve: impl std::future::Future<Output = ()>) {
/// let drain = layer.drain_handle();
/// serve.await;           // e.g. axum::serve(...).with_graceful_shutdown(...)
/// drain.drain().await;   // every guarded handler has finished and stored its response
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Drain {
    tracker: TaskTracker,
    draining: Arc<AtomicBool>,
}

impl Drain {
    /// Refuses new guarded requests (503 with `Retry-After`, the handler does not run) and
    /// waits until every guarded handler still running has finished.
    pub async fn drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.tracker.close();
        self.tracker.wait().await;
    }

    /// How many guarded handlers are running now.
    pub fn in_flight(&self) -> usize {
        self.tracker.len()
    }
}
