//! End to end: disconnects, dropped connections, restarts, drain, store outages, and the
//! layer among other layers. Real servers on 127.0.0.1, real clients.

#[macro_use]
mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use axum::Router;
use idem_core::{Idem, InProgress};
use idem_http::{IdempotentClient, RetryPolicy};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// Notifies when dropped before it was disarmed: the server gave up on a request.
struct NotifyOnDrop(Option<Arc<Notify>>);

impl Drop for NotifyOnDrop {
    fn drop(&mut self) {
        if let Some(n) = self.0.take() {
            n.notify_one();
        }
    }
}

/// A client that sends a charge and disconnects while the handler runs: the charge still
/// completes, and the client's retry gets its response.
async fn a_disconnected_client_does_not_stop_the_charge(backend: Backend) {
    let Some((idem, _, _dir)) = idem_on(backend).await else {
        return;
    };
    let shop = Arc::new(Shop::default());
    let gate = shop.close_gate();
    let abandoned = Arc::new(Notify::new());
    let watch = abandoned.clone();
    let app = routes(shop.clone())
        .layer(
            open_layer(idem)
                .scope(unique_scope("disconnect"))
                .in_progress(InProgress::Wait),
        )
        .layer(axum::middleware::from_fn(
            move |req: Request, next: Next| {
                let guard = NotifyOnDrop(Some(watch.clone()));
                async move {
                    let res = next.run(req).await;
                    std::mem::forget(guard); // finished: nothing was abandoned
                    res
                }
            },
        ));
    let server = Server::start(app).await;

    let mut raw = TcpStream::connect(server.addr).await.unwrap();
    let request = format!(
        "POST /charge HTTP/1.1\r\nhost: test\r\nidempotency-key: k-1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{ORDER}",
        ORDER.len()
    );
    raw.write_all(request.as_bytes()).await.unwrap();
    within(shop.entered.notified()).await;
    drop(raw);
    // The server dropped the request's future: without a task of its own, the charge
    // would have been cancelled here.
    within(abandoned.notified()).await;
    assert_eq!(shop.charges(), 0);
    gate.add_permits(1);

    let res = post(&client(), &server.url("/charge"), Some("k-1"), ORDER).await;
    let (status, replayed, body) = parts(res).await;
    assert_eq!((status, replayed.as_deref()), (201, Some("true")));
    assert!(body.contains(r#""charge":1"#), "{body}");
    assert_eq!(shop.charges(), 1);
}

/// A proxy whose first connection is cut as soon as the response starts (so the server has
/// charged and stored), and that forwards every later connection whole.
async fn cutting_proxy(upstream: SocketAddr, connections: Arc<AtomicUsize>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut inbound, _) = listener.accept().await.unwrap();
            let mut outbound = TcpStream::connect(upstream).await.unwrap();
            if connections.fetch_add(1, Ordering::SeqCst) == 0 {
                tokio::spawn(async move {
                    let (mut from_client, to_client) = inbound.into_split();
                    let (mut from_server, mut to_server) = outbound.into_split();
                    let up = tokio::spawn(async move {
                        tokio::io::copy(&mut from_client, &mut to_server).await.ok();
                    });
                    let mut first_byte = [0u8; 1];
                    from_server.read_exact(&mut first_byte).await.ok();
                    up.abort();
                    drop(to_client);
                });
            } else {
                tokio::spawn(async move {
                    tokio::io::copy_bidirectional(&mut inbound, &mut outbound)
                        .await
                        .ok();
                });
            }
        }
    });
    addr
}

