//! The example's consumer (`examples/consumer/worker.rs`) against a real RabbitMQ
//! (`IDEM_TEST_AMQP_URL`) and Postgres (`IDEM_TEST_POSTGRES_URL`); skipped with a message
//! when unset, a failure when `IDEM_REQUIRE_BACKENDS=1`. `cargo test -p idem-integration
//! consumer` selects them.
//!
//! Every order is published twice; faults are injected per order: a consumer that dies
//! after its commit and before its ack (its connection is closed, so the broker requeues
//! the message as redelivered), and a transaction that rolls back after its write (the
//! message is nacked back). With a prefetch of one, each fault is exactly one delivery the
//! broker flags `redelivered`, so the counts below are exact. Each test has its own queue
//! (deleted at the end), its own records table and its own shipment table (dropped).

#[path = "../examples/consumer/worker.rs"]
mod worker;

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::run_id;
use idem::stores::PostgresStore;
use idem::Idem;
use idem_core::testing::backend_url;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use worker::{Ended, Faults, Mailer, Stats, Worker};

struct Scenario {
    orders: usize,
    consumers: usize,
    /// Order indexes whose consumer dies after the commit, before the ack.
    die_before_ack: Vec<usize>,
    /// Order indexes whose first transaction rolls back after its write.
    fail_after_write: Vec<usize>,
}

struct Report {
    stats: Arc<Worker>,
    /// Shipment rows per order, in order.
    rows: Vec<i64>,
    deaths: u64,
}

