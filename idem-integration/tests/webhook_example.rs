//! `examples/webhook_receiver.rs` against a real listener and client: one event delivered
//! three times and another once act twice; a reused event id with another body is refused.

#[allow(dead_code)]
#[path = "../examples/webhook_receiver.rs"]
mod webhook_receiver;

use std::sync::Arc;

use webhook_receiver::{app, signature, Fulfilled};

async fn deliver(c: &reqwest::Client, url: &str, body: &str) -> (u16, Option<String>, String) {
    let res = c
        .post(url)
        .header("content-type", "application/json")
        .header(
            "webhook-signature",
            signature(b"whsec_demo", body.as_bytes()),
        )
        .body(body.to_owned())
        .send()
        .await
        .expect("delivery");
    let status = res.status().as_u16();
    let replayed = res
        .headers()
        .get("idempotent-replayed")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, replayed, res.text().await.unwrap())
}

#[tokio::test]
async fn each_event_acts_once_however_often_it_is_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let idem = idem::connect(&format!("sqlite://{}", dir.path().join("w.db").display()))
        .await
        .unwrap();
    let done = Arc::new(Fulfilled::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/webhooks/payments",
        listener.local_addr().unwrap()
    );
    let router = app(idem, done.clone());
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let c = reqwest::Client::new();

    let evt1 = r#"{"id":"evt_1","type":"payment.succeeded","data":{"order_id":"o-1"}}"#;
    // The provider re-encodes its redelivery: another member order is the same event.
    let evt1_again = r#"{"data":{"order_id":"o-1"},"type":"payment.succeeded","id":"evt_1"}"#;
    let evt2 = r#"{"id":"evt_2","type":"payment.succeeded","data":{"order_id":"o-2"}}"#;
    let first = deliver(&c, &url, evt1).await;
    assert_eq!(first, (200, None, "fulfilled order o-1".into()));
    for body in [evt1, evt1_again] {
        assert_eq!(
            deliver(&c, &url, body).await,
            (200, Some("true".into()), "fulfilled order o-1".into())
        );
    }
    assert_eq!(deliver(&c, &url, evt2).await.0, 200);
    assert_eq!(*done.events.lock().unwrap(), ["evt_1", "evt_2"]);

    // The same id with another body is not a duplicate: refused, nothing done.
    let forged = r#"{"id":"evt_1","type":"payment.succeeded","data":{"order_id":"o-9"}}"#;
    assert_eq!(deliver(&c, &url, forged).await.0, 422);
    // A body without an id is a clear 400.
    let (status, _, body) = deliver(&c, &url, r#"{"type":"payment.succeeded"}"#).await;
    assert_eq!(status, 400);
    assert!(body.contains("`/id`"), "{body}");
    assert_eq!(done.events.lock().unwrap().len(), 2);

    // Unsigned, or signed with another secret: refused before the idempotency layer, so a
    // forger cannot hold the next event's id.
    let evt3 = r#"{"id":"evt_3","type":"payment.succeeded","data":{"order_id":"o-3"}}"#;
    for sig in [
        "",
        "sha256=00",
        &signature(b"not the secret", evt3.as_bytes()),
    ] {
        let res = c
            .post(&url)
            .header("content-type", "application/json")
            .header("webhook-signature", sig)
            .body(evt3)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 401, "{sig}");
    }
    assert_eq!(
        deliver(&c, &url, evt3).await,
        (200, None, "fulfilled order o-3".into())
    );
    assert_eq!(done.events.lock().unwrap().len(), 3);
    server.abort();
}
