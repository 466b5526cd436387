//! End to end: a real axum server on 127.0.0.1, a real HTTP client, the layer on each
//! store (SQLite always; Postgres and Redis when configured, as the store tests).

#[macro_use]
mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use idem_core::InProgress;
use idem_http::IdempotencyLayer;
use support::*;

fn layer(idem: &idem_core::Idem, test: &str) -> IdempotencyLayer {
    open_layer(idem.clone()).scope(unique_scope(test))
}

async fn setup(
    backend: Backend,
    test: &str,
    configure: impl FnOnce(IdempotencyLayer) -> IdempotencyLayer,
) -> Option<(Server, Arc<Shop>, Arc<Watched>, Option<tempfile::TempDir>)> {
    let (idem, watched, dir) = idem_on(backend).await?;
    let shop = Arc::new(Shop::default());
    let app = routes(shop.clone()).layer(configure(layer(&idem, test)));
    Some((Server::start(app).await, shop, watched, dir))
}

/// A first request runs the handler and gets all its headers; the retry gets the stored
/// status, stored headers and body, marked replayed, and the handler does not run again.
async fn first_then_replay(backend: Backend) {
    let Some((server, shop, _, _dir)) = setup(backend, "replay", |l| l).await else {
        return;
    };
    let c = client();
    let first = post(&c, &server.url("/charge"), Some("k-1"), ORDER).await;
    assert_eq!(
        first.headers()["x-first-only"],
        "1",
        "the first response keeps every header"
    );
    let (status, replayed, body) = parts(first).await;
    assert_eq!((status, replayed), (201, None));
    let again = post(&c, &server.url("/charge"), Some("k-1"), ORDER).await;
    assert_eq!(again.headers()["content-type"], "application/json");
    assert_eq!(again.headers()["location"], "/charges/1");
    assert!(
        again.headers().get("x-first-only").is_none(),
        "an unlisted header is not stored"
    );
    assert_eq!(parts(again).await, (201, Some("true".into()), body));
    assert_eq!(shop.charges(), 1);
}

/// 400 without a key, and for every malformed key; 255 characters is still a key.
async fn bad_keys(backend: Backend) {
    let Some((server, shop, _, _dir)) = setup(backend, "badkeys", |l| l).await else {
        return;
    };
    let c = client();
    let url = server.url("/charge");
    let (status, kind, _) = problem_type(post(&c, &url, None, ORDER).await).await;
    assert_eq!(
        (status, kind.as_str()),
        (400, "urn:idem:problem:idempotency-key-missing")
    );

    let long = "k".repeat(256);
    let (status, kind, body) = problem_type(post(&c, &url, Some(&long), ORDER).await).await;
    assert_eq!(
        (status, kind.as_str()),
        (400, "urn:idem:problem:idempotency-key-invalid")
    );
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("256 characters long"),
        "{body}"
    );

    let (status, kind, _) = problem_type(post(&c, &url, Some("\"\""), ORDER).await).await;
    assert_eq!(
        (status, kind.as_str()),
        (400, "urn:idem:problem:idempotency-key-invalid")
    );

    use reqwest::header::HeaderValue;
    // A key that is not text, and a key sent twice: each a 400 saying which.
    for (keys, detail) in [
        (
            vec![HeaderValue::from_bytes(b"k\xe9y").unwrap()],
            "not a valid header value",
        ),
        (
            vec![HeaderValue::from_static("a"), HeaderValue::from_static("b")],
            "more than one",
        ),
    ] {
        let mut req = c.post(&url).body(ORDER);
        for k in keys {
            req = req.header("idempotency-key", k);
        }
        let (status, _, body) = problem_type(req.send().await.unwrap()).await;
        assert_eq!(status, 400);
        assert!(body["detail"].as_str().unwrap().contains(detail), "{body}");
    }
    assert_eq!(
        shop.charges(),
        0,
        "no malformed request reached the handler"
    );

    let longest = "k".repeat(255);
    assert_eq!(
        parts(post(&c, &url, Some(&longest), ORDER).await).await.0,
        201
    );
    // A structured-field string is the same key as its bare token.
    let (status, replayed, _) =
        parts(post(&c, &url, Some(&format!("\"{longest}\"")), ORDER).await).await;
    assert_eq!((status, replayed.as_deref()), (201, Some("true")));
    assert_eq!(shop.charges(), 1);
}