async fn run(s: Scenario) -> Option<Report> {
    let amqp = backend_url("IDEM_TEST_AMQP_URL")?;
    let postgres = backend_url("IDEM_TEST_POSTGRES_URL")?;
    let id = run_id();
    let orders: Vec<String> = (0..s.orders).map(|i| format!("{id}-{i}")).collect();
    let queue = format!("idem-consumer-test-{id}");

    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2 * s.consumers as u32 + 2)
        .connect(&postgres)
        .await
        .unwrap();
    let store = PostgresStore::new(pool)
        .with_table(&format!("idem_consumer_{id}"))
        .unwrap();
    let faults = Faults::default();
    for &i in &s.die_before_ack {
        faults
            .die_before_ack
            .lock()
            .unwrap()
            .insert(orders[i].clone());
    }
    for &i in &s.fail_after_write {
        faults
            .fail_after_write
            .lock()
            .unwrap()
            .insert(orders[i].clone());
    }
    let worker = Arc::new(Worker {
        store: store.clone(),
        shipments: format!("idem_consumer_shipments_{id}"),
        mailer: Mailer {
            idem: Idem::new(store.clone()),
            sent: AtomicU64::new(0),
        },
        stats: Stats::default(),
        faults,
    });
    worker.setup().await.unwrap();

    let conn = Connection::connect(&amqp, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    // Each order twice, the copies apart, as a producer that retried later sends them.
    for order in orders.iter().chain(&orders) {
        channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                order.as_bytes(),
                BasicProperties::default(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }

    // Each consumer task: connect, consume; when it dies, close its connection without
    // acking and start again on a new one, as a restarted process does.
    let deaths = Arc::new(AtomicU64::new(0));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for c in 0..s.consumers {
        let (worker, deaths, amqp, queue) =
            (worker.clone(), deaths.clone(), amqp.clone(), queue.clone());
        let mut stopped = stopped.clone();
        tasks.push(tokio::spawn(async move {
            for life in 0.. {
                let conn = Connection::connect(&amqp, ConnectionProperties::default())
                    .await
                    .unwrap();
                let channel = conn.create_channel().await.unwrap();
                channel
                    .basic_qos(1, BasicQosOptions::default())
                    .await
                    .unwrap();
                let consumer = channel
                    .basic_consume(
                        queue.as_str().into(),
                        format!("consumer-{c}-{life}").as_str().into(),
                        BasicConsumeOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .unwrap();
                let ended = tokio::select! {
                    ended = worker.run(consumer) => ended.unwrap(),
                    _ = async { stopped.wait_for(|s| *s).await.map(|_| ()) } => {
                        let _ = conn.close(200, "test over".into()).await;
                        return;
                    }
                };
                assert_eq!(ended, Ended::Died, "the broker closed the stream");
                deaths.fetch_add(1, Ordering::SeqCst);
                // The crash: the connection goes with its unacked delivery.
                conn.close(320, "killed before its ack".into())
                    .await
                    .unwrap();
            }
        }));
    }

    // Every delivery is acked in the end, redeliveries included: 2 per order.
    let expected = 2 * s.orders as u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Stats::get(&worker.stats.acks) < expected {
        assert!(
            Instant::now() < deadline,
            "not every delivery was acked within 60 s: {:?}",
            worker.stats
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(true).unwrap();
    for t in tasks {
        t.await.unwrap();
    }

    let mut rows = Vec::new();
    for order in &orders {
        let n: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {} WHERE order_id = $1",
            worker.shipments
        ))
        .bind(order)
        .fetch_one(store.pool())
        .await
        .unwrap();
        rows.push(n);
    }
    let left = channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    assert_eq!(left, 0, "messages left in the queue");
    conn.close(200, "done".into()).await.unwrap();
    for table in [
        worker.shipments.clone(),
        store.table(),
        format!("{}_schema", store.table()),
    ] {
        sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
            .execute(store.pool())
            .await
            .unwrap();
    }
    Some(Report {
        stats: worker,
        rows,
        deaths: deaths.load(Ordering::SeqCst),
    })
}

fn get(n: &AtomicU64) -> u64 {
    Stats::get(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_every_message_published_twice_has_one_effect() {
    let Some(r) = run(Scenario {
        orders: 20,
        consumers: 1,
        die_before_ack: vec![],
        fail_after_write: vec![],
    })
    .await
    else {
        return;
    };
    assert_eq!(r.rows, vec![1; 20]);
    assert_eq!(get(&r.stats.mailer.sent), 20);
    assert_eq!(get(&r.stats.stats.deliveries), 40);
    assert_eq!(
        get(&r.stats.stats.duplicates),
        20,
        "the second copies arrived"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_killed_before_ack_is_redelivered_and_not_repeated() {
    let Some(r) = run(Scenario {
        orders: 10,
        consumers: 1,
        die_before_ack: vec![0, 4, 9],
        fail_after_write: vec![],
    })
    .await
    else {
        return;
    };
    assert_eq!(r.deaths, 3);
    assert_eq!(
        get(&r.stats.stats.redelivered),
        3,
        "each killed delivery came back"
    );
    assert_eq!(r.rows, vec![1; 10]);
    assert_eq!(get(&r.stats.mailer.sent), 10);
    // The 10 second copies and the 3 redeliveries found the record.
    assert_eq!(get(&r.stats.stats.duplicates), 13);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_rolled_back_transaction_leaves_no_record_and_redelivery_does_the_work() {
    let Some(r) = run(Scenario {
        orders: 10,
        consumers: 1,
        die_before_ack: vec![],
        fail_after_write: vec![1, 5, 8],
    })
    .await
    else {
        return;
    };
    assert_eq!(get(&r.stats.stats.nacks), 3);
    assert_eq!(
        get(&r.stats.stats.redelivered),
        3,
        "each rolled-back delivery came back"
    );
    assert_eq!(r.rows, vec![1; 10]);
    assert_eq!(get(&r.stats.mailer.sent), 10);
    // Only the second copies: each redelivery after a rollback found no record.
    assert_eq!(get(&r.stats.stats.duplicates), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consumer_several_at_once_with_faults_have_one_effect_per_message() {
    let Some(r) = run(Scenario {
        orders: 40,
        consumers: 4,
        die_before_ack: vec![3, 17, 30],
        fail_after_write: vec![5, 22, 39],
    })
    .await
    else {
        return;
    };
    assert_eq!(r.deaths, 3);
    assert_eq!(get(&r.stats.stats.nacks), 3);
    assert_eq!(get(&r.stats.stats.redelivered), 6);
    assert_eq!(r.rows, vec![1; 40]);
    assert_eq!(get(&r.stats.mailer.sent), 40);
    assert_eq!(get(&r.stats.stats.deliveries), 86);
    assert_eq!(get(&r.stats.stats.duplicates), 43);
}
