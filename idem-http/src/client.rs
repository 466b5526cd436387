//! The client half, on `reqwest`: one idempotency key per logical request, sent on every
//! attempt, and retries of what a retry can fix.

use std::time::{Duration, Instant, SystemTime};

use http::header::{HeaderValue, RETRY_AFTER};
use http::StatusCode;
use reqwest::{Client, IntoUrl, Method, Request, RequestBuilder, Response};
use serde::Serialize;

use crate::config::{IDEMPOTENCY_KEY, IDEMPOTENCY_KEY_EXPIRES, IDEMPOTENT_RETRYABLE};
use crate::key::IdempotencyKey;

/// How [`IdempotentClient`] retries: bounded attempts within a total deadline, capped
/// exponential backoff with jitter, and the server's `Retry-After` honoured (up to a cap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first one included (default 5). At least 1.
    pub max_attempts: u32,
    /// The backoff before the second attempt (default 100 ms); it doubles per attempt.
    pub initial_backoff: Duration,
    /// The longest backoff (default 5 s).
    pub max_backoff: Duration,
    /// The longest wait a server's `Retry-After` can ask for (default 30 s).
    pub max_retry_after: Duration,
    /// The longest a logical request takes, every attempt and pause included (default
    /// 60 s): an attempt is cut at it, and no retry starts past it.
    pub deadline: Duration,
    /// The longest one attempt takes, reading its response body included, as reqwest's
    /// request timeout does (default 30 s; `None`: only the deadline, and a timeout set on
    /// the request, bound it). A long download or an event stream needs `None` here and a
    /// `deadline` long enough.
    pub attempt_timeout: Option<Duration>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            max_retry_after: Duration::from_secs(30),
            deadline: Duration::from_secs(60),
            attempt_timeout: Some(Duration::from_secs(30)),
        }
    }
}

impl RetryPolicy {
    /// The pause before attempt `attempt + 1`: `initial * 2^(attempt-1)`, capped, then a
    /// uniform draw in its upper half, so that clients that failed together do not retry
    /// together.
    fn backoff(&self, attempt: u32) -> Duration {
        let exp = self
            .initial_backoff
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
        let capped = exp.min(self.max_backoff);
        let half = capped / 2;
        // uuid's v4 generator is the randomness this crate already has.
        let r = (uuid::Uuid::new_v4().as_u128() % 1_000_000) as u32;
        half + half.mul_f64(f64::from(r) / 1_000_000.0)
    }
}

/// Why an [`IdempotentClient`] request failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ClientError {
    /// The key given to [`IdempotentRequest::key`] (or in the request's
    /// `Idempotency-Key` header) is not one a server accepts.
    InvalidKey {
        /// The key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The request failed: the last attempt's error (a connection refused, a timeout, a
    /// request that could not be built).
    Request(reqwest::Error),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::InvalidKey { key, reason } => {
                write!(f, "the idempotency key {key:?} {reason}")
            }
            ClientError::Request(err) => write!(f, "the idempotent request failed: {err}"),
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClientError::InvalidKey { .. } => None,
            ClientError::Request(err) => Some(err),
        }
    }
}

impl From<reqwest::Error> for ClientError {
    fn from(err: reqwest::Error) -> Self {
        ClientError::Request(err)
    }
}

impl ClientError {
    /// The underlying `reqwest` error, if that is what failed.
    pub fn as_reqwest(&self) -> Option<&reqwest::Error> {
        match self {
            ClientError::Request(err) => Some(err),
            ClientError::InvalidKey { .. } => None,
        }
    }
}

