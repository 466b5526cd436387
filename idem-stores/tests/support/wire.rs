//! Round trips counted on the wire: a TCP proxy between a SQL store's pool and its server
//! that logs each request the client made and waited for, read from the protocol itself
//! (Postgres messages, MySQL command packets), and the checks of the contract's 2 round
//! trips for a first call and 1 for a replay, written once for both.
// Each test crate that includes this module reads one of the protocols.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{Fingerprint, Idem, Key};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One request the client made and waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exchange {
    /// A prepared statement ran (Postgres Bind/Execute ... Sync, MySQL COM_STMT_EXECUTE).
    Statement,
    /// sqlx preparing a statement (Parse/Describe ... Sync, COM_STMT_PREPARE).
    Prepare,
    /// sqlx's connection check (a bare Sync, COM_PING).
    Ping,
    /// A plain-text query (Postgres simple protocol, COM_QUERY).
    Simple,
    /// Another MySQL command that waits for an answer.
    Other(u8),
}

/// Which protocol the proxy reads.
#[derive(Debug, Clone, Copy)]
pub enum Protocol {
    Postgres,
    MySql,
}

impl Protocol {
    /// The statements of a first call on a fresh key. Both dialects read before they
    /// claim (a replay is then a plain indexed read), so a first call is read, claim,
    /// complete.
    pub fn first_call_statements(self) -> usize {
        match self {
            Protocol::Postgres | Protocol::MySql => 3,
        }
    }
}

/// A TCP proxy to the server that logs the client's exchanges.
pub struct Proxy {
    pub port: u16,
    log: Arc<Mutex<Vec<Exchange>>>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr, protocol: Protocol) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let log = Arc::new(Mutex::new(Vec::new()));
        let shared = log.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(upstream).await.unwrap();
                let log = shared.clone();
                tokio::spawn(async move {
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut sr, &mut cw).await;
                    });
                    let _ = match protocol {
                        Protocol::Postgres => postgres_client(&mut cr, &mut sw, &log).await,
                        Protocol::MySql => mysql_client(&mut cr, &mut sw, &log).await,
                    };
                });
            }
        });
        Proxy { port, log }
    }

    /// A proxy to the server of `url`, and the URL that reaches the server through it.
    pub async fn to_server_of(url: &str, protocol: Protocol) -> (Proxy, String) {
        let (_, rest) = url.split_once("://").unwrap();
        let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
        let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
        let default_port = match protocol {
            Protocol::Postgres => 5432,
            Protocol::MySql => 3306,
        };
        let authority = if authority.contains(':') {
            authority.to_owned()
        } else {
            format!("{authority}:{default_port}")
        };
        let upstream = tokio::net::lookup_host(authority)
            .await
            .unwrap()
            .next()
            .unwrap();
        let proxy = Proxy::start(upstream, protocol).await;
        let no_tls = match protocol {
            Protocol::Postgres => "sslmode=disable",
            Protocol::MySql => "ssl-mode=disabled",
        };
        let through = through(url, proxy.port, no_tls);
        (proxy, through)
    }

    pub fn take(&self) -> Vec<Exchange> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

/// Forwards a Postgres client's bytes message by message, logging each exchange as it ends.
async fn postgres_client(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    log: &Mutex<Vec<Exchange>>,
) -> std::io::Result<()> {
    // Startup: untyped messages (length, then body) until one that is not an SSL or GSS
    // encryption request.
    loop {
        let len = from.read_u32().await?;
        let mut body = vec![0; len as usize - 4];
        from.read_exact(&mut body).await?;
        to.write_u32(len).await?;
        to.write_all(&body).await?;
        let code = u32::from_be_bytes(body[..4].try_into().unwrap());
        if code != 80877103 && code != 80877104 {
            break;
        }
    }
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let kind = from.read_u8().await?;
        let len = from.read_u32().await?;
        let mut body = vec![0; len as usize - 4];
        from.read_exact(&mut body).await?;
        match kind {
            b'S' => {
                let e = if pending.contains(&b'E') {
                    Exchange::Statement
                } else if pending.contains(&b'P') {
                    Exchange::Prepare
                } else {
                    Exchange::Ping
                };
                log.lock().unwrap().push(e);
                pending.clear();
            }
            b'Q' => log.lock().unwrap().push(Exchange::Simple),
            other => pending.push(other),
        }
        to.write_u8(kind).await?;
        to.write_u32(len).await?;
        to.write_all(&body).await?;
    }
}