/// The same key with another body or on another path: 422, and nothing runs.
async fn key_reuse(backend: Backend) {
    let Some((server, shop, _, _dir)) = setup(backend, "reuse", |l| l).await else {
        return;
    };
    let c = client();
    assert_eq!(
        parts(post(&c, &server.url("/charge"), Some("k-1"), ORDER).await)
            .await
            .0,
        201
    );
    let other = ORDER.replace("1000", "2500");
    let (status, kind, body) =
        problem_type(post(&c, &server.url("/charge"), Some("k-1"), &other).await).await;
    assert_eq!((status, kind.as_str()), (422, "urn:idem:problem:key-reuse"));
    assert!(
        body["detail"].as_str().unwrap().contains("`k-1`"),
        "names the key: {body}"
    );
    let (status, kind, _) =
        problem_type(post(&c, &server.url("/decline"), Some("k-1"), ORDER).await).await;
    assert_eq!((status, kind.as_str()), (422, "urn:idem:problem:key-reuse"));
    assert_eq!(shop.charges(), 1);
    assert_eq!(shop.declines.load(Ordering::SeqCst), 0);
}

/// A duplicate while the first runs: 409 with Retry-After; afterwards, the replay.
async fn in_progress_conflict(backend: Backend) {
    let Some((server, shop, watched, _dir)) = setup(backend, "conflict", |l| l).await else {
        return;
    };
    let gate = shop.close_gate();
    let c = client();
    let url = server.url("/charge");
    let first = tokio::spawn({
        let (c, url) = (c.clone(), url.clone());
        async move { parts(post(&c, &url, Some("k-1"), ORDER).await).await }
    });
    within(shop.entered.notified()).await;
    let dup = post(&c, &url, Some("k-1"), ORDER).await;
    let retry_after: u64 = dup.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        retry_after >= 1,
        "Retry-After is at least a second: {retry_after}"
    );
    let (status, kind, _) = problem_type(dup).await;
    assert_eq!(
        (status, kind.as_str()),
        (409, "urn:idem:problem:in-progress")
    );
    assert_eq!(watched.in_progress_claims.load(Ordering::SeqCst), 1);
    gate.add_permits(1);
    let (status, replayed, body) = within(first).await.unwrap();
    assert_eq!((status, replayed), (201, None));
    assert_eq!(
        parts(post(&c, &url, Some("k-1"), ORDER).await).await,
        (201, Some("true".into()), body)
    );
    assert_eq!(shop.charges(), 1);
}

/// With `in_progress(Wait)`, 50 concurrent identical POSTs charge once, and every client
/// gets the same response: one first, 49 replays.
async fn fifty_concurrent(backend: Backend) {
    let Some((server, shop, watched, _dir)) =
        setup(backend, "fifty", |l| l.in_progress(InProgress::Wait)).await
    else {
        return;
    };
    let gate = shop.close_gate();
    let c = reqwest::Client::new();
    let url = server.url("/charge");
    let requests: Vec<_> = (0..50)
        .map(|_| {
            let (c, url) = (c.clone(), url.clone());
            tokio::spawn(async move { parts(post(&c, &url, Some("same"), ORDER).await).await })
        })
        .collect();
    within(shop.entered.notified()).await;
    // Every other request has met the running one before it may finish.
    watched.until_in_progress(49).await;
    gate.add_permits(1);
    let mut bodies = Vec::new();
    let mut replays = 0;
    for r in requests {
        let (status, replayed, body) = within(r).await.unwrap();
        assert_eq!(status, 201);
        replays += usize::from(replayed.as_deref() == Some("true"));
        bodies.push(body);
    }
    assert_eq!(shop.charges(), 1);
    assert_eq!(replays, 49);
    assert!(
        bodies.iter().all(|b| b == &bodies[0]),
        "every client got the same body"
    );
}

/// Two principals sending one key charge twice; each replays their own.
async fn principals(backend: Backend) {
    let Some((server, shop, _, _dir)) = setup(backend, "principal", |l| {
        l.principal(|p| {
            p.headers
                .get("x-user")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        })
    })
    .await
    else {
        return;
    };
    let c = client();
    let send = |user: &'static str| {
        c.post(server.url("/charge"))
            .header("idempotency-key", "shared")
            .header("x-user", user)
            .body(ORDER)
            .send()
    };
    let (_, alice_replayed, alice) = parts(send("alice").await.unwrap()).await;
    let (_, bob_replayed, bob) = parts(send("bob").await.unwrap()).await;
    assert_eq!((alice_replayed, bob_replayed), (None, None));
    assert_ne!(alice, bob);
    assert_eq!(shop.charges(), 2);
    assert_eq!(
        parts(send("alice").await.unwrap()).await,
        (201, Some("true".into()), alice)
    );
    assert_eq!(shop.charges(), 2);
}

