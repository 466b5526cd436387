//! A TCP proxy on 127.0.0.1 between a store and its server, for outage tests: it passes
//! bytes through, black-holes them (accepts and keeps every socket open but forwards
//! nothing, as a server or a network that stopped answering does), or cuts every
//! connection (as a restarted server or a dropped link does). It can also pass requests on
//! but drop the server's replies (the server acts, the client never hears of it), or
//! delay every reply.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A proxy listening on 127.0.0.1 (a port of its own) in front of `upstream`.
pub struct TcpProxy {
    port: u16,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

struct Shared {
    upstream: SocketAddr,
    black_hole: AtomicBool,
    /// Requests still reach the server; its replies are swallowed.
    drop_replies: AtomicBool,
    /// Milliseconds each reply is held before it is forwarded.
    reply_delay_ms: AtomicU64,
    /// Bumped by `cut`: every connection open at that moment closes.
    cut: watch::Sender<u64>,
    accepted: AtomicU32,
}

impl std::fmt::Debug for TcpProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpProxy")
            .field("port", &self.port)
            .finish()
    }
}

impl TcpProxy {
    /// Starts passing connections through to `upstream`, which must be on loopback: these
    /// tests keep every server's traffic on this machine.
    pub async fn start(upstream: SocketAddr) -> TcpProxy {
        assert!(
            upstream.ip().is_loopback(),
            "the proxy only forwards to loopback"
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            upstream,
            black_hole: AtomicBool::new(false),
            drop_replies: AtomicBool::new(false),
            reply_delay_ms: AtomicU64::new(0),
            cut: watch::channel(0).0,
            accepted: AtomicU32::new(0),
        });
        let accept = tokio::spawn({
            let shared = shared.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    shared.accepted.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(serve(client, shared.clone()));
                }
            }
        });
        TcpProxy {
            port,
            shared,
            accept,
        }
    }

    /// The port to connect to instead of the server's.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// From now on nothing is forwarded, either way, on any connection: open ones stay open
    /// and swallow what they are sent; new ones are accepted and swallow too.
    pub fn black_hole(&self) {
        self.shared.black_hole.store(true, Ordering::SeqCst);
    }

    /// [`black_hole`](Self::black_hole) as a closure of its own, for a body that must be
    /// `'static` (a spawned call's).
    pub fn black_hole_switch(&self) -> impl Fn() + Send + Sync + 'static {
        let shared = self.shared.clone();
        move || shared.black_hole.store(true, Ordering::SeqCst)
    }

    /// New connections pass through again. Connections that were black-holed stay so (bytes
    /// they swallowed are gone, so their protocol streams cannot resume): cut them.
    pub fn pass(&self) {
        self.shared.black_hole.store(false, Ordering::SeqCst);
    }

    /// From now on the server's replies are swallowed, on every connection, while requests
    /// still reach it: a step takes effect but its caller never hears the answer. A
    /// connection that lost a reply never forwards one again (its stream is out of step):
    /// cut it once [`pass`](Self::pass) is back.
    pub fn drop_replies(&self) {
        self.shared.drop_replies.store(true, Ordering::SeqCst);
    }

    /// [`drop_replies`](Self::drop_replies) as a closure of its own.
    pub fn drop_replies_switch(&self) -> impl Fn() + Send + Sync + 'static {
        let shared = self.shared.clone();
        move || shared.drop_replies.store(true, Ordering::SeqCst)
    }

    /// Holds every reply for `delay` before forwarding it (zero: no delay).
    pub fn delay_replies(&self, delay: Duration) {
        self.shared
            .reply_delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    /// Ends every fault: no black hole, no dropped or delayed replies (for new
    /// connections and bytes; cut the old connections that lost bytes).
    pub fn heal(&self) {
        self.shared.black_hole.store(false, Ordering::SeqCst);
        self.shared.drop_replies.store(false, Ordering::SeqCst);
        self.shared.reply_delay_ms.store(0, Ordering::SeqCst);
    }

    /// Closes every connection open now, both ways.
    pub fn cut(&self) {
        self.shared.cut.send_modify(|n| *n += 1);
    }

    /// How many connections the proxy accepted so far.
    pub fn accepted(&self) -> u32 {
        self.shared.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

async fn serve(client: TcpStream, shared: Arc<Shared>) {
    let mut cut = shared.cut.subscribe();
    // Set once the connection has seen the black hole; it never forwards again.
    let held = AtomicBool::new(shared.black_hole.load(Ordering::SeqCst));
    let (client_read, client_write) = client.into_split();
    if held.load(Ordering::SeqCst) {
        // Accepted while black-holed: no server behind it, and nothing ever answers.
        tokio::select! {
            _ = swallow(client_read) => {}
            _ = cut.changed() => {}
        }
        drop(client_write);
        return;
    }
    let Ok(server) = TcpStream::connect(shared.upstream).await else {
        return;
    };
    let (server_read, server_write) = server.into_split();
    let replies_lost = AtomicBool::new(false);
    tokio::select! {
        _ = pump(client_read, server_write, &shared, &held, None) => {}
        _ = pump(server_read, client_write, &shared, &held, Some(&replies_lost)) => {}
        _ = cut.changed() => {}
    }
    // Returning drops all four halves: both sockets close.
}

/// Forwards `from` to `to` until either ends, or swallows once the black hole is on.
/// `replies_lost` is given for the server-to-client direction: set once a reply was
/// dropped, after which this direction forwards nothing.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    shared: &Shared,
    held: &AtomicBool,
    replies_lost: Option<&AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                if held.load(Ordering::SeqCst) {
                    // A black hole does not tell the other side that this one left.
                    std::future::pending::<()>().await;
                }
                return;
            }
            Ok(n) => n,
        };
        if shared.black_hole.load(Ordering::SeqCst) {
            held.store(true, Ordering::SeqCst);
        }
        if held.load(Ordering::SeqCst) {
            continue;
        }
        if let Some(lost) = replies_lost {
            if shared.drop_replies.load(Ordering::SeqCst) {
                lost.store(true, Ordering::SeqCst);
            }
            if lost.load(Ordering::SeqCst) {
                continue;
            }
            let delay = shared.reply_delay_ms.load(Ordering::SeqCst);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Reads and drops everything until the peer closes, then keeps the socket open.
async fn swallow(mut from: OwnedReadHalf) {
    let mut buf = vec![0u8; 16 * 1024];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
    std::future::pending::<()>().await;
}
