//! `idem::connect` to a server that is not there fails within seconds, and says why: the
//! client's "connection refused" is in the error's source chain, not lost in a pool timeout.
#![cfg(any(
    feature = "postgres",
    feature = "redis",
    feature = "sqlite",
    feature = "mysql"
))]

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

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_that_is_not_there_is_refused_within_seconds() {
    refused("mysql://root@127.0.0.1:1/test").await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_that_is_not_there_is_refused_within_seconds() {
    refused("redis://127.0.0.1:1").await;
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_in_a_missing_directory_names_the_path_and_the_cause() {
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
    // SQLite's own message names neither: ours names the file, the directory that is
    // missing, and what idem creates.
    let message = err.to_string();
    let missing = dir.join("sub");
    assert!(
        message.contains(&format!("{}/sub/idem.db", dir.display())),
        "{message}"
    );
    assert!(
        message.contains(&format!("directory `{}` does not exist", missing.display())),
        "{message}"
    );
    assert!(
        message.contains("creates the database file, not its directories"),
        "{message}"
    );
    assert!(!missing.exists(), "idem created the directory");
}

/// idem creates the database file when it is missing (and the table in it).
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_creates_a_missing_file_in_an_existing_directory() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("new.db");
    idem::connect(&format!("sqlite://{}", file.display()))
        .await
        .unwrap();
    assert!(file.exists());
}
