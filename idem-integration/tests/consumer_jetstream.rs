//! The example's JetStream consumer (`examples/jetstream_consumer.rs`) against a real NATS
//! server with JetStream (`IDEM_TEST_NATS_URL`); skipped with a message when unset, a
//! failure when `IDEM_REQUIRE_BACKENDS=1`. `cargo test -p idem-integration consumer` selects
//! them.
//!
//! Each scenario runs twice: with the dedup, every order ships exactly once; with it
//! removed (the same worker, its effect run directly), some order ships twice, which shows
//! that the scenario really delivers duplicates. Each run has its own stream (deleted at
//! the end) and its own engine.

#[allow(dead_code)]
#[path = "../examples/jetstream_consumer.rs"]
mod jetstream_consumer;

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use common::run_id;
use idem::{Idem, MemoryStore};
use idem_core::testing::backend_url;
use jetstream_consumer::{
    drained, fresh_stream, publish, publish_plain, pull_consumer, Ended, Order, Worker,
};

struct Setup {
    js: jetstream::Context,
    stream_name: String,
    subject: String,
}

impl Setup {
    async fn new(url: &str, duplicate_window: Duration) -> (Setup, jetstream::stream::Stream) {
        let client = async_nats::connect(url).await.expect("nats");
        let js = jetstream::new(client);
        let id = run_id();
        let setup = Setup {
            js,
            stream_name: format!("IDEM_TEST_{id}"),
            subject: format!("idem-test.{id}.orders"),
        };
        let stream = fresh_stream(
            &setup.js,
            &setup.stream_name,
            &setup.subject,
            duplicate_window,
        )
        .await
        .expect("stream");
        (setup, stream)
    }

    async fn publish_plain(&self, order: &Order) {
        publish_plain(&self.js, &self.subject, order)
            .await
            .expect("publish");
    }

    async fn delete(self) {
        self.js
            .delete_stream(&self.stream_name)
            .await
            .expect("delete stream");
    }
}

fn orders(n: usize) -> Vec<Order> {
    (1..=n)
        .map(|i| Order {
            order_id: format!("o-{i}"),
        })
        .collect()
}

fn worker(idem: &Idem, dedup: bool) -> Arc<Worker> {
    slow_worker(idem, dedup, Duration::ZERO)
}

/// A worker whose every shipment takes `effect_time`.
fn slow_worker(idem: &Idem, dedup: bool, effect_time: Duration) -> Arc<Worker> {
    let mut w = Worker::new(idem.clone());
    w.dedup = dedup;
    w.effect_time = effect_time;
    Arc::new(w)
}

/// Runs `worker` on `consumer` in a task until it ends or is aborted.
fn spawn(
    worker: Arc<Worker>,
    consumer: jetstream::consumer::PullConsumer,
) -> tokio::task::JoinHandle<Ended> {
    tokio::spawn(async move { worker.run(&consumer).await.expect("consumer") })
}

/// Waits (at most 30 s) until nothing is pending or unacked on `consumer`; if it does not
/// drain, says what the server still holds.
async fn settle(consumer: &jetstream::consumer::PullConsumer) {
    if tokio::time::timeout(Duration::from_secs(30), drained(consumer))
        .await
        .is_err()
    {
        let mut c = consumer.clone();
        let info = c.info().await.expect("consumer info");
        panic!("the consumer did not drain within 30 s: pending {}, ack pending {}, redelivered {}, waiting {}", info.num_pending, info.num_ack_pending, info.num_redelivered, info.num_waiting);
    }
}

/// Shipments per order over all `workers`.
fn shipments(workers: &[&Arc<Worker>], orders: &[Order]) -> Vec<u32> {
    orders
        .iter()
        .map(|o| workers.iter().map(|w| w.shipments(&o.order_id)).sum())
        .collect()
}

/// Every order published twice (a publisher that retried without a msg id).
async fn published_twice(url: &str, dedup: bool) -> Vec<u32> {
    let (setup, stream) = Setup::new(url, Duration::from_secs(60)).await;
    let consumer = pull_consumer(&stream, "ship", Duration::from_secs(5))
        .await
        .unwrap();
    let orders = orders(20);
    for order in orders.iter().chain(&orders) {
        setup.publish_plain(order).await;
    }
    let idem = Idem::new(MemoryStore::new());
    let w = worker(&idem, dedup);
    let task = spawn(w.clone(), consumer.clone());
    settle(&consumer).await;
    task.abort();
    if dedup {
        assert_eq!(w.stats.duplicates.load(Ordering::SeqCst), 20);
        assert_eq!(w.stats.acks.load(Ordering::SeqCst), 40);
    }
    setup.delete().await;
    shipments(&[&w], &orders)
}

/// A consumer that dies after its effect and before its ack: JetStream redelivers the
/// message after `ack_wait` to the consumer that takes over.
async fn killed_before_ack(url: &str, dedup: bool) -> Vec<u32> {
    let (setup, stream) = Setup::new(url, Duration::from_secs(60)).await;
    let consumer = pull_consumer(&stream, "ship", Duration::from_millis(500))
        .await
        .unwrap();
    let orders = orders(10);
    for order in &orders {
        setup.publish_plain(order).await;
    }
    let idem = Idem::new(MemoryStore::new());
    let first = worker(&idem, dedup);
    first
        .faults
        .die_before_ack
        .lock()
        .unwrap()
        .insert("o-3".into());
    let ended = tokio::time::timeout(Duration::from_secs(20), first.run(&consumer))
        .await
        .expect("the first consumer stops at its fault")
        .unwrap();
    assert_eq!(ended, Ended::Died);
    let second = worker(&idem, dedup);
    let task = spawn(second.clone(), consumer.clone());
    settle(&consumer).await;
    task.abort();
    if dedup {
        assert!(second.stats.duplicates.load(Ordering::SeqCst) >= 1);
    }
    setup.delete().await;
    shipments(&[&first, &second], &orders)
}