/// GET is not guarded: it runs every time, with or without a key.
async fn get_passes_through(backend: Backend) {
    let Some((server, shop, _, _dir)) = setup(backend, "get", |l| l).await else {
        return;
    };
    let c = client();
    for n in 1..=2 {
        let res = c
            .get(server.url("/charge"))
            .header("idempotency-key", "k")
            .send()
            .await
            .unwrap();
        assert_eq!(parts(res).await, (200, None, format!("read {n}")));
    }
    let res = c.get(server.url("/charge")).send().await.unwrap();
    assert_eq!(parts(res).await, (200, None, "read 3".into()));
    assert_eq!(shop.reads.load(Ordering::SeqCst), 3);
}

/// A handler's 4xx is stored (a decline stays declined), and so is its 5xx: it may have
/// charged before it failed, so a retry gets its answer instead of a second run.
async fn error_statuses(backend: Backend) {
    let Some((server, shop, _, _dir)) = setup(backend, "errors", |l| l).await else {
        return;
    };
    let c = client();
    let (s1, r1, b1) = parts(post(&c, &server.url("/decline"), Some("d"), ORDER).await).await;
    assert_eq!((s1, r1), (402, None));
    assert_eq!(
        parts(post(&c, &server.url("/decline"), Some("d"), ORDER).await).await,
        (402, Some("true".into()), b1)
    );
    assert_eq!(shop.declines.load(Ordering::SeqCst), 1);

    assert_eq!(
        parts(post(&c, &server.url("/flaky"), Some("f"), ORDER).await).await,
        (500, None, "try again".into())
    );
    assert_eq!(
        parts(post(&c, &server.url("/flaky"), Some("f"), ORDER).await).await,
        (500, Some("true".into()), "try again".into())
    );
    assert_eq!(shop.failures.load(Ordering::SeqCst), 1);
}

/// A body over the limit: 413, and the handler does not run.
async fn body_too_large(backend: Backend) {
    let Some((server, shop, _, _dir)) = setup(backend, "large", |l| l.max_body(16)).await else {
        return;
    };
    let (status, kind, _) =
        problem_type(post(&client(), &server.url("/charge"), Some("k"), ORDER).await).await;
    assert_eq!(
        (status, kind.as_str()),
        (413, "urn:idem:problem:body-too-large")
    );
    assert_eq!(shop.charges(), 0);
}

per_backend!(
    first_then_replay,
    bad_keys,
    key_reuse,
    in_progress_conflict,
    fifty_concurrent,
    principals,
    get_passes_through,
    error_statuses,
    body_too_large,
);

/// A handler behind the layer runs as the call's body, in the layer's task: it reads its
/// claim's fence with `idem::fence()`. A first answer that is not stored (429) gives the
/// claim back, and the retry's handler sees a larger fence; the replay after it runs no
/// handler and answers the stored body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_reads_its_claims_fence() {
    use axum::http::StatusCode;
    use std::sync::atomic::AtomicUsize;
    let Some((idem, _, _dir)) = idem_on(Backend::Sqlite).await else {
        return;
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let app = axum::Router::new()
        .route(
            "/charge",
            axum::routing::post(move || {
                let first = seen.fetch_add(1, Ordering::SeqCst) == 0;
                async move {
                    let fence = idem_core::fence().map_or(0, |f| f.get()).to_string();
                    let status = if first {
                        StatusCode::TOO_MANY_REQUESTS
                    } else {
                        StatusCode::CREATED
                    };
                    (status, fence)
                }
            }),
        )
        .layer(layer(&idem, "fence"));
    let server = Server::start(app).await;
    let c = client();
    let url = server.url("/charge");
    let (status, _, first) = parts(post(&c, &url, Some("k-fence"), ORDER).await).await;
    assert_eq!(status, 429);
    let (status, replayed, second) = parts(post(&c, &url, Some("k-fence"), ORDER).await).await;
    assert_eq!((status, replayed), (201, None));
    let (first, second): (u64, u64) = (first.parse().unwrap(), second.parse().unwrap());
    assert!(first > 0, "the handler saw no fence");
    assert!(
        second > first,
        "the retry's fence {second} is not above {first}"
    );
    let again = parts(post(&c, &url, Some("k-fence"), ORDER).await).await;
    assert_eq!(again, (201, Some("true".into()), second.to_string()));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
