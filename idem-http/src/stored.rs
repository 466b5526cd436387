//! The stored form of a response: what a replay sends back.

use base64::Engine as _;
use bytes::Bytes;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{response, HeaderMap, Response, StatusCode};
use serde::{Deserialize, Serialize};

use crate::config::IDEMPOTENCY_KEY_EXPIRES;
use crate::problem::{Problem, PROBLEM_JSON};

/// A response as the layer stores it through the engine (JSON by default): its status, the
/// chosen headers, and the body (base64 in the record, so that any bytes survive a text codec).
///
/// Stored records outlive deploys: fields are only ever added, with `#[serde(default)]`.
/// The format is internal to this crate (not API) and guarded by the golden tests below.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredResponse {
    /// The status code.
    pub(crate) status: u16,
    /// The stored headers, in their order; names lowercase. A value that is not visible
    /// ASCII is not stored.
    pub(crate) headers: Vec<(String, String)>,
    /// The body.
    #[serde(with = "base64_bytes")]
    pub(crate) body: Vec<u8>,
    /// When the record expires, in seconds since the Unix epoch by the server's clock
    /// (sent as `Idempotency-Key-Expires`); absent in records of earlier releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) expires_at: Option<u64>,
}

impl StoredResponse {
    /// The stored form of a response: `keep` names the headers kept.
    pub(crate) fn new(
        parts: &response::Parts,
        body: &Bytes,
        keep: &[HeaderName],
        expires_at: Option<u64>,
    ) -> Self {
        let headers = parts
            .headers
            .iter()
            .filter(|(name, _)| keep.contains(name))
            .filter_map(|(name, value)| {
                Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
            })
            .collect();
        StoredResponse {
            status: parts.status.as_u16(),
            headers,
            body: body.to_vec(),
            expires_at,
        }
    }

    /// A problem stored as the outcome of a request (a handler that panicked, a response
    /// too large to store), so that every retry gets it instead of a second run.
    pub(crate) fn problem(problem: &Problem, expires_at: Option<u64>) -> Self {
        StoredResponse {
            status: problem.status.as_u16(),
            headers: vec![(CONTENT_TYPE.as_str().to_owned(), PROBLEM_JSON.to_owned())],
            body: problem.body().to_vec(),
            expires_at,
        }
    }

    /// The response a replay sends. A status or header that no longer parses (a record
    /// edited by hand) is answered as a 500 rather than trusted.
    pub(crate) fn to_response<B: From<Bytes>>(&self) -> Option<Response<B>> {
        let status = StatusCode::from_u16(self.status).ok()?;
        let mut headers = HeaderMap::with_capacity(self.headers.len());
        for (name, value) in &self.headers {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).ok()?,
                HeaderValue::from_str(value).ok()?,
            );
        }
        if let Some(expires) = self.expires_at.and_then(expiry_header) {
            headers.insert(IDEMPOTENCY_KEY_EXPIRES, expires);
        }
        let mut res = Response::new(B::from(Bytes::from(self.body.clone())));
        *res.status_mut() = status;
        *res.headers_mut() = headers;
        Some(res)
    }
}

/// When a record stored now for `ttl` expires, in Unix seconds (`None` past the clock's
/// range).
pub(crate) fn expires_at(ttl: Duration) -> Option<u64> {
    SystemTime::now()
        .checked_add(ttl)?
        .duration_since(UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}

/// The last second an HTTP date can show (9999-12-31T23:59:59Z).
const LAST_HTTP_DATE: u64 = 253_402_300_799;

/// `Idempotency-Key-Expires`'s value: an HTTP date (none past the year 9999, which an
/// HTTP date cannot show: a ttl of 100 years from 9900, or a record edited by hand).
pub(crate) fn expiry_header(unix_secs: u64) -> Option<HeaderValue> {
    if unix_secs > LAST_HTTP_DATE {
        return None;
    }
    let at = UNIX_EPOCH.checked_add(Duration::from_secs(unix_secs))?;
    HeaderValue::from_str(&httpdate::fmt_http_date(at)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_of_an_earlier_release_reads_and_a_far_expiry_is_no_header() {
        // Written before `expires_at` existed: still a replay, with no expiry header.
        let old: StoredResponse = serde_json::from_str(
            r#"{"status":201,"headers":[["content-type","application/json"]],"body":"e30="}"#,
        )
        .unwrap();
        assert_eq!(old.expires_at, None);
        let res: Response<Bytes> = old.to_response().unwrap();
        assert_eq!(res.status(), 201);
        assert!(res.headers().get(IDEMPOTENCY_KEY_EXPIRES).is_none());
        assert_eq!(res.body(), &Bytes::from_static(b"{}"));

        let far = StoredResponse {
            expires_at: Some(u64::MAX),
            ..old
        };
        let res: Response<Bytes> = far.to_response().unwrap();
        assert!(res.headers().get(IDEMPOTENCY_KEY_EXPIRES).is_none());
        assert!(expiry_header(LAST_HTTP_DATE).is_some());
    }

    /// The bytes a stored response is written as: records outlive the build that wrote
    /// them, so a change here is a format change and needs a reader of the old one.
    #[test]
    fn the_stored_form_is_golden() {
        let stored = StoredResponse {
            status: 201,
            headers: vec![("content-type".into(), "application/json".into())],
            body: b"{\"id\":7}".to_vec(),
            expires_at: Some(1_800_000_000),
        };
        let golden = r#"{"status":201,"headers":[["content-type","application/json"]],"body":"eyJpZCI6N30=","expires_at":1800000000}"#;
        assert_eq!(serde_json::to_string(&stored).unwrap(), golden);
        assert_eq!(
            serde_json::from_str::<StoredResponse>(golden).unwrap(),
            stored
        );
    }
}

mod base64_bytes {
    use super::*;

    pub(super) fn serialize<S: serde::Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}
