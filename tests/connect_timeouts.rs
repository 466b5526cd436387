//! `idem::connect` to a server that is not there fails within seconds, and says why: the
//! client's "connection refused" is in the error's source chain, not lost in a pool timeout.
#![cfg(any(feature = "postgres", feature = "redis"))]

use std::time::{Duration, Instant};

/// "Within a few seconds": the stores' connect timeouts are 3 s, and a refusal is at once.
const BOUND: Duration = Duration::from_secs(5);

fn chain(err: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut out = vec![err.to_string()];
    let mut cur = err.source();
    while let Some(e) = cur {
        out.push(e.to_string());
        cur = e.source();
    }
    out
}

async fn refused(url: &str) {
    let started = Instant::now();
    let err = idem::connect(url).await.unwrap_err();
    let took = started.elapsed();
    let chain = chain(&err);
    eprintln!("{url}: {took:?}: {chain:?}");
    assert!(matches!(err, idem::Error::Connect { .. }), "{err:?}");
    assert!(took < BOUND, "{url}: took {took:?}");
    assert!(
        chain
            .iter()
            .any(|m| m.to_lowercase().contains("connection refused")),
        "{url}: the cause is not in the source chain: {chain:?}"
    );
}

// Port 1 on loopback: nothing listens there, so the kernel refuses at once.

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_that_is_not_there_is_refused_within_seconds() {
    refused("postgres://postgres@127.0.0.1:1/test").await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_that_is_not_there_is_refused_within_seconds() {
    refused("redis://127.0.0.1:1").await;
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_that_cannot_be_opened_says_why() {
    let dir = std::env::temp_dir().join("idem-no-such-dir-for-connect-test");
    let url = format!("sqlite://{}/sub/idem.db", dir.display());
    let started = Instant::now();
    let err = idem::connect(&url).await.unwrap_err();
    assert!(started.elapsed() < BOUND);
    let chain = chain(&err);
    eprintln!("{url}: {chain:?}");
    assert!(
        chain.len() >= 2,
        "the sqlite error is the source: {chain:?}"
    );
    assert!(
        chain.iter().any(|m| m.contains("unable to open")),
        "{chain:?}"
    );
}
