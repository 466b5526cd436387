//! The fingerprint of a guarded request: what makes two requests with one key the same
//! request (a replay) or different ones (422).
//!
//! It is the method, the path and query as the client sent them (before axum's `nest`
//! stripped a prefix), and the body: for a JSON content type its reading ([`Json`]: object
//! members in any order, insignificant whitespace ignored, numbers by their text), otherwise
//! (and for JSON with a member twice, or that does not parse) the bytes. A stored format: a
//! change makes stored requests' retries answer 422.

use http::header::CONTENT_TYPE;
use http::request::Parts;
use idem_core::Fingerprint;

use crate::json::Json;

/// How the body counts in the fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BodyFingerprint {
    /// A body with a JSON content type (`application/json`, `application/*+json`) counts
    /// by its value, so a client that re-encodes it on a retry (another member order, other
    /// whitespace, another escape of one character) sends the same request; numbers count
    /// by their text (`100`, `1e2`, `100.0` and `-0` are four numbers: a handler with a
    /// `u64` field accepts one of them). Any other body, JSON that does not parse, and JSON
    /// with a member twice (which serde-derive refuses and a `Value` reads as its last)
    /// count by their bytes. The default.
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

/// The request's fingerprint: `json` is the body's reading when it counts as JSON.
pub(crate) fn of_request(parts: &Parts, body: &[u8], json: Option<&Json>) -> Fingerprint {
    let uri = original_uri(parts);
    match json {
        Some(value) => Fingerprint::of(&(
            parts.method.as_str(),
            uri.path(),
            uri.query(),
            "json",
            value,
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
            .then(|| Json::parse(body.as_bytes()).ok())
            .flatten();
        of_request(&parts, body.as_bytes(), json.as_ref())
    }

    const JSON: Option<&str> = Some("application/json; charset=utf-8");

    #[test]
    fn a_reencoded_json_body_is_the_same_request() {
        let m = BodyFingerprint::JsonValue;
        let a = fp(JSON, r#"{"a":1,"b":[2,{"c":3,"d":4}]}"#, m);
        assert_eq!(a, fp(JSON, r#"{ "b": [2, {"d":4,"c":3}], "a": 1 }"#, m));
        assert_eq!(a, fp(JSON, r#"{"\u0062":[2,{"d":4,"c":3}],"a":1}"#, m));
        assert_ne!(a, fp(JSON, r#"{"a":1,"b":[{"c":3,"d":4},2]}"#, m));
        assert_ne!(a, fp(JSON, r#"{"a":"1","b":[2,{"c":3,"d":4}]}"#, m));
        assert_ne!(a, fp(JSON, r#"{"a":1.5,"b":[2,{"c":3,"d":4}]}"#, m));
        assert_eq!(
            fp(Some("application/problem+json"), r#"{"a":-1,"b":0.25}"#, m),
            fp(Some("Application/Problem+JSON"), r#"{"b":0.25,"a":-1}"#, m)
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

    /// Bodies a serde-derive handler reads differently never share a fingerprint.
    #[test]
    fn bodies_a_handler_tells_apart_are_different_requests() {
        let m = BodyFingerprint::JsonValue;
        for (a, b) in [
            (r#"{"amount":100}"#, r#"{"amount":1e2}"#),
            (r#"{"amount":100}"#, r#"{"amount":100.0}"#),
            (r#"{"amount":1}"#, r#"{"amount":1.0}"#),
            (r#"{"amount":0}"#, r#"{"amount":-0}"#),
            (r#"{"amount":0.0}"#, r#"{"amount":-0.0}"#),
            (r#"{"amount":10}"#, r#"{"amount":10.0000000000000001}"#),
            (r#"{"amount":0.25}"#, r#"{"amount":0.250}"#),
            (r#"{"amount":1e2}"#, r#"{"amount":1E2}"#),
            (r#"{"amount":"100"}"#, r#"{"amount":100}"#),
            (
                r#"{"n":18446744073709551616}"#,
                r#"{"n":18446744073709552000}"#,
            ),
            (r#"{"amount":1,"amount":2}"#, r#"{"amount":2}"#),
            (r#"{"amount":2,"amount":1}"#, r#"{"amount":1,"amount":2}"#),
        ] {
            assert_ne!(fp(JSON, a, m), fp(JSON, b, m), "{a} and {b}");
        }
        // Re-encoding still does not count.
        assert_eq!(
            fp(JSON, r#"{"a":1e2,"b":-0}"#, m),
            fp(JSON, "{ \"b\" : -0 ,\n \"a\" : 1e2 }", m)
        );
    }

    /// Fingerprints of JSON bodies stored before numbers counted by their text: a body that
    /// was never ambiguous keeps the fingerprint it was stored with, so its retry across
    /// the upgrade still replays. Computed by the release that stored them.
    #[test]
    fn unambiguous_json_bodies_keep_their_stored_fingerprints() {
        let (parts, ()) = http::Request::post("/charge?x=1")
            .header("content-type", "application/json")
            .body(())
            .unwrap()
            .into_parts();
        for (body, golden) in [
            (
                r#"{"order_id":"o-1","amount":1000,"currency":"EUR"}"#,
                "86ddc86fd6b72dc7a40fda0bf17b453d",
            ),
            (
                r#"{"a":-1,"b":0.25,"c":[true,false,null],"d":{"e":"\u00e9"},"f":-9223372036854775808,"g":18446744073709551615,"h":1.5e300}"#,
                "fa51082aacf2b0a703c22e24dd2b0b52",
            ),
            ("[]", "c74495b336db92c3ad7400389c44ec90"),
            (r#""text""#, "81d3c41f15eab1e21b0b39a3ea940691"),
        ] {
            let json = Json::parse(body.as_bytes()).unwrap();
            let hex: String = of_request(&parts, body.as_bytes(), Some(&json))
                .as_bytes()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            assert_eq!(hex, golden, "{body}");
        }
    }
}
