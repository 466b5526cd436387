//! The layer's options: one `Clone` value shared by the layer and every service it makes.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU8};
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderName};
use http::{Method, StatusCode};
use idem_core::{Idem, InProgress};
use tokio_util::task::TaskTracker;

use crate::fingerprint::BodyFingerprint;
use crate::identity::ClientIdentity;

/// The header a client sends its key in, by default (the IETF draft's name).
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// The header that marks a replayed response.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// The longest key accepted, in characters (bytes: a valid header value is ASCII).
pub const MAX_KEY_LEN: usize = 255;
/// The default limit of the request body read for the fingerprint: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;
/// The header that tells the client when its key expires, as an HTTP date: on a response
/// that created or replayed a record. A request with the same key after that is a new
/// request, and runs again.
pub const IDEMPOTENCY_KEY_EXPIRES: HeaderName = HeaderName::from_static("idempotency-key-expires");
/// The header (`true`) on a response after which resending the same request with the same
/// key is safe and may succeed: nothing was stored for the key (a duplicate still running,
/// the store unreachable, a server draining, or a handler that said nothing happened with
/// [`RetrySafe`](crate::RetrySafe)). `IdempotentClient` retries these.
pub const IDEMPOTENT_RETRYABLE: HeaderName = HeaderName::from_static("idempotent-retryable");
/// The default limit of a response body the layer stores: 4 MiB. A larger one passes
/// through to its client, and a retry gets a problem response.
pub const DEFAULT_MAX_RESPONSE_BODY: usize = 4 * 1024 * 1024;
/// The header (`false`) on the response of a request whose handler ran but whose outcome
/// the store did not keep (it failed, or a durability level was not met): a retry may run
/// the handler again once the claim's lease ends, so the client must not resend blindly.
/// Such a response carries no [`IDEMPOTENCY_KEY_EXPIRES`].
pub const IDEMPOTENT_STORED: HeaderName = HeaderName::from_static("idempotent-stored");
/// How long the layer waits for a response body of no known length to end before it
/// streams it to its client instead of storing it: 250 ms.
pub const DEFAULT_UNSIZED_RESPONSE_WAIT: Duration = Duration::from_millis(250);
/// How much of a response body of no known length the layer reads before it streams it to
/// its client instead of storing it: 64 KiB.
pub const DEFAULT_UNSIZED_RESPONSE_BYTES: usize = 64 * 1024;

/// Takes a key from a parsed JSON body.
pub(crate) type BodyKeyFn = Arc<dyn Fn(&serde_json::Value) -> Option<String> + Send + Sync>;

/// Where a request's key is read.
#[derive(Clone)]
pub(crate) enum KeySource {
    /// The header named by `Config::header`.
    Header,
    /// A JSON pointer into the body (a webhook's `/event_id`).
    JsonPointer(String),
    /// A function of the parsed body.
    Body(BodyKeyFn),
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySource::Header => f.write_str("Header"),
            KeySource::JsonPointer(p) => f.debug_tuple("JsonPointer").field(p).finish(),
            KeySource::Body(_) => f.write_str("Body(..)"),
        }
    }
}

/// Every option of an [`IdempotencyLayer`](crate::IdempotencyLayer), plus what its services
/// share (the tracker of running handlers). Cloning is cheap: services hold an `Arc` of it.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) idem: Idem,
    /// `None` until the service names its key space: the layer does not build without.
    pub(crate) scope: Option<String>,
    pub(crate) methods: Vec<Method>,
    pub(crate) key_required: bool,
    pub(crate) header: HeaderName,
    pub(crate) key_source: KeySource,
    pub(crate) max_body: usize,
    pub(crate) max_response_body: usize,
    pub(crate) unsized_response_wait: Duration,
    pub(crate) unsized_response_bytes: usize,
    pub(crate) stored_headers: Vec<HeaderName>,
    pub(crate) store_client_errors: bool,
    pub(crate) store_server_errors: bool,
    pub(crate) unstored_statuses: Vec<StatusCode>,
    pub(crate) identity: ClientIdentity,
    pub(crate) body_fingerprint: BodyFingerprint,
    pub(crate) in_progress: InProgress,
    pub(crate) wait_timeout: Option<Duration>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) lease: Option<Duration>,
    /// The guarded handlers still running, so that shutdown can wait for them.
    pub(crate) tracker: TaskTracker,
    /// Set by [`Drain::drain`](crate::Drain::drain): new guarded requests get 503.
    pub(crate) draining: Arc<AtomicBool>,
    /// Set once the layer warned of a request whose client it could not tell.
    pub(crate) warned_unidentified: Arc<AtomicU8>,
}

