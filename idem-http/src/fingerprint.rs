//! The fingerprint of a guarded request: what makes two requests with one key the same
//! request (a replay) or different ones (422).
//!
//! It is the method, the path and query as the client sent them (before axum's `nest`
//! stripped a prefix), and the body: for a JSON content type the parsed value (object
//! members in any order, insignificant whitespace ignored, numbers by value), otherwise
//! the bytes. A stored format: a change makes stored requests' retries answer 422.

use http::header::CONTENT_TYPE;
use http::request::Parts;
use idem_core::Fingerprint;
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};

/// How the body counts in the fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BodyFingerprint {
    /// A body with a JSON content type (`application/json`, `application/*+json`) counts
    /// by its parsed value, so a client that re-encodes it on a retry (another member
    /// order, other whitespace, `1.0` for `1`) sends the same request; any other body, or
    /// JSON that does not parse, by its bytes. The default.
    #[default]
    JsonValue,
    /// Every body counts by its bytes: one byte changed is another request.
    Bytes,
}

/// The URI the client sent: axum's `OriginalUri` when a `nest` rewrote the path.
pub(crate) fn original_uri(parts: &Parts) -> &http::Uri {
    parts
        .extensions
        .get::<axum::extract::OriginalUri>()
        .map_or(&parts.uri, |original| &original.0)
}

/// The request's fingerprint: `json` is the parsed body when it counts as JSON.
pub(crate) fn of_request(
    parts: &Parts,
    body: &[u8],
    json: Option<&serde_json::Value>,
) -> Fingerprint {
    let uri = original_uri(parts);
    match json {
        Some(value) => Fingerprint::of(&(
            parts.method.as_str(),
            uri.path(),
            uri.query(),
            "json",
            Canonical(value),
        )),
        // Byte bodies keep the encoding of earlier releases, so their stored records
        // still match.
        None => Fingerprint::of(&(
            parts.method.as_str(),
            uri.path(),
            uri.query(),
            blake3::hash(body).as_bytes(),
        )),
    }
}

/// `application/json`, or any `+json` suffix type, parameters aside.
pub(crate) fn is_json(parts: &Parts) -> bool {
    let Some(value) = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    let Some((kind, sub)) = essence.split_once('/') else {
        return false;
    };
    kind.eq_ignore_ascii_case("application")
        && (sub.eq_ignore_ascii_case("json")
            || sub.len() > 5 && sub[sub.len() - 5..].eq_ignore_ascii_case("+json"))
}

/// A JSON value in idem's digest encoding (map entries sorted, integers by value), with
/// every number that is a whole number within the 64-bit range written as that integer, so
/// `1`, `1.0` and `1e0` are one number. Other numbers count as the `f64` they parse to.
struct Canonical<'a>(&'a serde_json::Value);

impl Serialize for Canonical<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde_json::Value;
        match self.0 {
            Value::Null => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::String(text) => s.serialize_str(text),
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    s.serialize_u64(u)
                } else if let Some(i) = n.as_i64() {
                    s.serialize_i64(i)
                } else {
                    let f = n.as_f64().unwrap_or(f64::NAN);
                    // Whole floats in range are exact integers: the same number as the
                    // integer literal.
                    if f.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&f) {
                        s.serialize_u64(f as u64)
                    } else if f.fract() == 0.0 && (-9_223_372_036_854_775_808.0..0.0).contains(&f) {
                        s.serialize_i64(f as i64)
                    } else {
                        s.serialize_f64(f)
                    }
                }
            }
            Value::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(&Canonical(item))?;
                }
                seq.end()
            }
            Value::Object(members) => {
                let mut map = s.serialize_map(Some(members.len()))?;
                for (name, item) in members {
                    map.serialize_entry(name, &Canonical(item))?;
                }
                map.end()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(content_type: Option<&str>, body: &str, mode: BodyFingerprint) -> Fingerprint {
        let mut req = http::Request::post("/charge?x=1");
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let (parts, ()) = req.body(()).unwrap().into_parts();
        let json = (mode == BodyFingerprint::JsonValue && is_json(&parts))
            .then(|| serde_json::from_slice(body.as_bytes()).ok())
            .flatten();
        of_request(&parts, body.as_bytes(), json.as_ref())
    }

    const JSON: Option<&str> = Some("application/json; charset=utf-8");

    #[test]
    fn a_reencoded_json_body_is_the_same_request() {
        let m = BodyFingerprint::JsonValue;
        let a = fp(JSON, r#"{"a":1,"b":[2,{"c":3,"d":4}]}"#, m);
        assert_eq!(a, fp(JSON, r#"{ "b": [2, {"d":4,"c":3}], "a": 1 }"#, m));
        assert_eq!(a, fp(JSON, r#"{"b":[2.0,{"d":4e0,"c":3}],"a":1.0}"#, m));
        assert_ne!(a, fp(JSON, r#"{"a":1,"b":[{"c":3,"d":4},2]}"#, m));
        assert_ne!(a, fp(JSON, r#"{"a":"1","b":[2,{"c":3,"d":4}]}"#, m));
        assert_ne!(a, fp(JSON, r#"{"a":1.5,"b":[2,{"c":3,"d":4}]}"#, m));
        assert_eq!(
            fp(Some("application/problem+json"), r#"{"a":-1,"b":0.25}"#, m),
            fp(
                Some("Application/Problem+JSON"),
                r#"{"b":0.25,"a":-1.0}"#,
                m
            )
        );
    }

    #[test]
    fn other_bodies_and_the_byte_mode_count_bytes() {
        let m = BodyFingerprint::JsonValue;
        let (x, y) = (r#"{"a":1,"b":2}"#, r#"{"b":2,"a":1}"#);
        assert_ne!(fp(Some("text/plain"), x, m), fp(Some("text/plain"), y, m));
        assert_ne!(fp(None, x, m), fp(None, y, m));
        assert_ne!(
            fp(JSON, x, BodyFingerprint::Bytes),
            fp(JSON, y, BodyFingerprint::Bytes)
        );
        // JSON that does not parse is bytes; the same bytes stay the same request.
        assert_eq!(fp(JSON, "{oops", m), fp(JSON, "{oops", m));
        assert_ne!(fp(JSON, "{oops", m), fp(JSON, "{oops ", m));
        // The JSON reading never equals the bytes reading of the same body.
        assert_ne!(fp(JSON, x, m), fp(None, x, m));
    }

    #[test]
    fn the_path_seen_is_the_one_the_client_sent() {
        let (mut parts, ()) = http::Request::post("/charge")
            .body(())
            .unwrap()
            .into_parts();
        let stripped = of_request(&parts, b"", None);
        parts.extensions.insert(axum::extract::OriginalUri(
            "/accounts/2/charge".parse().unwrap(),
        ));
        let original = of_request(&parts, b"", None);
        assert_ne!(stripped, original);
    }

    #[test]
    fn byte_bodies_keep_the_fingerprint_of_earlier_releases() {
        // The encoding before JSON bodies were read as values: a record stored by an
        // earlier release still matches its retry.
        let (parts, ()) = http::Request::post("/charge?x=1")
            .body(())
            .unwrap()
            .into_parts();
        let body = b"amount=1000";
        assert_eq!(
            of_request(&parts, body, None),
            Fingerprint::of(&(
                "POST",
                "/charge",
                Some("x=1"),
                blake3::hash(body).as_bytes()
            ))
        );
    }
}
