//! Signed requests: the part of a signature scheme's credentials that stays the same from
//! one attempt to the next (the user name, the access key id, the `keyId`), so that a retry
//! with a new nonce, date or signature is the same client.
//!
//! | scheme | stable part |
//! | --- | --- |
//! | `Digest` (RFC 7616) | `username` (or `username*`) and `realm` |
//! | `AWS4-HMAC-SHA256`, `AWS4-ECDSA-P256-SHA256` (SigV4, SigV4a) | the access key id, before the first `/` of `Credential` |
//! | `AWS`, `SharedKey`, `SharedKeyLite` | the access key or account, before `:` |
//! | `Signature` (HTTP Signatures in `Authorization`) | `keyId` |
//! | `Hawk` | `id` |
//! | `HMAC`, `HMAC-*` | `keyId`, `Credential` (before `/`), `username` or `id` |
//! | the `Signature-Input` and `Signature` headers (RFC 9421 and its drafts) | each `keyid` |
//!
//! A signed scheme whose stable part is missing counts by its whole header, as any other
//! credential does: each attempt is then a client of its own, never one shared with another.

/// The stable part of an `Authorization` value of a signed scheme: `Some((scheme, part))`,
/// the scheme lowercase; `None` for any other scheme (Bearer, Basic), which counts whole.
pub(crate) fn stable_part(authorization: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(authorization).ok()?.trim();
    let (scheme, rest) = match text.split_once([' ', '\t']) {
        Some((scheme, rest)) => (scheme, rest.trim()),
        None => (text, ""),
    };
    let scheme = scheme.to_ascii_lowercase();
    let part = match scheme.as_str() {
        "digest" => {
            let params = auth_params(rest);
            let user = param(&params, "username*").or_else(|| param(&params, "username"))?;
            let realm = param(&params, "realm").unwrap_or_default();
            // Length-prefixed: a `:` in the user name cannot move bytes into the realm.
            format!("{}:{user}{realm}", user.len())
        }
        s if s.starts_with("aws4-") => {
            let params = auth_params(rest);
            let credential = param(&params, "credential")?;
            before(&credential, '/')?
        }
        "aws" | "sharedkey" | "sharedkeylite" => before(rest, ':')?,
        "signature" => param(&auth_params(rest), "keyid")?,
        "hawk" => param(&auth_params(rest), "id")?,
        s if s == "hmac" || s.starts_with("hmac-") => {
            let params = auth_params(rest);
            match param(&params, "keyid") {
                Some(key_id) => key_id,
                None => match param(&params, "credential") {
                    Some(credential) => before(&credential, '/')?,
                    None => param(&params, "username").or_else(|| param(&params, "id"))?,
                },
            }
        }
        _ => return None,
    };
    if part.is_empty() {
        return None;
    }
    Some((scheme, part))
}

/// The `keyid` parameters of a `Signature-Input` (RFC 9421) or `Signature` (the drafts)
/// header value, in their order: the signature's own value and its `created`, `nonce`
/// and `expires` change with every attempt and do not count.
pub(crate) fn signature_key_ids(value: &[u8]) -> Vec<String> {
    let Ok(text) = std::str::from_utf8(value) else {
        return Vec::new();
    };
    // RFC 9421 puts the parameters after `;` inside a dictionary member, the drafts after
    // `,`; splitting on both, outside quotes, finds every `keyid` in either.
    split_outside_quotes(text, &[',', ';'])
        .into_iter()
        .filter_map(|item| {
            let (name, value) = item.split_once('=')?;
            // `sig1=("@method" ...);keyid="k"`: the name is after the last `;` or `(`.
            let name = name.trim();
            name.eq_ignore_ascii_case("keyid")
                .then(|| unquote(value.trim()))
                .filter(|v| !v.is_empty())
        })
        .collect()
}

/// `rest` up to `sep`, when it has one and something before it.
fn before(rest: &str, sep: char) -> Option<String> {
    let (part, _) = rest.split_once(sep)?;
    let part = part.trim();
    (!part.is_empty()).then(|| part.to_owned())
}

/// The comma-separated `name=value` parameters of an auth scheme, names lowercase, values
/// unquoted.
fn auth_params(rest: &str) -> Vec<(String, String)> {
    split_outside_quotes(rest, &[','])
        .into_iter()
        .filter_map(|item| {
            let (name, value) = item.split_once('=')?;
            Some((name.trim().to_ascii_lowercase(), unquote(value.trim())))
        })
        .collect()
}

