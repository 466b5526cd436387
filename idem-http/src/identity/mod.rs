//! What identifies a client: every stored key belongs to one, so that a stored response is
//! never served to a request from another client.

use std::fmt;
use std::sync::Arc;

use http::header::{HeaderName, AUTHORIZATION, COOKIE};
use http::request::Parts;

mod signed;

/// Maps a request to its principal (the authenticated user, a tenant).
pub(crate) type PrincipalFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// The blake3 context of a client's credentials digest. Part of the stored key format: a
/// change makes every stored key unreachable.
const CREDENTIALS_CONTEXT: &str = "idem-http 2026-12 client credentials v1";

/// Who a request comes from, as far as idempotency keys go: a key sent by one client is
/// never matched with a request from another, so neither its stored response nor the fact
/// that it exists (a 422 or 409) reaches anyone else.
///
/// | identity | a client is | a request it cannot tell |
/// | --- | --- | --- |
/// | [`credentials()`](Self::credentials) (the default) | a keyed digest of its credentials: the `Authorization`, `X-Api-Key`, `Api-Key`, `X-Auth-Token` and `X-Access-Token` headers, a session cookie, a signed request's key id | answered 400 `client-unidentified` (or shared, with [`share_anonymous`](Self::share_anonymous)) |
/// | [`principal(f)`](Self::principal) | what `f` answers (the user your authentication layer found) | `f` answered `None`: 500 `client-unidentified`, naming the likely cause (the authentication layer inside this one) |
/// | [`shared()`](Self::shared) | nobody: one key space for every client | - |
///
/// No request is ever answered from a key space it shares with another client unless the
/// service wrote that sharing down ([`shared`](Self::shared),
/// [`share_anonymous`](Self::share_anonymous)): a request the identity cannot tell is
/// refused, never run in a space other clients use.
///
/// With `credentials()`, no credential is stored: only a 128-bit blake3 digest of them,
/// keyed with a secret of the deployment ([`keyed`](Self::keyed)), so that nobody who reads
/// the store can test guesses of a weak password against it; a trace or a log shows the
/// stored key as `scope/@[client]:key`, without the digest. The layer does not build with
/// an unkeyed digest unless the service says so by name ([`unkeyed`](Self::unkeyed)).
///
/// A session cookie is one whose name (after a `__Host-` or `__Secure-` prefix, in any
/// case) is in [`SESSION_COOKIES`] or ends in `_session`, `-session` or `.session` (Rails'
/// `_<app>_session`, Laravel's `<app>_session`); other cookies (a load balancer's stickiness
/// cookie, analytics, CSRF) change from one request to the next and do not count, unless
/// [`cookies`](Self::cookies) names them. A signed request (HTTP Digest, AWS SigV4, HTTP
/// Message Signatures, Hawk, HMAC schemes) counts by what stays the same across its retries
/// (the user name, the access key id, the `keyId`), since its nonce and signature change on
/// every attempt. The layer checks no signature and no password: the layer that does must
/// run before this one (outside it), or a forged request naming another client's key id
/// would be that client. These headers and cookies are taken for secrets: a service whose
/// requests carry one that is not (a public app id in `X-Api-Key`, beside mTLS) tells its
/// clients with [`principal`](Self::principal) instead, or every request with that value
/// is one client. A client whose credentials change between two retries (a
/// refreshed token, a rotated session) is a new client, and its retry runs again: use
/// [`principal`](Self::principal) with the user's id there.
///
/// ```
/// use idem_http::{ClientIdentity, IdempotencyLayer};
/// # let idem = idem_core::Idem::new(idem_stores::MemoryStore::new());
/// # let secret_from_config = b"a secret from the deployment's configuration";
///
/// // A session cookie `app_session` and an `X-Tenant-Token` header identify a client,
/// // digested with a secret of the deployment.
/// let identity = ClientIdentity::credentials()
///     .with_header(http::HeaderName::from_static("x-tenant-token"))
///     .cookies(["app_session"])
///     .keyed(secret_from_config);
/// let layer = IdempotencyLayer::new(idem)
///     .scope("payments")
///     .client_identity(identity);
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct ClientIdentity(pub(crate) Kind);

