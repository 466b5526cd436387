//! Memory stays bounded: a 64 MiB response and a stream that never
//! ends pass through the layer without being buffered whole, and a retry of either gets a
//! problem response at once (never a second run, never a 409 for a lease kept alive by the
//! stream). Its own test binary, with one test, so that the process's peak memory is this
//! test's alone.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::header::CONTENT_TYPE;
use axum::response::Response;
use axum::routing::post as route_post;
use axum::Router;
use bytes::Bytes;
use support::*;

/// The process's peak resident memory (`VmHWM`), in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("a number of kB");
    kib * 1024
}

const MIB: usize = 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_and_endless_responses_pass_through_without_buffering() {
    let (idem, _, _dir) = idem_on(Backend::Sqlite).await.expect("sqlite");
    let runs = Arc::new(AtomicUsize::new(0));
    let (big, endless, events) = (runs.clone(), runs.clone(), runs.clone());
    let app = Router::new()
        .route(
            "/export",
            route_post(move || {
                big.fetch_add(1, Ordering::SeqCst);
                // 64 chunks of a MiB each, each allocated when it is sent: a layer that
                // kept them would hold 64 MiB.
                let chunks = (0..64).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; MIB])));
                async move { Response::new(Body::from_stream(futures_util::stream::iter(chunks))) }
            }),
        )
        .route(
            "/firehose",
            route_post(move || {
                endless.fetch_add(1, Ordering::SeqCst);
                let chunk = Bytes::from(vec![b'y'; 64 * 1024]);
                let forever = futures_util::stream::repeat_with(move || {
                    Ok::<_, std::io::Error>(chunk.clone())
                });
                async move { Response::new(Body::from_stream(forever)) }
            }),
        )
        .route(
            "/events",
            route_post(move || {
                events.fetch_add(1, Ordering::SeqCst);
                let ticks = futures_util::stream::unfold(0u64, |n| async move {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    Some((
                        Ok::<_, std::io::Error>(Bytes::from(format!("data: {n}\n\n"))),
                        n + 1,
                    ))
                });
                async move {
                    Response::builder()
                        .header(CONTENT_TYPE, "text/event-stream")
                        .body(Body::from_stream(ticks))
                        .unwrap()
                }
            }),
        )
        .layer(open_layer(idem).scope(unique_scope("memory")));
    let server = Server::start(app).await;
    let c = client();

    // A 64 MiB response reaches its client whole; the process never holds it.
    let before = peak_rss();
    let mut res = post(&c, &server.url("/export"), Some("big"), ORDER).await;
    assert_eq!(res.status(), 200);
    assert!(
        res.headers().get("idempotency-key-expires").is_some(),
        "a record was created for it"
    );
    let mut received = 0usize;
    while let Some(chunk) = within(res.chunk()).await.expect("chunk") {
        received += chunk.len();
    }
    assert_eq!(received, 64 * MIB);
    let grew = peak_rss().saturating_sub(before);
    eprintln!(
        "memory: the peak grew {} KiB for a 64 MiB response",
        grew / 1024
    );
    assert!(
        grew < 32 * MIB as u64,
        "the peak memory grew {} MiB for a 64 MiB response",
        grew / MIB as u64
    );
    let (status, kind, _) =
        problem_type(post(&c, &server.url("/export"), Some("big"), ORDER).await).await;
    assert_eq!(
        (status, kind.as_str()),
        (500, "urn:idem:problem:response-not-stored")
    );

    // A stream that never ends: its client reads 8 MiB and leaves; a retry is answered at
    // once, not 409 behind a lease the stream keeps alive.
    let mut res = post(&c, &server.url("/firehose"), Some("hose"), ORDER).await;
    let mut received = 0usize;
    while received < 8 * MIB {
        received += within(res.chunk())
            .await
            .expect("chunk")
            .expect("endless")
            .len();
    }
    drop(res);
    let (status, kind, _) =
        problem_type(post(&c, &server.url("/firehose"), Some("hose"), ORDER).await).await;
    assert_eq!(
        (status, kind.as_str()),
        (500, "urn:idem:problem:response-not-stored")
    );

    // An event stream passes through from its first event; a retry while it still runs
    // gets the problem, not a second stream.
    let mut res = post(&c, &server.url("/events"), Some("ev"), ORDER).await;
    let first = within(res.chunk()).await.expect("chunk").expect("an event");
    assert!(first.starts_with(b"data: 0"), "{first:?}");
    let res2 = post(&c, &server.url("/events"), Some("ev"), ORDER).await;
    assert_eq!(res2.headers()["idempotent-replayed"], "true");
    let (status, kind, _) = problem_type(res2).await;
    assert_eq!(
        (status, kind.as_str()),
        (500, "urn:idem:problem:response-not-stored")
    );
    let next = within(res.chunk())
        .await
        .expect("chunk")
        .expect("the stream goes on");
    assert!(next.starts_with(b"data: "), "{next:?}");
    drop(res);

    assert_eq!(runs.load(Ordering::SeqCst), 3, "each ran once");
}