/// The first parameter `name` (lowercase).
fn param(params: &[(String, String)], name: &str) -> Option<String> {
    params
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.clone())
}

/// `text` split at any of `seps` that is not inside a quoted string.
fn split_outside_quotes<'a>(text: &'a str, seps: &[char]) -> Vec<&'a str> {
    let mut items = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in text.char_indices() {
        if escaped {
            escaped = false;
        } else if quoted && c == '\\' {
            escaped = true;
        } else if c == '"' {
            quoted = !quoted;
        } else if !quoted && seps.contains(&c) {
            items.push(&text[start..i]);
            start = i + c.len_utf8();
        }
    }
    items.push(&text[start..]);
    items
}

/// A value without its quotes and backslash escapes; a token as it is.
fn unquote(value: &str) -> String {
    let Some(inner) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) else {
        return value.to_owned();
    };
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(next) = chars.next() {
                out.push(next);
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(header: &str) -> Option<(String, String)> {
        stable_part(header.as_bytes())
    }

    #[test]
    fn each_scheme_has_its_stable_part() {
        assert_eq!(
            part(
                r#"Digest username="Mufasa", realm="http-auth@example.org", uri="/dir/index.html", algorithm=SHA-256, nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", nc=00000001, cnonce="f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ", qop=auth, response="753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1", opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS""#
            ),
            Some(("digest".into(), "6:Mufasahttp-auth@example.org".into()))
        );
        assert_eq!(
            part("AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, SignedHeaders=host;range;x-amz-date, Signature=fe5f80f77d5fa3beca038a248ff027d0445342fe2855ddc963176630326f1024"),
            Some(("aws4-hmac-sha256".into(), "AKIAIOSFODNN7EXAMPLE".into()))
        );
        assert_eq!(
            part(
                r#"Signature keyId="rsa-key-1",algorithm="hs2019",headers="(request-target) host date",signature="Base64(RSA-SHA512(signing string))""#
            ),
            Some(("signature".into(), "rsa-key-1".into()))
        );
        assert_eq!(
            part(
                r#"Hawk id="dh37fgj492je", ts="1353832234", nonce="j4h3g2", ext="some-app-ext-data", mac="6R4rV5iE+NPoym+WwjeHzjAGXUtLNIxmo1vpMofpLAE=""#
            ),
            Some(("hawk".into(), "dh37fgj492je".into()))
        );
        assert_eq!(
            part("HMAC-SHA256 Credential=client-7/20261202, Signature=abc"),
            Some(("hmac-sha256".into(), "client-7".into()))
        );
        assert_eq!(
            part("SharedKey myaccount:ctzMq410TV3wS7upTBcunJTDLEJwMAZuFPfr0mrrA08="),
            Some(("sharedkey".into(), "myaccount".into()))
        );
        // Bearer and Basic count whole; a signed scheme without its stable part too.
        assert_eq!(part("Bearer abc"), None);
        assert_eq!(part("Basic YWxpY2U6cGFzc3dvcmQ="), None);
        assert_eq!(part(r#"Digest realm="r", nonce="n""#), None);
        assert_eq!(part("Hawk"), None);
    }

    #[test]
    fn a_quoted_comma_or_escape_does_not_split_a_parameter() {
        assert_eq!(
            part(r#"Digest username="a\"b, c", realm="r""#),
            Some(("digest".into(), "6:a\"b, cr".into()))
        );
    }

    #[test]
    fn signature_headers_give_their_key_ids() {
        assert_eq!(
            signature_key_ids(br#"sig1=("@method" "@target-uri" "content-digest");created=1618884473;keyid="test-key-rsa-pss";nonce="b3k2pp5k7z-50gnwp.yemd""#),
            vec!["test-key-rsa-pss".to_owned()]
        );
        assert_eq!(
            signature_key_ids(
                br#"keyId="hmac-key-1",algorithm="hmac-sha256",headers="date",signature="xyz""#
            ),
            vec!["hmac-key-1".to_owned()]
        );
        assert!(signature_key_ids(b"sig1=:dGVzdA==:").is_empty());
    }
}
