//! Store URLs in messages: their scheme, and the URL with its secrets hidden.
//!
//! An error about a URL is read in logs, so it never holds a password, even when the URL
//! is malformed (a password with an unencoded `/`, `#`, `?` or `@`, a bad host or port, no
//! scheme at all). What cannot be told apart from a password is hidden too.

/// The scheme of `url` when it starts with one followed by `://` (`postgres` in
/// `postgres://...`); `None` when it does not, or when what comes before `://` is not a
/// scheme (then it may be anything, a password included, and is not shown).
pub(crate) fn scheme(url: &str) -> Option<&str> {
    let (scheme, _) = url.split_once("://")?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    (first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(scheme)
}

/// Query parameters whose value is hidden: a name holding one of these (in any case) may
/// carry a secret (`password`, `sslpassword`, Redis's `pass`, a `token`...).
const SECRET_PARAMS: [&str; 5] = ["pass", "pwd", "secret", "token", "auth"];

/// `url` as messages show it: the password of its user info replaced by `***`, and so the
/// value of every query parameter that may hold a secret. A URL without a scheme is shown
/// as `***` whole: nothing tells its parts apart.
///
/// The user info ends at the last `@` before the path, as URLs have it; when there is no
/// `@` there but one further on, after a `:`, the password may hold an unencoded `/`, `?`
/// or `#`, and everything from that `:` to the last `@` is hidden.
pub(crate) fn redact(url: &str) -> String {
    let Some(scheme) = scheme(url) else {
        return "***".to_owned();
    };
    let rest = &url[scheme.len() + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (user_info, after) = match rest[..authority_end].rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at..]),
        None => match (rest.rfind('@'), rest.find(':')) {
            (Some(at), Some(colon)) if colon < at => (Some(&rest[..at]), &rest[at..]),
            _ => (None, rest),
        },
    };
    let mut out = format!("{scheme}://");
    if let Some(user_info) = user_info {
        match user_info.split_once(':') {
            Some((user, _password)) => {
                out.push_str(user);
                out.push_str(":***");
            }
            None => out.push_str(user_info),
        }
    }
    // The query: from the first `?` after the user info, up to a fragment.
    let Some(q) = after.find('?') else {
        out.push_str(after);
        return out;
    };
    out.push_str(&after[..=q]);
    let (query, fragment) = match after[q + 1..].split_once('#') {
        Some((query, fragment)) => (query, Some(fragment)),
        None => (&after[q + 1..], None),
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if is_secret(name) => format!("{name}=***"),
            _ if is_secret(pair) => "***".to_owned(),
            _ => pair.to_owned(),
        })
        .collect();
    out.push_str(&pairs.join("&"));
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    out
}

fn is_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_PARAMS.iter().any(|s| name.contains(s))
}

#[cfg(test)]
mod tests {
    use super::{redact, scheme};

    #[test]
    fn schemes_are_told_from_what_is_not_one() {
        assert_eq!(scheme("postgres://h/db"), Some("postgres"));
        assert_eq!(scheme("redis+cluster://a,b"), Some("redis+cluster"));
        assert_eq!(scheme("app:pw@db://x"), None);
        assert_eq!(scheme("://x"), None);
        assert_eq!(scheme("1x://x"), None);
        assert_eq!(scheme("app:pw@db"), None);
        assert_eq!(scheme(""), None);
    }

    #[test]
    fn passwords_are_hidden_whatever_the_url() {
        for (url, shown) in [
            ("redis://u:secret@h:1/0", "redis://u:***@h:1/0"),
            ("redis://h:1", "redis://h:1"),
            (
                "redis://:secret@host:notaport",
                "redis://:***@host:notaport",
            ),
            ("postgres://app:pw@[bad", "postgres://app:***@[bad"),
            ("postgress://app:pw@db/x", "postgress://app:***@db/x"),
            ("postgres://app@db/x", "postgres://app@db/x"),
            // An unencoded `@`, `/`, `#` or `?` in the password.
            ("postgres://app:p@w@db/x", "postgres://app:***@db/x"),
            ("postgres://app:p/w@db/x", "postgres://app:***@db/x"),
            ("postgres://app:p#w@db/x", "postgres://app:***@db/x"),
            ("postgres://app:p?w@db/x", "postgres://app:***@db/x"),
            // In doubt (a port, then an `@` further on), hidden too.
            ("redis://h:1/0?client=a@b", "redis://h:***@b"),
            // Secrets in the query.
            (
                "postgres://db/x?user=app&password=pw&sslmode=require",
                "postgres://db/x?user=app&password=***&sslmode=require",
            ),
            (
                "redis+unix:///tmp/r.sock?db=1&pass=pw#frag",
                "redis+unix:///tmp/r.sock?db=1&pass=***#frag",
            ),
            (
                "postgres://db/x?password=p@w",
                "postgres://db/x?password=***",
            ),
            ("mysql://db/x?PASSWORD", "mysql://db/x?***"),
            ("sqlite:///data/a@b.db", "sqlite:///data/a@b.db"),
            // No scheme: nothing is shown.
            ("app:pw@db/x", "***"),
            ("app:pw@db://x", "***"),
        ] {
            assert_eq!(redact(url), shown, "{url}");
        }
    }
}
