//! The client's idempotency key: reading and validating the header.

use http::header::HeaderName;
use http::HeaderMap;

use crate::config::MAX_KEY_LEN;
use crate::identity::Client;
use crate::problem::Problem;

/// A validated idempotency key, as the client sent it (the quotes of a structured-field
/// string removed).
///
/// The layer puts it in the request's extensions before the handler runs; with the `axum`
/// feature it is also an extractor, for handlers that pass the key on downstream (to a
/// payment provider's own idempotency key, say).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The key.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key, owned.
    pub fn into_string(self) -> String {
        self.0
    }

    /// Reads and validates the key in `headers` under `name`: `Ok(None)` when there is
    /// none, a 400 problem when there are several, or the value is not a printable ASCII
    /// header value, is empty, or is longer than 255 characters.
    pub fn from_headers(headers: &HeaderMap, name: &HeaderName) -> Result<Option<Self>, Problem> {
        let mut values = headers.get_all(name).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(Problem::invalid_key(
                name,
                format!("the request has more than one `{name}` header; send exactly one"),
            ));
        }
        let text = value.to_str().map_err(|_| {
            Problem::invalid_key(
                name,
                format!(
                    "the `{name}` header is not a valid header value: use printable ASCII only"
                ),
            )
        })?;
        let key = IdempotencyKey::parse(text).map_err(|reason| {
            Problem::invalid_key(name, format!("the `{name}` header {reason}"))
        })?;
        Ok(Some(key))
    }

    /// Validates a key as a client would send it: `Err` says what is wrong with it (so that
    /// a caller can prefix where it came from).
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        // The draft defines the key as a structured-field string (`"abc"`); bare tokens are
        // what most clients send, so both are accepted and mean the same key.
        let key = match text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
            Some(inner) => inner,
            None => text,
        };
        IdempotencyKey::checked(key)
    }

    /// A key taken from a request's body (a webhook's event id): the same rules as a
    /// header's key (1 to [`MAX_KEY_LEN`] characters of printable ASCII, spaces and tabs
    /// allowed but not alone), taken as it is (quotes are part of it).
    pub(crate) fn from_body_value(text: &str) -> Result<Self, String> {
        IdempotencyKey::checked(text)
    }

    /// The character and length rules every key obeys, wherever it came from: no control
    /// character reaches a handler, a log line or a header it passes the key on in.
    fn checked(key: &str) -> Result<Self, String> {
        if key
            .bytes()
            .any(|b| !(b == b' ' || b == b'\t' || b.is_ascii_graphic()))
        {
            return Err(
                "is not printable ASCII: use letters, digits and punctuation only".to_owned(),
            );
        }
        if key.trim().is_empty() {
            return Err("is empty".to_owned());
        }
        if key.len() > MAX_KEY_LEN {
            return Err(format!(
                "is {} characters long; at most {MAX_KEY_LEN} are accepted",
                key.len()
            ));
        }
        Ok(IdempotencyKey(key.to_owned()))
    }
}

impl std::fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// The id of the stored key for `key` sent by `client`, `None` for a client that was not
/// told (refused before this). Injective: a principal is length-prefixed (`5:alice:k1`), a
/// principal too long to fit the store's id limit is replaced by its digest (`#<hex>:k1`),
/// a client known by its credentials is `@<hex>:k1`, and the shared key space is `-:k1`;
/// so no two clients share an id and none can forge another's. A stored format: a change
/// makes every stored key unreachable.
pub(crate) fn stored_id(client: &Client, key: &IdempotencyKey) -> Option<String> {
    Some(match client {
        Client::Shared => format!("-:{}", key.0),
        Client::Principal(p) if p.len() <= 256 => format!("{}:{p}:{}", p.len(), key.0),
        Client::Principal(p) => format!("#{}:{}", idem_core::digest_hex(p), key.0),
        Client::Credentials(hex) => format!("@{hex}:{}", key.0),
        Client::Unidentified(_) => return None,
    })
}

/// The stored key under which a layer with `scope` and `identity` keeps the record of the
/// idempotency key `key` sent in `request` (its headers are what the identity reads): what
/// an operator looks up when a customer quotes their `Idempotency-Key` (`idem get --scope`).
/// `Err` says why there is none: the key breaks a key's rules, or the identity does not
/// tell the request's client (no credentials, no principal, no secret).
///
/// ```
/// use idem_http::{stored_key, ClientIdentity};
///
/// let alice = ClientIdentity::principal(|_| Some("alice".to_owned()));
/// let request = http::Request::post("/").body(()).unwrap().into_parts().0;
/// let key = stored_key("payments", &alice, &request, "order-42").unwrap();
/// assert_eq!(key.as_str(), "payments/5:alice:order-42");
/// ```
pub fn stored_key(
    scope: &str,
    identity: &crate::ClientIdentity,
    request: &http::request::Parts,
    key: &str,
) -> Result<idem_core::Key, String> {
    let key = IdempotencyKey::parse(key).map_err(|reason| format!("the key {reason}"))?;
    let client = identity.of(request);
    let id = stored_id(&client, &key).ok_or_else(|| match client {
        Client::Unidentified(crate::identity::Missing::Principal) => {
            "the principal function found no principal in the request".to_owned()
        }
        Client::Unidentified(crate::identity::Missing::Secret) => {
            "the credentials identity has no secret (`keyed`) nor `unkeyed`".to_owned()
        }
        _ => "the request carries none of the credentials the identity reads".to_owned(),
    })?;
    idem_core::Key::new(scope, id).map_err(|err| err.to_string())
}
