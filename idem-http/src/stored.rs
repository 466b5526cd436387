//! The stored form of a response: what a replay sends back.

use base64::Engine as _;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{response, HeaderMap, Response, StatusCode};
use serde::{Deserialize, Serialize};

/// A response as the layer stores it through the engine (JSON by default): its status, the
/// chosen headers, and the body (base64 in the record, so that any bytes survive a text codec).
///
/// Stored records outlive deploys: fields are only ever added, with `#[serde(default)]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    /// The status code.
    pub status: u16,
    /// The stored headers, in their order; names lowercase. A value that is not visible
    /// ASCII is not stored.
    pub headers: Vec<(String, String)>,
    /// The body.
    #[serde(with = "base64_bytes")]
    pub body: Vec<u8>,
}

impl StoredResponse {
    /// The stored form of a response: `keep` names the headers kept.
    pub(crate) fn new(parts: &response::Parts, body: &Bytes, keep: &[HeaderName]) -> Self {
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
        let mut res = Response::new(B::from(Bytes::from(self.body.clone())));
        *res.status_mut() = status;
        *res.headers_mut() = headers;
        Some(res)
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
