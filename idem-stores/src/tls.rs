//! Whether a store URL asks for TLS that this build cannot speak: then the error names the
//! cargo feature to turn on, rather than the client's own words (or, worse, a plain-text
//! connection the operator did not ask for).

use idem_core::Error;

/// The feature a URL needs for the TLS it asks for, when that feature is off in this build.
fn missing_tls_feature(url: &str) -> Option<&'static str> {
    let (scheme, rest) = url.split_once("://")?;
    match scheme {
        "rediss" | "rediss+cluster" if cfg!(not(feature = "redis-tls")) => Some("redis-tls"),
        "postgres" | "postgresql" if cfg!(not(feature = "postgres-tls")) => {
            let query = rest.split_once('?').map_or("", |(_, q)| q);
            let asks = query.split('&').any(|pair| {
                let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
                matches!(name, "sslmode" | "ssl-mode")
                    && matches!(
                        value.to_ascii_lowercase().as_str(),
                        "require" | "verify-ca" | "verify-full"
                    )
            });
            asks.then_some("postgres-tls")
        }
        _ => None,
    }
}

/// [`Error::Config`] naming the feature when `url` asks for TLS this build lacks.
pub(crate) fn check(url: &str, redacted: impl FnOnce() -> String) -> Result<(), Error> {
    match missing_tls_feature(url) {
        Some(feature) => Err(Error::Config {
            message: format!(
                "`{}` asks for TLS, which needs the cargo feature `{feature}` of idem (or idem-stores); it is off in this build",
                redacted()
            ),
            source: None,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::missing_tls_feature;

    #[test]
    fn urls_that_ask_for_tls_name_the_feature_when_it_is_off() {
        let cases = [
            (
                "rediss://h:1",
                cfg!(not(feature = "redis-tls")).then_some("redis-tls"),
            ),
            ("redis://h:1", None),
            (
                "postgres://u@h/db?sslmode=require",
                cfg!(not(feature = "postgres-tls")).then_some("postgres-tls"),
            ),
            (
                "postgresql://u@h/db?x=1&sslmode=VERIFY-FULL",
                cfg!(not(feature = "postgres-tls")).then_some("postgres-tls"),
            ),
            ("postgres://u@h/db?sslmode=prefer", None),
            ("postgres://u@h/db", None),
            ("sqlite://x.db", None),
        ];
        for (url, want) in cases {
            assert_eq!(missing_tls_feature(url), want, "{url}");
        }
    }
}