/// A `reqwest::Client` that sends each logical request with one `Idempotency-Key` (a UUID
/// v4, unless the request has one) and retries, with that same key, what a retry can fix
/// without a second run: a connection that failed or timed out before a response, 429, a
/// 409 with `Retry-After` (the first attempt still runs), and any response the server
/// marked `Idempotent-Retryable: true`. Not a plain 5xx: the server stored it as the
/// operation's outcome, and a retry would only replay it.
///
/// It stops at the [`RetryPolicy`]'s attempts or deadline, and before a retry that would
/// come after the key's `Idempotency-Key-Expires` (the server would then run it anew).
///
/// ```no_run
/// # async fn f() -> Result<(), idem_http::ClientError> {
/// use idem_http::IdempotentClient;
///
/// let client = IdempotentClient::new(reqwest::Client::new());
/// let res = client
///     .post("http://127.0.0.1:3000/payments/charge")
///     .json(&serde_json::json!({"order_id": "o-1", "amount": 1000, "currency": "EUR"}))
///     .send()
///     .await?;
/// # let _ = res; Ok(()) }
/// ```
///
/// A request whose body is a stream cannot be resent: it is sent once.
#[derive(Debug, Clone, Default)]
pub struct IdempotentClient {
    client: Client,
    retry: RetryPolicy,
}

impl IdempotentClient {
    /// A client on `client` with the default [`RetryPolicy`].
    pub fn new(client: Client) -> Self {
        IdempotentClient {
            client,
            retry: RetryPolicy::default(),
        }
    }

    /// The retry policy.
    #[must_use]
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// The underlying client.
    pub fn inner(&self) -> &Client {
        &self.client
    }

    /// A POST with a fresh key.
    pub fn post<U: IntoUrl>(&self, url: U) -> IdempotentRequest<'_> {
        self.request(Method::POST, url)
    }

    /// A PATCH with a fresh key.
    pub fn patch<U: IntoUrl>(&self, url: U) -> IdempotentRequest<'_> {
        self.request(Method::PATCH, url)
    }

    /// A request with a fresh key.
    pub fn request<U: IntoUrl>(&self, method: Method, url: U) -> IdempotentRequest<'_> {
        IdempotentRequest {
            client: self,
            builder: self.client.request(method, url),
            key: uuid::Uuid::new_v4().to_string(),
        }
    }

    /// Sends a request built elsewhere (with any `reqwest::Client`) as one logical request:
    /// the `Idempotency-Key` it carries, or a fresh one, on every attempt.
    pub async fn send_idempotent(&self, builder: RequestBuilder) -> Result<Response, ClientError> {
        let key = uuid::Uuid::new_v4().to_string();
        self.send_with_key(builder, &key).await
    }

    async fn send_with_key(
        &self,
        builder: RequestBuilder,
        key: &str,
    ) -> Result<Response, ClientError> {
        let (client, request) = builder.build_split();
        let mut request = request?;
        let sent = match request.headers().get(IDEMPOTENCY_KEY) {
            Some(value) => value.to_str().unwrap_or("\u{fffd}").to_owned(),
            None => key.to_owned(),
        };
        let valid = IdempotencyKey::parse(&sent)
            .map_err(|reason| ClientError::InvalidKey { key: sent, reason })?;
        let value = HeaderValue::from_str(valid.as_str()).map_err(|_| ClientError::InvalidKey {
            key: valid.as_str().to_owned(),
            reason: "is not a valid header value".to_owned(),
        })?;
        request.headers_mut().insert(IDEMPOTENCY_KEY, value);
        self.execute(&client, request).await
    }

    async fn execute(&self, client: &Client, request: Request) -> Result<Response, ClientError> {
        let max = self.retry.max_attempts.max(1);
        // A deadline past what the clock can show is no deadline.
        let deadline = Instant::now().checked_add(self.retry.deadline);
        let mut key_expires: Option<SystemTime> = None;
        let mut attempt = 1;
        let mut current = request;
        loop {
            // Keep a copy for the next attempt; a streaming body has none and is sent once.
            let next = if attempt < max {
                current.try_clone()
            } else {
                None
            };
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            *current.timeout_mut() = [current.timeout().copied(), self.retry.attempt_timeout, left]
                .into_iter()
                .flatten()
                .min();
            let result = client.execute(current).await;
            if let Ok(res) = &result {
                key_expires = expires(res).or(key_expires);
            }
            let pause = match &result {
                Ok(res) if retryable_response(res) => Some(match retry_after(res) {
                    Some(after) => after.min(self.retry.max_retry_after),
                    None => self.retry.backoff(attempt),
                }),
                Err(err) if retryable_error(err) => Some(self.retry.backoff(attempt)),
                _ => None,
            };
            let (Some(pause), Some(next)) = (pause, next) else {
                return Ok(result?);
            };
            if deadline.is_some_and(|d| Instant::now().checked_add(pause).is_none_or(|at| at >= d))
            {
                tracing::debug!(target: "idem_http", attempt, "an idempotent request's deadline leaves no time to retry");
                return Ok(result?);
            }
            if key_expires
                .is_some_and(|at| SystemTime::now().checked_add(pause).is_none_or(|t| t >= at))
            {
                tracing::debug!(target: "idem_http", attempt, "an idempotent request's key expires before a retry; not retried");
                return Ok(result?);
            }
            tracing::debug!(target: "idem_http", attempt, ?pause, "retrying an idempotent request with the same key");
            tokio::time::sleep(pause).await;
            current = next;
            attempt += 1;
        }
    }
}