impl Config {
    pub(crate) fn new(idem: Idem) -> Config {
        Config {
            idem,
            scope: None,
            methods: vec![Method::POST, Method::PATCH],
            key_required: true,
            header: IDEMPOTENCY_KEY,
            key_source: KeySource::Header,
            max_body: DEFAULT_MAX_BODY,
            max_response_body: DEFAULT_MAX_RESPONSE_BODY,
            unsized_response_wait: DEFAULT_UNSIZED_RESPONSE_WAIT,
            unsized_response_bytes: DEFAULT_UNSIZED_RESPONSE_BYTES,
            stored_headers: default_stored_headers(),
            store_client_errors: true,
            store_server_errors: true,
            unstored_statuses: default_unstored_statuses(),
            identity: ClientIdentity::credentials(),
            body_fingerprint: BodyFingerprint::JsonValue,
            in_progress: InProgress::Reject,
            wait_timeout: None,
            ttl: None,
            lease: None,
            tracker: TaskTracker::new(),
            draining: Arc::new(AtomicBool::new(false)),
            warned_unidentified: Arc::new(AtomicU8::new(0)),
        }
    }

    /// Whether a response with this status is stored and replayed: every status once the
    /// handler has run (its outcome is what a retry gets, a 5xx included), but the answers
    /// that are not the operation's result ([`default_unstored_statuses`]), and 4xx or 5xx
    /// when the service turned them off.
    pub(crate) fn stores_status(&self, status: StatusCode) -> bool {
        if self.unstored_statuses.contains(&status) {
            false
        } else if status.is_server_error() {
            self.store_server_errors
        } else if status.is_client_error() {
            self.store_client_errors
        } else {
            true
        }
    }

    /// Whether a retry of a request answered `status`, not stored, is safe to announce
    /// ([`IDEMPOTENT_RETRYABLE`]): the service said its unstored 5xx change nothing, or the
    /// request timed out or was rate limited before it did anything. 401 and 403 are not
    /// stored but not retryable either: the same credentials get the same answer.
    pub(crate) fn retryable_unstored(&self, status: StatusCode) -> bool {
        status == StatusCode::REQUEST_TIMEOUT
            || status == StatusCode::TOO_MANY_REQUESTS
            || (status.is_server_error() && !self.store_server_errors)
    }
}

/// The statuses that are not the operation's result, so never stored: 401 and 403 (the
/// request never reached the operation), 408 and 429 (it was not run, and a retry later
/// may be), and a 409 of the handler's own (a conflict of the moment, which the client
/// resolves and retries).
pub(crate) fn default_unstored_statuses() -> Vec<StatusCode> {
    vec![
        StatusCode::UNAUTHORIZED,
        StatusCode::FORBIDDEN,
        StatusCode::REQUEST_TIMEOUT,
        StatusCode::CONFLICT,
        StatusCode::TOO_MANY_REQUESTS,
    ]
}

/// Headers that describe the stored body and carry nothing about one client's session
/// (no `set-cookie`, no `date`): replaying them to another connection is safe.
pub(crate) fn default_stored_headers() -> Vec<HeaderName> {
    vec![
        header::CONTENT_TYPE,
        header::CONTENT_LANGUAGE,
        header::CONTENT_LOCATION,
        header::LOCATION,
        header::ETAG,
        header::LAST_MODIFIED,
        header::CACHE_CONTROL,
        header::RETRY_AFTER,
    ]
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("idem", &self.idem)
            .field("scope", &self.scope)
            .field("methods", &self.methods)
            .field("key_required", &self.key_required)
            .field("header", &self.header)
            .field("key_source", &self.key_source)
            .field("max_body", &self.max_body)
            .field("max_response_body", &self.max_response_body)
            .field("unsized_response_wait", &self.unsized_response_wait)
            .field("unsized_response_bytes", &self.unsized_response_bytes)
            .field("stored_headers", &self.stored_headers)
            .field("store_client_errors", &self.store_client_errors)
            .field("store_server_errors", &self.store_server_errors)
            .field("unstored_statuses", &self.unstored_statuses)
            .field("identity", &self.identity)
            .field("body_fingerprint", &self.body_fingerprint)
            .field("in_progress", &self.in_progress)
            .field("wait_timeout", &self.wait_timeout)
            .field("ttl", &self.ttl)
            .field("lease", &self.lease)
            .finish()
    }
}
