//! What identifies a client: every stored key belongs to one, so that a stored response is
//! never served to a request from another client.

use std::fmt;
use std::sync::Arc;

use http::header::{HeaderName, AUTHORIZATION, COOKIE};
use http::request::Parts;

/// Maps a request to its principal (the authenticated user, a tenant).
pub(crate) type PrincipalFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// The blake3 context of a client's credentials digest. Part of the stored key format: a
/// change makes every stored key unreachable.
const CREDENTIALS_CONTEXT: &str = "idem-http 2026-12 client credentials v1";

/// Who a request comes from, as far as idempotency keys go: a key sent by one client is
/// never matched with a request from another, so neither its stored response nor the fact
/// that it exists (a 422 or 409) reaches anyone else.
///
/// | identity | a client is | for |
/// | --- | --- | --- |
/// | [`credentials()`](Self::credentials) (the default) | a digest of its `Authorization` and `X-Api-Key` headers and its session cookie | services whose clients authenticate with a token, an API key, Basic auth or a session cookie |
/// | [`principal(f)`](Self::principal) | what `f` answers (a user id, a tenant) | services whose authentication layer already knows the user |
/// | [`shared()`](Self::shared) | nobody: one key space for every client | keys shared on purpose (a webhook's event ids, one trusted caller) |
///
/// With `credentials()`, no credential is stored: only a 128-bit blake3 digest of them
/// ([`keyed`](Self::keyed) with a secret of the deployment, so that nobody who reads the
/// store or the logs can test guesses of a weak password against it). The session cookie
/// is any of [`SESSION_COOKIES`] (the defaults of the common session libraries); other
/// cookies (a load balancer's stickiness cookie, analytics, CSRF) change from one request to
/// the next and do not count, unless [`cookies`](Self::cookies) names them. A request with
/// none of them is the anonymous client, whose keys are shared by every anonymous request
/// (the layer warns once when it sees one). A client whose credentials change between two
/// retries (a refreshed token, a rotated session) is a new client, and its retry runs
/// again: use [`principal`](Self::principal) with the user's id there.
///
/// ```
/// use idem_http::{ClientIdentity, IdempotencyLayer};
/// # let idem = idem_core::Idem::new(idem_stores::MemoryStore::new());
///
/// // A session cookie `app_session` and an `X-Tenant-Token` header identify a client,
/// // digested with a secret of the deployment.
/// let identity = ClientIdentity::credentials()
///     .with_header(http::HeaderName::from_static("x-tenant-token"))
///     .cookies(["app_session"])
///     .keyed(b"a secret from the deployment's configuration");
/// let layer = IdempotencyLayer::new(idem).client_identity(identity);
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct ClientIdentity(pub(crate) Kind);

/// The cookie names [`ClientIdentity::credentials`] reads as a session cookie: the defaults
/// of tower-sessions (`id`), actix-session and Rails (`id`, `_session_id`), express-session
/// (`connect.sid`), Java servlets (`JSESSIONID`), PHP (`PHPSESSID`), Django (`sessionid`),
/// Laravel (`laravel_session`), ASP.NET (`.AspNetCore.Session`), and the plain names
/// `session`, `sid`, `session_id`.
pub const SESSION_COOKIES: &[&str] = &[
    "id",
    "sid",
    "session",
    "session_id",
    "sessionid",
    "_session_id",
    "connect.sid",
    "JSESSIONID",
    "PHPSESSID",
    "laravel_session",
    ".AspNetCore.Session",
];

#[derive(Clone)]
pub(crate) enum Kind {
    Credentials {
        headers: Vec<HeaderName>,
        /// `None`: every cookie.
        cookies: Option<Vec<String>>,
        /// The blake3 key, derived from the deployment's secret.
        key: Option<[u8; 32]>,
    },
    Principal(PrincipalFn),
    Shared,
}

impl ClientIdentity {
    /// Whether this is the default kind, which warns when a request carries none of the
    /// credentials it reads.
    pub(crate) fn is_credentials(&self) -> bool {
        matches!(self.0, Kind::Credentials { .. })
    }

    /// A client is its credentials: the `Authorization` and `X-Api-Key` headers and the
    /// session cookie (any of [`SESSION_COOKIES`]), digested. The default.
    pub fn credentials() -> Self {
        ClientIdentity(Kind::Credentials {
            headers: vec![AUTHORIZATION, HeaderName::from_static("x-api-key")],
            cookies: Some(SESSION_COOKIES.iter().map(|&c| c.to_owned()).collect()),
            key: None,
        })
    }

    /// Digests the credentials keyed by `secret` (a value from the deployment's
    /// configuration, the same on every instance, kept as secret as a signing key), so that
    /// the stored digest cannot be tested against guesses by someone who reads the store.
    /// Changing it makes the keys stored before unreachable. Only for
    /// [`credentials`](Self::credentials); ignored otherwise.
    pub fn keyed(mut self, secret: impl AsRef<[u8]>) -> Self {
        if let Kind::Credentials { key, .. } = &mut self.0 {
            *key = Some(blake3::derive_key(CREDENTIALS_CONTEXT, secret.as_ref()));
        }
        self
    }