/// Responses after which the same request may succeed with no second run: 429, a 409
/// with `Retry-After` (the draft's answer for a request still in progress), and what the
/// server marked `Idempotent-Retryable: true`.
fn retryable_response(res: &Response) -> bool {
    let status = res.status();
    let marked = res
        .headers()
        .get(IDEMPOTENT_RETRYABLE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
    marked
        || status == StatusCode::TOO_MANY_REQUESTS
        || (status == StatusCode::CONFLICT && res.headers().contains_key(RETRY_AFTER))
}

/// Timeouts, refused connections, and connections lost before the response: with the same
/// key a resend cannot run the request twice.
fn retryable_error(err: &reqwest::Error) -> bool {
    err.is_timeout() || err.is_connect() || err.is_request()
}

/// `Retry-After` in seconds. (An HTTP-date is not read: the backoff applies instead.)
fn retry_after(res: &Response) -> Option<Duration> {
    let secs: u64 = res
        .headers()
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs))
}

/// When the server said the key expires.
fn expires(res: &Response) -> Option<SystemTime> {
    httpdate::parse_http_date(res.headers().get(IDEMPOTENCY_KEY_EXPIRES)?.to_str().ok()?).ok()
}

/// One logical request of an [`IdempotentClient`]: a `reqwest::RequestBuilder` and its key.
#[derive(Debug)]
#[must_use = "a request does nothing until `.send()` is awaited"]
pub struct IdempotentRequest<'a> {
    client: &'a IdempotentClient,
    builder: RequestBuilder,
    key: String,
}

impl IdempotentRequest<'_> {
    /// The key every attempt of this request sends.
    pub fn idempotency_key(&self) -> &str {
        &self.key
    }

    /// Sends `key` instead of a fresh one (e.g. a key kept across a restart of the client).
    /// A key a server would refuse (empty, over 255 characters, not printable ASCII) is
    /// [`ClientError::InvalidKey`] from [`send`](Self::send), and nothing is sent.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = key.into();
        self
    }

    /// A JSON body.
    pub fn json<T: Serialize + ?Sized>(mut self, body: &T) -> Self {
        self.builder = self.builder.json(body);
        self
    }

    /// A body.
    pub fn body(mut self, body: impl Into<reqwest::Body>) -> Self {
        self.builder = self.builder.body(body);
        self
    }

    /// A header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.builder = self.builder.header(name, value);
        self
    }

    /// A bearer token.
    pub fn bearer_auth(mut self, token: &str) -> Self {
        self.builder = self.builder.bearer_auth(token);
        self
    }

    /// The timeout of each attempt (the policy's `attempt_timeout` and `deadline` still
    /// apply when shorter).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.builder = self.builder.timeout(timeout);
        self
    }

    /// Any other option of the underlying `reqwest::RequestBuilder`.
    pub fn with(mut self, f: impl FnOnce(RequestBuilder) -> RequestBuilder) -> Self {
        self.builder = f(self.builder);
        self
    }

    /// Sends it, retrying as the client's [`RetryPolicy`] says, with the same key. Returns
    /// the last response (a 409 or 429 when attempts or time ran out) or the last error.
    pub async fn send(self) -> Result<Response, ClientError> {
        self.client.send_with_key(self.builder, &self.key).await
    }
}