/// A delivery that fails with a retryable error is `nak`ed with a delay and redelivered;
/// every order is also published twice.
async fn nak_and_redelivery(url: &str, dedup: bool) -> Vec<u32> {
    let (setup, stream) = Setup::new(url, Duration::from_secs(60)).await;
    let consumer = pull_consumer(&stream, "ship", Duration::from_secs(5))
        .await
        .unwrap();
    let orders = orders(10);
    for order in orders.iter().chain(&orders) {
        setup.publish_plain(order).await;
    }
    let idem = Idem::new(MemoryStore::new());
    let w = worker(&idem, dedup);
    w.faults
        .fail_before_effect
        .lock()
        .unwrap()
        .extend(["o-5".to_owned(), "o-7".to_owned()]);
    let task = spawn(w.clone(), consumer.clone());
    settle(&consumer).await;
    task.abort();
    assert!(
        w.stats.naks.load(Ordering::SeqCst) >= 2,
        "the failures were naked"
    );
    assert_eq!(w.stats.terms.load(Ordering::SeqCst), 0);
    setup.delete().await;
    shipments(&[&w], &orders)
}

/// Two consumers pull from one durable consumer at once, every order published twice, so
/// the two copies of an order often run at the same moment on both: one ships, the other
/// gets `InProgress`, `nak`s with its hint and acks the replay on redelivery.
async fn two_consumers_at_once(url: &str, dedup: bool) -> Vec<u32> {
    let (setup, stream) = Setup::new(url, Duration::from_secs(60)).await;
    let consumer = pull_consumer(&stream, "ship", Duration::from_secs(5))
        .await
        .unwrap();
    let orders = orders(20);
    for order in &orders {
        setup.publish_plain(order).await;
        setup.publish_plain(order).await;
    }
    let idem = Idem::new(MemoryStore::new());
    let slow = Duration::from_millis(20);
    let (a, b) = (
        slow_worker(&idem, dedup, slow),
        slow_worker(&idem, dedup, slow),
    );
    let (ta, tb) = (
        spawn(a.clone(), consumer.clone()),
        spawn(b.clone(), consumer.clone()),
    );
    settle(&consumer).await;
    ta.abort();
    tb.abort();
    let delivered = |w: &Arc<Worker>| w.stats.deliveries.load(Ordering::SeqCst);
    assert!(
        delivered(&a) > 0 && delivered(&b) > 0,
        "both consumers took deliveries ({} and {})",
        delivered(&a),
        delivered(&b)
    );
    setup.delete().await;
    shipments(&[&a, &b], &orders)
}

/// Asserts one shipment per order with the dedup, and a duplicate shipment without it.
async fn exactly_once<F, Fut>(scenario: F)
where
    F: Fn(String, bool) -> Fut,
    Fut: std::future::Future<Output = Vec<u32>>,
{
    let Some(url) = backend_url("IDEM_TEST_NATS_URL") else {
        return;
    };
    let with = scenario(url.clone(), true).await;
    assert!(with.iter().all(|&n| n == 1), "with the dedup: {with:?}");
    let without = scenario(url, false).await;
    assert!(
        without.iter().any(|&n| n > 1),
        "without the dedup the scenario ships some order twice: {without:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_jetstream_every_message_published_twice_ships_once() {
    exactly_once(|url, dedup| async move { published_twice(&url, dedup).await }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_jetstream_killed_before_its_ack_ships_once() {
    exactly_once(|url, dedup| async move { killed_before_ack(&url, dedup).await }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_jetstream_a_nak_and_its_redelivery_ship_once() {
    exactly_once(|url, dedup| async move { nak_and_redelivery(&url, dedup).await }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_jetstream_two_consumers_at_once_ship_once() {
    exactly_once(|url, dedup| async move { two_consumers_at_once(&url, dedup).await }).await;
}

/// The publisher's half: `Nats-Msg-Id` from the dedup key makes JetStream drop a
/// re-publish within its duplicate window; after the window it is stored again, and the
/// consumer's dedup catches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_jetstream_the_duplicate_window_and_after_it() {
    let Some(url) = backend_url("IDEM_TEST_NATS_URL") else {
        return;
    };
    let window = Duration::from_millis(1000);
    let (setup, stream) = Setup::new(&url, window).await;
    let consumer = pull_consumer(&stream, "ship", Duration::from_secs(5))
        .await
        .unwrap();
    let order = Order {
        order_id: "o-1".into(),
    };
    assert!(!publish(&setup.js, &setup.subject, &order).await.unwrap());
    assert!(
        publish(&setup.js, &setup.subject, &order).await.unwrap(),
        "a re-publish within the window is dropped"
    );
    assert_eq!(stream.get_info().await.unwrap().state.messages, 1);
    tokio::time::sleep(window + Duration::from_millis(500)).await;
    assert!(
        !publish(&setup.js, &setup.subject, &order).await.unwrap(),
        "after the window JetStream keeps it"
    );
    assert_eq!(stream.get_info().await.unwrap().state.messages, 2);

    let w = worker(&Idem::new(MemoryStore::new()), true);
    let task = spawn(w.clone(), consumer.clone());
    settle(&consumer).await;
    task.abort();
    assert_eq!(w.shipments("o-1"), 1, "the consumer's dedup caught it");
    assert_eq!(w.stats.duplicates.load(Ordering::SeqCst), 1);
    setup.delete().await;
}