    /// Another header that carries a credential (an API key header, say), digested with
    /// the others. Only for [`credentials`](Self::credentials); ignored otherwise.
    pub fn with_header(mut self, name: HeaderName) -> Self {
        if let Kind::Credentials { headers, .. } = &mut self.0 {
            if !headers.contains(&name) {
                headers.push(name);
            }
        }
        self
    }

    /// The cookies that identify a client (your session cookie's name), instead of
    /// [`SESSION_COOKIES`]: cookies that change from one request to the next (a load
    /// balancer's stickiness, analytics, CSRF) must not be among them, or a retry becomes
    /// another client's request. An empty list leaves cookies out. Only for
    /// [`credentials`](Self::credentials); ignored otherwise.
    pub fn cookies<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        if let Kind::Credentials { cookies, .. } = &mut self.0 {
            *cookies = Some(names.into_iter().map(Into::into).collect());
        }
        self
    }

    /// Every cookie identifies a client (in any order): for services whose cookies never
    /// change between a request and its retry. Only for [`credentials`](Self::credentials);
    /// ignored otherwise.
    pub fn all_cookies(mut self) -> Self {
        if let Kind::Credentials { cookies, .. } = &mut self.0 {
            *cookies = None;
        }
        self
    }

    /// A client is its principal, as `principal` finds it in the request (the user an
    /// authentication layer outside this one left in the extensions, a tenant header);
    /// `None` is the anonymous client.
    pub fn principal<F>(principal: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        ClientIdentity(Kind::Principal(Arc::new(principal)))
    }

    /// No client identity: one key space shared by every client, so whoever sends a key
    /// gets its stored response. Only for keys shared on purpose.
    pub fn shared() -> Self {
        ClientIdentity(Kind::Shared)
    }

    /// Who sent `parts`.
    pub(crate) fn of(&self, parts: &Parts) -> Client {
        match &self.0 {
            Kind::Shared => Client::Anonymous,
            Kind::Principal(f) => match f(parts) {
                Some(p) => Client::Principal(p),
                None => Client::Anonymous,
            },
            Kind::Credentials {
                headers,
                cookies,
                key,
            } => credentials_digest(parts, headers, cookies.as_deref(), key.as_ref())
                .map_or(Client::Anonymous, Client::Credentials),
        }
    }
}

impl Default for ClientIdentity {
    fn default() -> Self {
        ClientIdentity::credentials()
    }
}

impl fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::Credentials {
                headers,
                cookies,
                key,
            } => f
                .debug_struct("Credentials")
                .field("headers", headers)
                .field("cookies", cookies)
                .field("keyed", &key.is_some())
                .finish(),
            Kind::Principal(_) => f.write_str("Principal(..)"),
            Kind::Shared => f.write_str("Shared"),
        }
    }
}

/// One request's client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Client {
    Anonymous,
    Principal(String),
    /// The hex digest of the credentials.
    Credentials(String),
}