/// The cookie names [`ClientIdentity::credentials`] reads as a session cookie (compared
/// without case, after a `__Host-` or `__Secure-` prefix), besides any name ending in
/// `_session`, `-session` or `.session`: the defaults of tower-sessions (`id`),
/// actix-session and Rails (`id`, `_session_id`), express-session (`connect.sid`), Java
/// servlets (`JSESSIONID`), Spring Session (`SESSION`), PHP (`PHPSESSID`), Django
/// (`sessionid`), Laravel (`laravel_session`), ASP.NET (`.AspNetCore.Session`,
/// `.AspNetCore.Cookies`, `.AspNetCore.Identity.Application`), Auth.js
/// (`next-auth.session-token`, `authjs.session-token`), the plain names `session`, `sid`,
/// `session_id`, and token cookies (`jwt`, `token`, `access_token`, `auth_token`).
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
    ".AspNetCore.Cookies",
    ".AspNetCore.Identity.Application",
    "jwt",
    "token",
    "access_token",
    "auth_token",
    "next-auth.session-token",
    "authjs.session-token",
];

/// The headers [`ClientIdentity::credentials`] reads by default.
const CREDENTIAL_HEADERS: &[&str] = &[
    "authorization",
    "x-api-key",
    "api-key",
    "x-auth-token",
    "x-access-token",
];

#[derive(Clone)]
pub(crate) enum Kind {
    Credentials {
        headers: Vec<HeaderName>,
        cookies: Cookies,
        key: DigestKey,
        /// A request with no credentials shares one key space with every other such
        /// request (written down with `share_anonymous`), instead of being refused.
        share_anonymous: bool,
    },
    Principal(PrincipalFn),
    Shared,
}

/// Which cookies count as credentials.
#[derive(Clone, Debug)]
pub(crate) enum Cookies {
    /// The session cookies: [`SESSION_COOKIES`] and the `_session` suffixes.
    Sessions,
    /// Exactly these names.
    Named(Vec<String>),
    /// Every cookie.
    All,
}

/// What keys the credentials digest.
#[derive(Clone)]
pub(crate) enum DigestKey {
    /// None chosen yet: the layer does not build.
    Missing,
    /// Derived from the deployment's secret.
    Keyed([u8; 32]),
    /// Unkeyed, chosen by name.
    Unkeyed,
}

