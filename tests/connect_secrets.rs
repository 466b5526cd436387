//! A store URL that cannot be used never shows its password: not in an error's message, its
//! `Debug`, nor anywhere in its source chain. Each error still says what was wrong (the
//! scheme, the missing feature, that the URL is malformed), and shows the URL, if at all,
//! with its password as `***`.
//!
//! Every password below holds `pw` (and no user, host or path holds those letters); the URLs
//! that parse point at 127.0.0.1 port 1, where nothing listens, so that the connect fails
//! at once and the client's own error is in the chain too.

use std::time::Duration;

/// The message and the `Debug` of `err` and of every error in its source chain.
fn shown(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = format!("{err} {err:?}");
    let mut cur = err.source();
    while let Some(e) = cur {
        out.push_str(&format!(" | {e} {e:?}"));
        cur = e.source();
    }
    out
}

/// What is wrong with `err`: a password shown, or a word of `expect` missing from its
/// message (in any case; `a|b` is either).
fn problems(url: &str, err: &idem::Error, expect: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let all = shown(err);
    if all.contains("pw") {
        out.push(format!("{url}: the password is shown: {all}"));
    }
    let message = err.to_string().to_lowercase();
    for word in expect {
        if !word.split('|').any(|w| message.contains(&w.to_lowercase())) {
            out.push(format!(
                "{url}: the message does not say `{word}`: {message}"
            ));
        }
    }
    out
}

/// Every problem at once, so that a failure lists each URL that leaks.
fn assert_none(problems: Vec<String>) {
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Bad URLs, each with the words its error must hold, whichever features are on.
fn bad_urls() -> Vec<(&'static str, Vec<&'static str>)> {
    let mut urls = vec![
        // No scheme at all, or one that is not a scheme.
        ("app:pw@db/x", vec!["scheme://"]),
        ("app:pw@db://x", vec!["scheme://"]),
        ("", vec!["scheme://"]),
        // A misspelled or unknown scheme, and passwords with an unencoded `/`, `#`, `?`
        // or `@`, or in the query.
        ("postgress://app:pw@db/x", vec!["postgress", "app:***@db/x"]),
        ("mongodb://app:pw@127.0.0.1:1/x", vec!["mongodb"]),
        ("postgress://app:pw/x@db/x", vec!["postgress"]),
        ("postgress://app:pw#x@db/x", vec!["postgress"]),
        ("postgress://app:pw?x@db/x", vec!["postgress"]),
        (
            "postgress://app:pw@x@db/x",
            vec!["postgress", "app:***@db/x"],
        ),
        (
            "postgress://db/x?password=pw",
            vec!["postgress", "password=***"],
        ),
        (
            "postgress://db/x?user=app&sslpassword=pw#f",
            vec!["postgress"],
        ),
        ("postgress://db:5432/x?password=pw@x", vec!["postgress"]),
    ];
    // (url, malformed): each error names its backend; a malformed URL's also says that it
    // is not a valid URL, or, when the store's feature is off in this build, which feature
    // to turn on (the features of idem-stores, which this test cannot see).
    let mut backend = |name: &'static str, cases: &[(&'static str, bool)]| {
        for &(url, malformed) in cases {
            let expect = if malformed {
                vec![name, "url|cargo feature"]
            } else {
                vec![name]
            };
            urls.push((url, expect));
        }
    };
    backend(
        "postgres",
        &[
            ("postgres://app:pw@[bad", true),
            ("postgres://app:pw@127.0.0.1:notaport/x", true),
            ("postgres://app:pw/x@127.0.0.1:1/x", true),
            ("postgresql://app:pw@127.0.0.1:1/x", false),
            ("postgres://app@127.0.0.1:1/x?password=pw", false),
            // Refused by the server, or without `postgres-tls`, by this build.
            ("postgres://app:pw@127.0.0.1:1/x?sslmode=require", false),
        ],
    );
    backend(
        "mysql",
        &[
            ("mysql://app:pw@[bad", true),
            ("mysql://app:pw@127.0.0.1:notaport/x", true),
            ("mysql://app:pw@127.0.0.1:1/x", false),
            ("mariadb://app:pw@127.0.0.1:1/x", false),
        ],
    );
    backend(
        "redis",
        &[
            ("redis://:pw@127.0.0.1:notaport", true),
            ("redis://app:pw@[bad", true),
            ("redis://:pw/x@127.0.0.1:1", true),
            ("redis://app:pw@127.0.0.1:1/notadb", true),
            ("redis://:pw@127.0.0.1:1", false),
            ("redis+unix:///nonexistent/redis.sock?pass=pw", false),
            // Refused by the server, or without `redis-tls`, by this build.
            ("rediss://:pw@127.0.0.1:1", false),
        ],
    );
    backend(
        "cluster",
        &[
            ("redis+cluster://:pw@", false),
            ("redis+cluster://:pw@127.0.0.1:1,127.0.0.1:2", false),
            ("redis+cluster://:pw@127.0.0.1:notaport", false),
        ],
    );
    urls
}

