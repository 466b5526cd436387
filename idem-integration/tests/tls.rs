//! TLS to the stores: `sslmode=require` on the local Postgres and `rediss://` on a Redis of
//! this test's own with a self-signed certificate (features `postgres-tls`, `redis-tls`);
//! and, with those features off, an error naming the feature. CI runs this file twice: with
//! `--all-features`, and with `--features postgres,redis` for the errors.

use idem::{Fingerprint, Idem, Key};

/// The URL of a backend's test server: unset, the test is skipped (and counted in the
/// binary's exit summary), or fails under `IDEM_REQUIRE_BACKENDS=1`.
use idem_core::testing::backend_url;

/// `url` with `param` added to its query.
#[allow(dead_code)]
fn with_param(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

/// One call stored and replayed through `idem`.
#[allow(dead_code)]
async fn call_and_replay(idem: &Idem, scope: &str) {
    let id = format!("{}-{:?}", std::process::id(), std::time::SystemTime::now());
    let key = Key::new(scope, id).unwrap();
    let first = idem
        .call(key.clone(), Fingerprint::NONE)
        .with_outcome()
        .run(|| async { 42u32 })
        .await
        .unwrap();
    let again = idem
        .call(key.clone(), Fingerprint::NONE)
        .with_outcome()
        .run(|| async { 0u32 })
        .await
        .unwrap();
    assert_eq!((first.origin(), *first.value()), (idem::Origin::Ran, 42));
    assert_eq!((again.origin(), *again.value()), (idem::Origin::Store, 42));
    idem.forget(&key).await.unwrap();
}

#[cfg(feature = "postgres-tls")]
#[tokio::test]
async fn postgres_over_tls_with_sslmode_require() {
    let Some(url) = backend_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let url = with_param(&url, "sslmode=require");
    let store = idem::stores::PostgresStore::builder()
        .table("idem_ops_tls")
        .connect(&url)
        .await
        .unwrap();
    // The server's own word that this session is encrypted.
    let ssl: bool = sqlx_scalar(&store).await;
    assert!(ssl, "the session is not encrypted");
    let idem = Idem::new(store);
    call_and_replay(&idem, "ops-tls-pg").await;
}

#[cfg(feature = "postgres-tls")]
async fn sqlx_scalar(store: &idem::stores::PostgresStore) -> bool {
    sqlx::query_scalar("select ssl from pg_stat_ssl where pid = pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

#[cfg(all(feature = "postgres", not(feature = "postgres-tls")))]
#[tokio::test]
async fn sslmode_require_without_postgres_tls_names_the_feature() {
    for url in [
        "postgres://postgres:secret@127.0.0.1/test?sslmode=require",
        "postgresql://postgres@127.0.0.1/test?sslmode=verify-full",
    ] {
        let err = idem::connect(url).await.unwrap_err().to_string();
        assert!(err.contains("cargo feature `postgres-tls`"), "{err}");
        assert!(!err.contains("secret"), "the password is shown: {err}");
        let err = idem::stores::PostgresStore::connect(url)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("cargo feature `postgres-tls`"), "{err}");
        assert!(!err.contains("secret"), "the password is shown: {err}");
    }
}

#[cfg(all(feature = "redis", not(feature = "redis-tls")))]
#[tokio::test]
async fn rediss_without_redis_tls_names_the_feature() {
    let err = idem::connect("rediss://:secret@127.0.0.1:6380")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("cargo feature `redis-tls`"), "{err}");
    assert!(!err.contains("secret"), "the password is shown: {err}");
    let err = idem::stores::RedisStore::open("rediss://127.0.0.1:6380")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("cargo feature `redis-tls`"), "{err}");
}

#[cfg(feature = "redis-tls")]
mod redis_tls {
    use std::net::TcpStream;
    use std::path::Path;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    /// A redis-server of this test's own; stopped (by its pid) when dropped.
    struct Server(Child);

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn openssl(dir: &Path, args: &[&str]) -> bool {
        Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// A CA of its own (`ca.pem`) and a server certificate for 127.0.0.1 it signed
    /// (`cert.pem`, `key.pem`): rustls refuses a self-signed CA certificate as the server's.
    fn certificates(dir: &Path) -> bool {
        std::fs::write(
            dir.join("ext.cnf"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=idem-test-ca",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
            ],
        ) && openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                "/CN=127.0.0.1",
                "-keyout",
                "key.pem",
                "-out",
                "req.csr",
            ],
        ) && openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "req.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "1",
                "-extfile",
                "ext.cnf",
                "-out",
                "cert.pem",
            ],
        )
    }

    fn spare_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// Starts redis-server with only a TLS port; `None` (with the reason printed) when the
    /// installed server or openssl cannot do that.
    fn start(dir: &Path) -> Option<(Server, u16)> {
        if !certificates(dir) {
            idem_core::testing::skip("openssl could not make the test certificates");
            return None;
        }
        let port = spare_port();
        let child = Command::new("redis-server")
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .arg("--tls-cert-file")
            .arg(dir.join("cert.pem"))
            .arg("--tls-key-file")
            .arg(dir.join("key.pem"))
            .args([
                "--tls-auth-clients",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn();
        let Ok(child) = child else {
            idem_core::testing::skip("redis-server is not installed");
            return None;
        };
        let mut server = Server(child);
        // Readiness, not an assertion: the port answers once the server listens.
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = server.0.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = server.0.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                idem_core::testing::skip(&format!(
                    "this redis-server does not support --tls-port ({status}): {err}"
                ));
                return None;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not listen within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some((server, port))
    }

    #[test]
    fn rediss_url_to_a_tls_only_server() {
        let dir = tempfile::tempdir().unwrap();
        let Some((_server, port)) = start(dir.path()) else {
            return;
        };
        // The redis client trusts the system's roots, and `SSL_CERT_FILE` names them: here
        // the test's own CA. Nothing else in this binary reads it.
        std::env::set_var("SSL_CERT_FILE", dir.path().join("ca.pem"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            // Plain text to the TLS port is refused: the server speaks only TLS.
            let plain = idem::stores::RedisStore::builder()
                .connect_timeout(Duration::from_millis(500))
                .open(&format!("redis://127.0.0.1:{port}"))
                .await;
            assert!(
                plain.is_err(),
                "a plain-text client reached the TLS-only port"
            );
            let idem = idem::connect(&format!("rediss://127.0.0.1:{port}"))
                .await
                .unwrap();
            super::call_and_replay(&idem, "ops-tls-redis").await;
        });
    }
}