impl ClientIdentity {
    /// What keeps a layer with this identity from being built, if anything.
    pub(crate) fn setup_error(&self) -> Option<&'static str> {
        match &self.0 {
            Kind::Credentials {
                key: DigestKey::Missing,
                ..
            } => Some("the client identity digests credentials and needs a secret of the deployment to key the digest, so that a store dump or a trace reveals no credential: `ClientIdentity::credentials().keyed(secret)` (or `.principal(..)` with the user your authentication layer found; `.unkeyed()` opts out)"),
            _ => None,
        }
    }

    /// A client is its credentials, digested: the `Authorization`, `X-Api-Key`, `Api-Key`,
    /// `X-Auth-Token` and `X-Access-Token` headers (a signed scheme by its stable part), the
    /// `keyid` of the `Signature-Input` and `Signature` headers, and the session cookies.
    /// The default; it needs [`keyed`](Self::keyed) (or [`unkeyed`](Self::unkeyed)) before
    /// the layer builds. A request with none of them is answered 400
    /// `client-unidentified` unless [`share_anonymous`](Self::share_anonymous).
    pub fn credentials() -> Self {
        ClientIdentity(Kind::Credentials {
            headers: CREDENTIAL_HEADERS
                .iter()
                .map(|&h| HeaderName::from_static(h))
                .collect(),
            cookies: Cookies::Sessions,
            key: DigestKey::Missing,
            share_anonymous: false,
        })
    }

    /// Digests the credentials keyed by `secret` (a value from the deployment's
    /// configuration, the same on every instance, kept as secret as a signing key), so that
    /// the stored digest cannot be tested against guesses by someone who reads the store,
    /// a trace or a log. Changing it makes the keys stored before unreachable. Only for
    /// [`credentials`](Self::credentials); ignored otherwise.
    pub fn keyed(mut self, secret: impl AsRef<[u8]>) -> Self {
        if let Kind::Credentials { key, .. } = &mut self.0 {
            *key = DigestKey::Keyed(blake3::derive_key(CREDENTIALS_CONTEXT, secret.as_ref()));
        }
        self
    }

    /// Digests the credentials without a secret: anyone who reads a stored key id can then
    /// test guesses of a credential against it (a weak Basic password falls in seconds).
    /// Only for a deployment that has no secret to give and whose store and logs are as
    /// private as its credentials. Only for [`credentials`](Self::credentials); ignored
    /// otherwise.
    pub fn unkeyed(mut self) -> Self {
        if let Kind::Credentials { key, .. } = &mut self.0 {
            *key = DigestKey::Unkeyed;
        }
        self
    }

    /// A request that carries none of the credentials is the anonymous client, whose keys
    /// every such request shares (a public endpoint's), instead of being answered 400
    /// `client-unidentified`. Only for [`credentials`](Self::credentials); ignored
    /// otherwise.
    pub fn share_anonymous(mut self) -> Self {
        if let Kind::Credentials {
            share_anonymous, ..
        } = &mut self.0
        {
            *share_anonymous = true;
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

    /// The cookies that identify a client (your session cookie's name, exactly), instead of
    /// the session cookies: cookies that change from one request to the next (a load
    /// balancer's stickiness, analytics, CSRF) must not be among them, or a retry becomes
    /// another client's request. An empty list leaves cookies out. Only for
    /// [`credentials`](Self::credentials); ignored otherwise.
    pub fn cookies<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        if let Kind::Credentials { cookies, .. } = &mut self.0 {
            *cookies = Cookies::Named(names.into_iter().map(Into::into).collect());
        }
        self
    }

    /// Every cookie identifies a client (in any order): for services whose cookies never
    /// change between a request and its retry. Only for [`credentials`](Self::credentials);
    /// ignored otherwise.
    pub fn all_cookies(mut self) -> Self {
        if let Kind::Credentials { cookies, .. } = &mut self.0 {
            *cookies = Cookies::All;
        }
        self
    }

    /// A client is its principal, as `principal` finds it in the request: the user an
    /// authentication layer outside this one left in the request's extensions (a client
    /// certificate's subject your TLS acceptor put there, too). `None` (or an empty
    /// principal) is never a shared key space: the request is answered 500
    /// `client-unidentified`, since the usual cause is an authentication layer placed inside
    /// this one, which has not run yet. An endpoint that takes anonymous requests on purpose
    /// says so in `principal`: `.or_else(|| Some("anonymous".to_owned()))`.
    ///
    /// ```
    /// use idem_http::ClientIdentity;
    ///
    /// /// What the service's authentication layer puts in the request's extensions.
    /// #[derive(Clone)]
    /// struct Customer { id: String }
    ///
    /// let identity = ClientIdentity::principal(|parts| {
    ///     parts.extensions.get::<Customer>().map(|c| c.id.clone())
    /// });
    /// # let _ = identity;
    /// ```
    pub fn principal<F>(principal: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        ClientIdentity(Kind::Principal(Arc::new(principal)))
    }

    /// No client identity: one key space shared by every client, so whoever sends a key
    /// gets its stored response. Only for keys shared on purpose (a webhook's event ids,
    /// behind a signature check).
    pub fn shared() -> Self {
        ClientIdentity(Kind::Shared)
    }

    /// Who sent `parts`.
    pub(crate) fn of(&self, parts: &Parts) -> Client {
        match &self.0 {
            Kind::Shared => Client::Shared,
            // An empty principal is no principal (a user id field left empty), never one
            // key space for every request that has it.
            Kind::Principal(f) => match f(parts) {
                Some(p) if !p.trim().is_empty() => Client::Principal(p),
                _ => Client::Unidentified(Missing::Principal),
            },
            Kind::Credentials {
                headers,
                cookies,
                key,
                share_anonymous,
            } => {
                let key = match key {
                    DigestKey::Keyed(key) => Some(key),
                    DigestKey::Unkeyed => None,
                    DigestKey::Missing => return Client::Unidentified(Missing::Secret),
                };
                match credentials_digest(parts, headers, cookies, key) {
                    Some(hex) => Client::Credentials(hex),
                    None if *share_anonymous => Client::Shared,
                    None => Client::Unidentified(Missing::Credentials),
                }
            }
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
                share_anonymous,
            } => f
                .debug_struct("Credentials")
                .field("headers", headers)
                .field("cookies", cookies)
                .field(
                    "key",
                    &match key {
                        DigestKey::Missing => "missing",
                        DigestKey::Keyed(_) => "keyed",
                        DigestKey::Unkeyed => "unkeyed",
                    },
                )
                .field("share_anonymous", share_anonymous)
                .finish(),
            Kind::Principal(_) => f.write_str("Principal(..)"),
            Kind::Shared => f.write_str("Shared"),
        }
    }
}