/// What is wrong with a URL is the caller's configuration; a server that is not there is
/// an outage. Either way, within seconds.
async fn within<T>(url: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .unwrap_or_else(|_| panic!("{url}: no answer within 20 s"))
}

#[tokio::test]
async fn idem_connect_never_shows_a_password() {
    let mut found = Vec::new();
    for (url, expect) in bad_urls() {
        let err = within(url, idem::connect(url)).await.unwrap_err();
        found.extend(problems(url, &err, &expect));
    }
    assert_none(found);
}

#[tokio::test]
async fn the_stores_connect_never_shows_a_password() {
    let mut found = Vec::new();
    for (url, expect) in bad_urls() {
        let err = within(url, idem::stores::connect(url)).await.unwrap_err();
        found.extend(problems(url, &err, &expect));
    }
    assert_none(found);
}

/// Each store's own constructor from a URL, given the URLs of its scheme (and a few of
/// another's).
#[tokio::test]
async fn each_store_s_own_connect_never_shows_a_password() {
    #[allow(unused_mut)] // without a store feature, nothing is looked at
    let mut found = Vec::new();
    let of = |prefixes: &[&str]| {
        bad_urls()
            .into_iter()
            .map(|(url, _)| url)
            .filter(|url| prefixes.iter().any(|p| url.starts_with(p)) || !url.contains("://"))
            .collect::<Vec<_>>()
    };
    #[cfg(feature = "postgres")]
    for url in of(&["postgres", "postgresql", "mysql://"]) {
        let err = within(url, idem::stores::PostgresStore::connect(url))
            .await
            .unwrap_err();
        found.extend(problems(url, &err, &[]));
    }
    #[cfg(feature = "mysql")]
    for url in of(&["mysql", "mariadb", "postgres://"]) {
        let err = within(url, idem::stores::MySqlStore::connect(url))
            .await
            .unwrap_err();
        found.extend(problems(url, &err, &[]));
    }
    // A string without `scheme://` is a file path to SQLite, and shown as one.
    #[cfg(feature = "sqlite")]
    for url in of(&["postgres://", "redis://"])
        .into_iter()
        .filter(|url| url.contains("://"))
    {
        let err = within(url, idem::stores::SqliteStore::connect(url))
            .await
            .unwrap_err();
        found.extend(problems(url, &err, &[]));
    }
    #[cfg(feature = "redis")]
    for url in of(&["redis", "postgres://"]) {
        let err = within(url, idem::stores::RedisStore::open(url))
            .await
            .unwrap_err();
        found.extend(problems(url, &err, &[]));
    }
    #[cfg(feature = "redis-cluster")]
    for nodes in [
        vec!["redis://:pw@127.0.0.1:1", "redis://:pw@127.0.0.1:2"],
        vec!["redis://:pw@127.0.0.1:notaport"],
        vec!["app:pw@db"],
    ] {
        let url = nodes.join(",");
        let err = within(
            &url,
            idem::stores::RedisStore::builder()
                .connect_timeout(Duration::from_millis(500))
                .open_cluster(nodes.iter().copied()),
        )
        .await
        .unwrap_err();
        found.extend(problems(&url, &err, &[]));
    }
    let _ = of;
    assert_none(found);
}

/// A connect error through a Unix socket names the socket. A URL without a host connects
/// to a local socket when sqlx finds one in a default directory (`/var/run/postgresql`,
/// `/tmp`), else to localhost; the message is not made of sqlx's URL of such options, which
/// panics ("generated un-parseable URL: EmptyHost").
#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_postgres_socket_connect_error_is_an_error_not_a_panic() {
    for (url, names) in [
        // Names the socket's directory or localhost, whichever sqlx chose.
        ("postgres://app:pw@/x", "postgres"),
        ("postgres:///x?password=pw", "postgres"),
        (
            "postgres://app:pw@localhost/x?host=/nonexistent/socket-dir",
            "/nonexistent/socket-dir",
        ),
        (
            "postgres://app:pw@%2Fnonexistent%2Fsocket-dir/x",
            "/nonexistent/socket-dir",
        ),
    ] {
        let err = within(url, idem::stores::PostgresStore::connect(url))
            .await
            .unwrap_err();
        assert_none(problems(url, &err, &[names]));
    }
}