/// Forwards a MySQL client's packets, logging each command: a packet with sequence number
/// 0 (the handshake response and authentication packets have others).
async fn mysql_client(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    log: &Mutex<Vec<Exchange>>,
) -> std::io::Result<()> {
    loop {
        let mut header = [0u8; 4];
        from.read_exact(&mut header).await?;
        let len = u32::from_le_bytes([header[0], header[1], header[2], 0]) as usize;
        let mut body = vec![0; len];
        from.read_exact(&mut body).await?;
        if header[3] == 0 && !body.is_empty() {
            let e = match body[0] {
                0x17 => Some(Exchange::Statement),
                0x16 => Some(Exchange::Prepare),
                0x0e => Some(Exchange::Ping),
                0x03 => Some(Exchange::Simple),
                // COM_STMT_CLOSE and COM_QUIT get no answer: no round trip.
                0x19 | 0x01 => None,
                other => Some(Exchange::Other(other)),
            };
            if let Some(e) = e {
                log.lock().unwrap().push(e);
            }
        }
        to.write_all(&header).await?;
        to.write_all(&body).await?;
    }
}

/// The test server's URL with the proxy's address instead of the server's, and `no_tls`
/// (the URL parameter that turns TLS off) so that the proxy can read the protocol.
pub fn through(url: &str, port: u16, no_tls: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (user, rest) = match rest.split_once('@') {
        Some((user, rest)) => (format!("{user}@"), rest),
        None => (String::new(), rest),
    };
    let path = rest.find(['/', '?']).map_or("", |at| &rest[at..]);
    let sep = if path.contains('?') { '&' } else { '?' };
    format!("{scheme}://{user}127.0.0.1:{port}{path}{sep}{no_tls}")
}

/// Waits until every connection is back in the pool, which sqlx does only after its check
/// of the connection has answered: then every exchange so far is in the proxy's log.
pub async fn settle<DB: sqlx::Database>(pool: &sqlx::Pool<DB>) {
    for _ in 0..500 {
        if pool.num_idle() == pool.size() as usize {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
}

pub fn count(log: &[Exchange], e: Exchange) -> usize {
    log.iter().filter(|x| **x == e).count()
}

/// The exchanges of one call of `id` through `idem`, whose store runs on `pool`.
pub async fn exchanges<DB: sqlx::Database>(
    proxy: &Proxy,
    idem: &Idem,
    pool: &sqlx::Pool<DB>,
    id: &'static str,
) -> Vec<Exchange> {
    settle(pool).await;
    proxy.take();
    let key = Key::new("round-trips", id).unwrap();
    let v: String = idem
        .call(key, Fingerprint::NONE)
        .run(|| async {
            // Lets the pool's background check of the claim's connection pass first.
            tokio::time::sleep(Duration::from_millis(50)).await;
            id.to_string()
        })
        .await
        .unwrap();
    assert_eq!(v, id);
    settle(pool).await;
    proxy.take()
}

/// A first call of a new key costs 2 statements (claim, complete), its replay 1 (claim),
/// and neither waits for a connection check before its statement.
pub async fn assert_first_call_and_replay<DB: sqlx::Database>(
    proxy: &Proxy,
    protocol: Protocol,
    idem: &Idem,
    pool: &sqlx::Pool<DB>,
    id: &'static str,
    what: &str,
) {
    let first = exchanges(proxy, idem, pool, id).await;
    let replay = exchanges(proxy, idem, pool, id).await;
    eprintln!("{what}: first call {first:?}, replay {replay:?}");
    assert_eq!(
        count(&first, Exchange::Statement),
        protocol.first_call_statements(),
        "{what}: a first call is (read,) claim, complete: {first:?}"
    );
    assert_eq!(
        count(&replay, Exchange::Statement),
        1,
        "{what}: a replay is one statement: {replay:?}"
    );
    for log in [&first, &replay] {
        // sqlx checks a connection when it goes back to the pool, after the caller has its
        // answer; with test_before_acquire off, no check comes before a statement. (A
        // connection the pool opens on the way may set its session up first.)
        assert_ne!(
            log.first(),
            Some(&Exchange::Ping),
            "{what}: a ping before the statement: {log:?}"
        );
    }
}

/// On one warm connection: exactly one exchange per step on the caller's path, then the
/// pool's check on release.
pub async fn assert_one_exchange_per_step<DB: sqlx::Database>(
    proxy: &Proxy,
    protocol: Protocol,
    idem: &Idem,
    pool: &sqlx::Pool<DB>,
) {
    exchanges(proxy, idem, pool, "warm").await;
    exchanges(proxy, idem, pool, "warm").await;
    let first = exchanges(proxy, idem, pool, "one").await;
    let replay = exchanges(proxy, idem, pool, "one").await;
    eprintln!("one warm connection: first call {first:?}, replay {replay:?}");
    use Exchange::{Ping, Statement};
    let steps = protocol.first_call_statements();
    assert_eq!(
        first,
        [Statement, Ping].repeat(steps),
        "first call: (read,) claim, complete"
    );
    assert_eq!(replay, [Statement, Ping], "replay: one statement");
}