/// One request's client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Client {
    /// The key space shared on purpose.
    Shared,
    Principal(String),
    /// The hex digest of the credentials.
    Credentials(String),
    /// Not told: the request is refused.
    Unidentified(Missing),
}

/// What a request lacked for its client to be told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Missing {
    /// None of the credentials the identity reads.
    Credentials,
    /// The principal function answered `None`.
    Principal,
    /// The digest has no key (the layer's setup check prevents it).
    Secret,
}

/// Whether `name` is a session cookie of [`Cookies::Sessions`].
fn is_session_cookie(name: &[u8]) -> bool {
    let Ok(name) = std::str::from_utf8(name) else {
        return false;
    };
    let lower = name.to_ascii_lowercase();
    let bare = lower
        .strip_prefix("__host-")
        .or_else(|| lower.strip_prefix("__secure-"))
        .unwrap_or(&lower);
    SESSION_COOKIES
        .iter()
        .any(|known| known.eq_ignore_ascii_case(bare))
        || ["_session", "-session", ".session"]
            .iter()
            .any(|suffix| bare.len() > suffix.len() && bare.ends_with(suffix))
}

/// The digest of the request's credentials, or `None` when it carries none. Each header
/// and cookie is length-prefixed with its name, so no two sets of credentials digest alike
/// by moving bytes between them; cookies are sorted (a browser may send them in any order,
/// and HTTP/2 splits them over several `cookie` headers). A signed scheme's `Authorization`
/// counts by its stable part (its own tag and scheme name, so it never digests like a
/// token of the same bytes).
fn credentials_digest(
    parts: &Parts,
    headers: &[HeaderName],
    cookies: &Cookies,
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
            // An empty value identifies nobody.
            if value.as_bytes().trim_ascii().is_empty() {
                continue;
            }
            let stable = (name == AUTHORIZATION)
                .then(|| signed::stable_part(value.as_bytes()))
                .flatten();
            match stable {
                Some((scheme, part)) => {
                    field(&mut hasher, b's', scheme.as_bytes(), part.as_bytes())
                }
                None => field(
                    &mut hasher,
                    b'h',
                    name.as_str().as_bytes(),
                    value.as_bytes(),
                ),
            }
        }
    }
    // HTTP Message Signatures: the key ids, whichever header carries them.
    let mut key_ids: Vec<String> = ["signature-input", "signature"]
        .iter()
        .flat_map(|name| parts.headers.get_all(*name))
        .flat_map(|v| signed::signature_key_ids(v.as_bytes()))
        .collect();
    key_ids.sort_unstable();
    key_ids.dedup();
    for key_id in key_ids {
        field(&mut hasher, b's', b"keyid", key_id.as_bytes());
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
        .filter(|(name, value)| {
            !name.is_empty()
                && !value.is_empty()
                && match cookies {
                    Cookies::Sessions => is_session_cookie(name),
                    Cookies::Named(only) => only.iter().any(|o| o.as_bytes() == *name),
                    Cookies::All => true,
                }
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

    const NONE: Client = Client::Unidentified(Missing::Credentials);

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
        let id = ClientIdentity::credentials().keyed("s");
        let alice = who(&id, &[("authorization", "Bearer alice-token")]);
        let bob = who(&id, &[("authorization", "Bearer bob-token")]);
        assert_ne!(alice, bob);
        assert_eq!(alice, who(&id, &[("authorization", "Bearer alice-token")]));
        let Client::Credentials(hex) = &alice else {
            panic!("{alice:?}")
        };
        assert_eq!(hex.len(), 32);
        assert!(!hex.contains("alice"));
        assert_eq!(who(&id, &[]), NONE);
    }

    #[test]
    fn cookies_count_in_any_order_and_split_over_headers() {
        let id = ClientIdentity::credentials().keyed("s").all_cookies();
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
            .keyed("s")
            .cookies(["sid"])
            .with_header(HeaderName::from_static("x-tenant"));
        assert_eq!(
            who(&id, &[("cookie", "sid=s1; _ga=1")]),
            who(&id, &[("cookie", "_ga=2; sid=s1")])
        );
        assert_eq!(who(&id, &[("cookie", "_ga=2")]), NONE);
        assert_ne!(
            who(&id, &[("x-tenant", "k1")]),
            who(&id, &[("x-tenant", "k2")])
        );
        // A header value and a cookie of the same bytes are not the same credential.
        let both = ClientIdentity::credentials().keyed("s").all_cookies();
        assert_ne!(
            who(&both, &[("authorization", "sid=s1")]),
            who(&both, &[("cookie", "authorization=sid=s1")])
        );
    }

    #[test]
    fn by_default_the_session_cookie_and_api_key_count_and_other_cookies_do_not() {
        let id = ClientIdentity::credentials().keyed("s");
        let one = who(&id, &[("cookie", "id=s1; AWSALB=a1; _ga=g1")]);
        assert!(matches!(one, Client::Credentials(_)));
        // The stickiness and analytics cookies changed on the retry: the same client.
        assert_eq!(one, who(&id, &[("cookie", "AWSALB=a2; id=s1; _ga=g2")]));
        assert_ne!(one, who(&id, &[("cookie", "id=s2")]));
        assert_eq!(who(&id, &[("cookie", "AWSALB=a1")]), NONE);
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
        let plain = who(&ClientIdentity::credentials().unkeyed(), creds);
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
        assert_eq!(
            who(&id, &[("authorization", "a")]),
            Client::Unidentified(Missing::Principal)
        );
        assert_eq!(
            who(&id, &[("x-user", " ")]),
            Client::Unidentified(Missing::Principal),
            "an empty principal is none"
        );
        assert_eq!(
            who(&ClientIdentity::shared(), &[("authorization", "a")]),
            Client::Shared
        );
    }

    #[test]
    fn the_session_cookies_of_common_frameworks_count() {
        let id = ClientIdentity::credentials().keyed("s");
        for cookie in [
            "SESSION",
            "_shop_session",
            "__Host-session",
            "__Secure-sid",
            "__Host-id",
            ".AspNetCore.Cookies",
            ".AspNetCore.Identity.Application",
            "jwt",
            "myapp-session",
            "Connect.SID",
        ] {
            let a = who(&id, &[("cookie", &format!("{cookie}=a; _ga=1"))]);
            let b = who(&id, &[("cookie", &format!("{cookie}=b; _ga=1"))]);
            assert!(matches!(a, Client::Credentials(_)), "{cookie}: {a:?}");
            assert_ne!(a, b, "{cookie}");
        }
        for cookie in ["_ga", "AWSALB", "csrftoken", "_session", "theme"] {
            assert_eq!(
                who(&id, &[("cookie", &format!("{cookie}=a"))]),
                NONE,
                "{cookie}"
            );
        }
    }

    #[test]
    fn the_default_api_key_headers_count_and_empty_values_do_not() {
        let id = ClientIdentity::credentials().keyed("s");
        for header in ["api-key", "x-auth-token", "x-access-token", "x-api-key"] {
            assert_ne!(who(&id, &[(header, "k1")]), who(&id, &[(header, "k2")]));
            assert!(matches!(
                who(&id, &[(header, "k1")]),
                Client::Credentials(_)
            ));
        }
        assert_eq!(who(&id, &[("authorization", "")]), NONE);
        assert_eq!(who(&id, &[("cookie", "session=")]), NONE);
    }

    #[test]
    fn a_signed_request_is_one_client_across_its_attempts() {
        let id = ClientIdentity::credentials().keyed("s");
        let digest = |nonce: &str, user: &str| {
            who(
                &id,
                &[(
                    "authorization",
                    &format!(
                        r#"Digest username="{user}", realm="api", nonce="{nonce}", uri="/charge", response="{nonce}ff""#
                    ),
                )],
            )
        };
        assert_eq!(digest("n1", "alice"), digest("n2", "alice"));
        assert_ne!(digest("n1", "alice"), digest("n1", "bob"));
        let sigv4 = |date: &str, sig: &str| {
            who(&id, &[("authorization", &format!("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/{date}/us-east-1/execute-api/aws4_request, SignedHeaders=host;x-amz-date, Signature={sig}"))])
        };
        assert_eq!(sigv4("20261201", "aa"), sigv4("20261202", "bb"));
        let rfc9421 = |nonce: &str, sig: &str| {
            who(
                &id,
                &[
                    (
                        "signature-input",
                        &format!(r#"sig1=("@method");created=1;keyid="k-7";nonce="{nonce}""#),
                    ),
                    ("signature", &format!("sig1=:{sig}:")),
                ],
            )
        };
        assert_eq!(rfc9421("a", "AAAA"), rfc9421("b", "BBBB"));
        assert!(matches!(rfc9421("a", "AAAA"), Client::Credentials(_)));
        let hawk = |nonce: &str| {
            who(
                &id,
                &[(
                    "authorization",
                    &format!(r#"Hawk id="dh37", ts="1", nonce="{nonce}", mac="m{nonce}""#),
                )],
            )
        };
        assert_eq!(hawk("x"), hawk("y"));
        // A stable part never digests like a token of the same bytes.
        assert_ne!(hawk("x"), who(&id, &[("authorization", "dh37")]));
    }

    #[test]
    fn without_a_secret_or_a_principal_nobody_is_told() {
        let id = ClientIdentity::credentials();
        assert!(id.setup_error().is_some());
        assert_eq!(
            who(&id, &[("authorization", "Bearer a")]),
            Client::Unidentified(Missing::Secret)
        );
        assert!(ClientIdentity::credentials()
            .unkeyed()
            .setup_error()
            .is_none());
        let open = ClientIdentity::credentials().keyed("s").share_anonymous();
        assert_eq!(who(&open, &[]), Client::Shared);
        assert!(format!("{:?}", ClientIdentity::credentials().keyed("hunter2")).contains("keyed"));
        assert!(
            !format!("{:?}", ClientIdentity::credentials().keyed("hunter2")).contains("hunter2")
        );
    }
}
