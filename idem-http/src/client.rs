//! The client half, on `reqwest`: one idempotency key per logical request, sent on every
//! attempt, and retries of what a retry can fix.

use std::time::Duration;

use http::header::{HeaderValue, RETRY_AFTER};
use http::StatusCode;
use reqwest::{Client, IntoUrl, Method, Request, RequestBuilder, Response};
use serde::Serialize;

use crate::config::IDEMPOTENCY_KEY;

/// How [`IdempotentClient`] retries: bounded attempts, capped exponential backoff with
/// jitter, and the server's `Retry-After` honoured (up to a cap).
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
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            max_retry_after: Duration::from_secs(30),
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

/// A `reqwest::Client` that sends each logical request with one `Idempotency-Key` (a UUID
/// v4, unless the request has one) and retries timeouts, connection errors, 409, 429 and
/// 5xx with that same key, so the server runs it once.
///
/// ```no_run
/// # async fn f() -> Result<(), reqwest::Error> {
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
    pub async fn send_idempotent(
        &self,
        builder: RequestBuilder,
    ) -> Result<Response, reqwest::Error> {
        let key = uuid::Uuid::new_v4().to_string();
        self.send_with_key(builder, &key).await
    }

    async fn send_with_key(
        &self,
        builder: RequestBuilder,
        key: &str,
    ) -> Result<Response, reqwest::Error> {
        let (client, request) = builder.build_split();
        let mut request = request?;
        if !request.headers().contains_key(IDEMPOTENCY_KEY) {
            let value = HeaderValue::from_str(key).expect("a UUID is a valid header value");
            request.headers_mut().insert(IDEMPOTENCY_KEY, value);
        }
        self.execute(&client, request).await
    }

    async fn execute(&self, client: &Client, request: Request) -> Result<Response, reqwest::Error> {
        let max = self.retry.max_attempts.max(1);
        let mut attempt = 1;
        let mut request = Some(request);
        loop {
            let current = request.take().expect("one request per attempt");
            // Keep a copy for the next attempt; a streaming body has none and is sent once.
            let next = if attempt < max {
                current.try_clone()
            } else {
                None
            };
            let last = next.is_none();
            let pause = match client.execute(current).await {
                Ok(res) if !last && retryable_status(res.status()) => match retry_after(&res) {
                    Some(after) => after.min(self.retry.max_retry_after),
                    None => self.retry.backoff(attempt),
                },
                Ok(res) => return Ok(res),
                Err(err) if !last && retryable_error(&err) => self.retry.backoff(attempt),
                Err(err) => return Err(err),
            };
            tracing::debug!(target: "idem_http", attempt, ?pause, "retrying an idempotent request with the same key");
            tokio::time::sleep(pause).await;
            request = next;
            attempt += 1;
        }
    }
}

/// Statuses after which the same request may succeed: 409 (the first attempt still
/// runs), 429, and 5xx.
fn retryable_status(status: StatusCode) -> bool {
    status == StatusCode::CONFLICT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
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

    /// The timeout of each attempt.
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
    /// the last response (a 409 or 5xx when attempts ran out) or the last error.
    pub async fn send(self) -> Result<Response, reqwest::Error> {
        self.client.send_with_key(self.builder, &self.key).await
    }
}