/// The client helper resends after the connection drops mid-response, with the same key:
/// one charge, and the retry gets it.
async fn the_client_retries_a_dropped_connection_with_the_same_key(backend: Backend) {
    let Some((idem, _, _dir)) = idem_on(backend).await else {
        return;
    };
    let shop = Arc::new(Shop::default());
    let app = routes(shop.clone()).layer(open_layer(idem).scope(unique_scope("cut")));
    let server = Server::start(app).await;
    let connections = Arc::new(AtomicUsize::new(0));
    let proxy = cutting_proxy(server.addr, connections.clone()).await;

    let client = IdempotentClient::new(reqwest::Client::new()).retry_policy(RetryPolicy {
        initial_backoff: Duration::from_millis(5),
        ..RetryPolicy::default()
    });
    let res = client
        .post(format!("http://{proxy}/charge"))
        .json(&serde_json::json!({"order_id": "o-1", "amount": 1000, "currency": "EUR"}))
        .send()
        .await
        .expect("the retry succeeds");
    let (status, replayed, body) = parts(res).await;
    assert_eq!((status, replayed.as_deref()), (201, Some("true")));
    assert!(body.contains(r#""charge":1"#), "{body}");
    assert_eq!(connections.load(Ordering::SeqCst), 2, "one cut, one retry");
    assert_eq!(shop.charges(), 1);
}

/// A replay after the server restarts on the same SQLite file returns the first response.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_survives_a_restart_on_the_same_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let scope = unique_scope("restart");
    let start = |shop: Arc<Shop>| {
        let (path, scope) = (path.clone(), scope.clone());
        async move {
            let store = idem_stores::SqliteStore::open(&path).await.unwrap();
            store.migrate().await.unwrap();
            let app = routes(shop).layer(open_layer(Idem::new(store)).scope(scope));
            Server::start(app).await
        }
    };
    let before = Arc::new(Shop::default());
    let server = start(before.clone()).await;
    let (status, replayed, first) =
        parts(post(&client(), &server.url("/charge"), Some("k-1"), ORDER).await).await;
    assert_eq!((status, replayed), (201, None));
    server.stop().await;

    let after = Arc::new(Shop::default());
    let server = start(after.clone()).await;
    let res = post(&client(), &server.url("/charge"), Some("k-1"), ORDER).await;
    assert_eq!(parts(res).await, (201, Some("true".into()), first));
    assert_eq!((before.charges(), after.charges()), (1, 0));
}

/// `drain()` waits for a running handler, and refuses new guarded requests meanwhile.
async fn drain_waits_for_running_handlers(backend: Backend) {
    let Some((idem, _, _dir)) = idem_on(backend).await else {
        return;
    };
    let shop = Arc::new(Shop::default());
    let gate = shop.close_gate();
    let layer = open_layer(idem).scope(unique_scope("drain"));
    let drain = layer.drain_handle();
    let server = Server::start(routes(shop.clone()).layer(layer)).await;
    let url = server.url("/charge");
    let first = tokio::spawn({
        let url = url.clone();
        async move { parts(post(&client(), &url, Some("k-1"), ORDER).await).await }
    });
    within(shop.entered.notified()).await;
    assert_eq!(drain.in_flight(), 1);

    let draining = drain.drain();
    tokio::pin!(draining);
    tokio::select! {
        biased;
        _ = &mut draining => panic!("drain finished while a handler still runs"),
        _ = std::future::ready(()) => {}
    }
    let refused = post(&client(), &url, Some("k-2"), ORDER).await;
    assert_eq!(refused.headers()["retry-after"], "1");
    let (status, kind, _) = problem_type(refused).await;
    assert_eq!(
        (status, kind.as_str()),
        (503, "urn:idem:problem:shutting-down")
    );

    gate.add_permits(1);
    within(draining).await;
    assert_eq!(drain.in_flight(), 0);
    assert_eq!(shop.charges(), 1);
    assert_eq!(within(first).await.unwrap().0, 201);
}

/// A store outage: 503, and the handler does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_outage_is_503_and_the_handler_does_not_run() {
    let shop = Arc::new(Shop::default());
    let app = routes(shop.clone()).layer(open_layer(Idem::new(DownStore)));
    let server = Server::start(app).await;
    let res = post(&client(), &server.url("/charge"), Some("k-1"), ORDER).await;
    assert_eq!(res.headers()["retry-after"], "1");
    let (status, kind, body) = problem_type(res).await;
    assert_eq!(
        (status, kind.as_str()),
        (503, "urn:idem:problem:store-unavailable")
    );
    assert!(
        !body["detail"].as_str().unwrap().contains("refused"),
        "store internals stay in the logs: {body}"
    );
    assert_eq!(shop.charges(), 0);
}

#[derive(Clone)]
struct User(String);

/// The layer as a `route_layer` among other tower layers: an authentication layer outside
/// it sets the principal, a concurrency limit wraps it all, and a route added after
/// `route_layer` is not guarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn composes_with_route_layer_and_other_layers() {
    use axum::routing::post as route_post;
    use tower::ServiceBuilder;

    let (idem, _, _dir) = idem_on(Backend::Sqlite).await.unwrap();
    let shop = Arc::new(Shop::default());
    let guarded_shop = shop.clone();
    let layer = open_layer(idem)
        .scope(unique_scope("compose"))
        .principal(|parts| parts.extensions.get::<User>().map(|u| u.0.clone()));
    let plain = routes(Arc::new(Shop::default()));
    let app: Router = Router::new()
        .merge(routes(guarded_shop))
        .route_layer(layer)
        .nest("/plain", plain)
        .route("/unguarded", route_post(|| async { "not guarded" }))
        .layer(
            ServiceBuilder::new()
                .layer(tower::limit::ConcurrencyLimitLayer::new(64))
                .layer(axum::middleware::from_fn(
                    |mut req: Request, next: Next| async move {
                        let user = req
                            .headers()
                            .get("x-user")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_owned);
                        if let Some(user) = user {
                            req.extensions_mut().insert(User(user));
                        }
                        next.run(req).await
                    },
                )),
        );
    let server = Server::start(app).await;
    let c = client();
    let send = |path: &str, user: &'static str| {
        c.post(server.url(path))
            .header("idempotency-key", "k")
            .header("x-user", user)
            .body(ORDER)
            .send()
    };
    let (_, r1, alice) = parts(send("/charge", "alice").await.unwrap()).await;
    let (_, r2, bob) = parts(send("/charge", "bob").await.unwrap()).await;
    let (_, r3, alice_again) = parts(send("/charge", "alice").await.unwrap()).await;
    assert_eq!((r1, r2, r3.as_deref()), (None, None, Some("true")));
    assert_ne!(alice, bob);
    assert_eq!(alice, alice_again);
    assert_eq!(shop.charges(), 2);
    for _ in 0..2 {
        let (status, replayed, _) = parts(send("/plain/charge", "alice").await.unwrap()).await;
        assert_eq!(
            (status, replayed),
            (201, None),
            "routes nested after route_layer are not guarded"
        );
    }
    let (status, replayed, _) = parts(send("/unguarded", "alice").await.unwrap()).await;
    assert_eq!((status, replayed), (200, None));
}

per_backend!(
    a_disconnected_client_does_not_stop_the_charge,
    the_client_retries_a_dropped_connection_with_the_same_key,
    drain_waits_for_running_handlers,
);
