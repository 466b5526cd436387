//! The layer's options: one `Clone` value shared by the layer and every service it makes.

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use http::header::{self, HeaderName};
use http::request::Parts;
use http::Method;
use idem_core::{Idem, InProgress};
use tokio_util::task::TaskTracker;

/// The header a client sends its key in, by default (the IETF draft's name).
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// The header that marks a replayed response.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// The longest key accepted, in characters (bytes: a valid header value is ASCII).
pub const MAX_KEY_LEN: usize = 255;
/// The default limit of the request body read for the fingerprint: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;
/// The default scope of the keys the layer stores (the first part of each [`idem_core::Key`]).
pub const DEFAULT_SCOPE: &str = "idem_http";

/// Maps a request to its principal (the authenticated user, a tenant): keys are scoped by it.
pub(crate) type PrincipalFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// Every option of an [`IdempotencyLayer`](crate::IdempotencyLayer), plus what its services
/// share (the tracker of running handlers). Cloning is cheap: services hold an `Arc` of it.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) idem: Idem,
    pub(crate) scope: String,
    pub(crate) methods: Vec<Method>,
    pub(crate) key_required: bool,
    pub(crate) header: HeaderName,
    pub(crate) max_body: usize,
    pub(crate) stored_headers: Vec<HeaderName>,
    pub(crate) store_client_errors: bool,
    pub(crate) store_server_errors: bool,
    pub(crate) principal: Option<PrincipalFn>,
    pub(crate) in_progress: InProgress,
    pub(crate) wait_timeout: Option<Duration>,
    pub(crate) ttl: Option<Duration>,
    pub(crate) lease: Option<Duration>,
    /// The guarded handlers still running, so that shutdown can wait for them.
    pub(crate) tracker: TaskTracker,
    /// Set by [`Drain::drain`](crate::Drain::drain): new guarded requests get 503.
    pub(crate) draining: Arc<AtomicBool>,
}

impl Config {
    pub(crate) fn new(idem: Idem) -> Config {
        Config {
            idem,
            scope: DEFAULT_SCOPE.to_owned(),
            methods: vec![Method::POST, Method::PATCH],
            key_required: true,
            header: IDEMPOTENCY_KEY,
            max_body: DEFAULT_MAX_BODY,
            stored_headers: default_stored_headers(),
            store_client_errors: true,
            store_server_errors: false,
            principal: None,
            in_progress: InProgress::Reject,
            wait_timeout: None,
            ttl: None,
            lease: None,
            tracker: TaskTracker::new(),
            draining: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether a response with this status is stored and replayed. 1xx-3xx always are;
    /// a 4xx or 5xx only when configured, since a retry of such a request may succeed.
    pub(crate) fn stores_status(&self, status: http::StatusCode) -> bool {
        if status.is_server_error() {
            self.store_server_errors
        } else if status.is_client_error() {
            self.store_client_errors
        } else {
            true
        }
    }
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
            .field("max_body", &self.max_body)
            .field("stored_headers", &self.stored_headers)
            .field("store_client_errors", &self.store_client_errors)
            .field("store_server_errors", &self.store_server_errors)
            .field("principal", &self.principal.is_some())
            .field("in_progress", &self.in_progress)
            .field("wait_timeout", &self.wait_timeout)
            .field("ttl", &self.ttl)
            .field("lease", &self.lease)
            .finish()
    }
}