/// The digest of the request's credentials, or `None` when it carries none. Each header
/// and cookie is length-prefixed with its name, so no two sets of credentials digest alike
/// by moving bytes between them; cookies are sorted (a browser may send them in any order,
/// and HTTP/2 splits them over several `cookie` headers).
fn credentials_digest(
    parts: &Parts,
    headers: &[HeaderName],
    only_cookies: Option<&[String]>,
    key: Option<&[u8; 32]>,
) -> Option<String> {
    let mut hasher = match key {
        Some(key) => blake3::Hasher::new_keyed(key),
        None => blake3::Hasher::new_derive_key(CREDENTIALS_CONTEXT),
    };
    let mut any = false;
    let mut field = |hasher: &mut blake3::Hasher, kind: u8, name: &[u8], value: &[u8]| {
        any = true;
        hasher.update(&[kind]);
        hasher.update(&(name.len() as u64).to_le_bytes());
        hasher.update(name);
        hasher.update(&(value.len() as u64).to_le_bytes());
        hasher.update(value);
    };
    for name in headers {
        for value in parts.headers.get_all(name) {
            field(
                &mut hasher,
                b'h',
                name.as_str().as_bytes(),
                value.as_bytes(),
            );
        }
    }
    let mut jar: Vec<(&[u8], &[u8])> = parts
        .headers
        .get_all(COOKIE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b';'))
        .filter_map(|pair| {
            let pair = pair.trim_ascii();
            let eq = pair.iter().position(|&b| b == b'=')?;
            Some((pair[..eq].trim_ascii(), pair[eq + 1..].trim_ascii()))
        })
        .filter(|(name, _)| {
            !name.is_empty()
                && only_cookies.is_none_or(|only| only.iter().any(|o| o.as_bytes() == *name))
        })
        .collect();
    jar.sort_unstable();
    for (name, value) in jar {
        field(&mut hasher, b'c', name, value);
    }
    if !any {
        return None;
    }
    let digest = hasher.finalize();
    Some(
        digest.as_bytes()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(headers: &[(&str, &str)]) -> Parts {
        let mut req = http::Request::post("/");
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        req.body(()).unwrap().into_parts().0
    }

    fn who(identity: &ClientIdentity, headers: &[(&str, &str)]) -> Client {
        identity.of(&parts(headers))
    }

    #[test]
    fn credentials_tell_clients_apart_and_store_no_secret() {
        let id = ClientIdentity::credentials();
        let alice = who(&id, &[("authorization", "Bearer alice-token")]);
        let bob = who(&id, &[("authorization", "Bearer bob-token")]);
        assert_ne!(alice, bob);
        assert_eq!(alice, who(&id, &[("authorization", "Bearer alice-token")]));
        let Client::Credentials(hex) = &alice else {
            panic!("{alice:?}")
        };
        assert_eq!(hex.len(), 32);
        assert!(!hex.contains("alice"));
        assert_eq!(who(&id, &[]), Client::Anonymous);
    }

    #[test]
    fn cookies_count_in_any_order_and_split_over_headers() {
        let id = ClientIdentity::credentials().all_cookies();
        let one = who(&id, &[("cookie", "sid=s1; theme=dark")]);
        assert_eq!(one, who(&id, &[("cookie", "theme=dark;sid=s1")]));
        assert_eq!(
            one,
            who(&id, &[("cookie", "theme=dark"), ("cookie", "sid=s1")])
        );
        assert_ne!(one, who(&id, &[("cookie", "sid=s2; theme=dark")]));
        // Bytes cannot move from a name to a value unnoticed.
        assert_ne!(
            who(&id, &[("cookie", "ab=c")]),
            who(&id, &[("cookie", "a=bc")])
        );
    }

    #[test]
    fn only_the_named_cookies_and_the_added_headers_count() {
        let id = ClientIdentity::credentials()
            .cookies(["sid"])
            .with_header(HeaderName::from_static("x-tenant"));
        assert_eq!(
            who(&id, &[("cookie", "sid=s1; _ga=1")]),
            who(&id, &[("cookie", "_ga=2; sid=s1")])
        );
        assert_eq!(who(&id, &[("cookie", "_ga=2")]), Client::Anonymous);
        assert_ne!(
            who(&id, &[("x-tenant", "k1")]),
            who(&id, &[("x-tenant", "k2")])
        );
        // A header value and a cookie of the same bytes are not the same credential.
        let both = ClientIdentity::credentials().all_cookies();
        assert_ne!(
            who(&both, &[("authorization", "sid=s1")]),
            who(&both, &[("cookie", "authorization=sid=s1")])
        );
    }

    #[test]
    fn by_default_the_session_cookie_and_api_key_count_and_other_cookies_do_not() {
        let id = ClientIdentity::credentials();
        let one = who(&id, &[("cookie", "id=s1; AWSALB=a1; _ga=g1")]);
        assert!(matches!(one, Client::Credentials(_)));
        // The stickiness and analytics cookies changed on the retry: the same client.
        assert_eq!(one, who(&id, &[("cookie", "AWSALB=a2; id=s1; _ga=g2")]));
        assert_ne!(one, who(&id, &[("cookie", "id=s2")]));
        assert_eq!(who(&id, &[("cookie", "AWSALB=a1")]), Client::Anonymous);
        assert_ne!(
            who(&id, &[("x-api-key", "k1")]),
            who(&id, &[("x-api-key", "k2")])
        );
        assert!(matches!(
            who(&id, &[("cookie", "JSESSIONID=j")]),
            Client::Credentials(_)
        ));
    }

    #[test]
    fn a_keyed_digest_differs_by_secret_and_from_the_unkeyed_one() {
        let creds: &[(&str, &str)] = &[("authorization", "Basic YWxpY2U6cGFzc3dvcmQ=")];
        let plain = who(&ClientIdentity::credentials(), creds);
        let a = who(&ClientIdentity::credentials().keyed("secret a"), creds);
        let b = who(&ClientIdentity::credentials().keyed("secret b"), creds);
        assert_ne!(plain, a);
        assert_ne!(a, b);
        assert_eq!(
            a,
            who(&ClientIdentity::credentials().keyed("secret a"), creds)
        );
    }

    #[test]
    fn a_principal_or_shared_keys_ignore_credentials() {
        let id = ClientIdentity::principal(|p| {
            p.headers
                .get("x-user")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        });
        assert_eq!(
            who(&id, &[("x-user", "u1"), ("authorization", "a")]),
            Client::Principal("u1".into())
        );
        assert_eq!(who(&id, &[("authorization", "a")]), Client::Anonymous);
        assert_eq!(
            who(&ClientIdentity::shared(), &[("authorization", "a")]),
            Client::Anonymous
        );
    }
}
