//! An exactly-once consumer on a real broker: `cargo run -p idem-integration --example consumer`.
//!
//! Needs RabbitMQ (`IDEM_EXAMPLE_AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672`) and
//! Postgres (`IDEM_EXAMPLE_POSTGRES_URL`, default `postgres://postgres@127.0.0.1:5432/test`).
//! It publishes five orders, each twice (a producer that retried), consumes them with manual
//! acks, and shows one shipment row and one email per order. `worker.rs` holds the consumer
//! and says which effect takes which path.

mod worker;

use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::stores::PostgresStore;
use idem::Idem;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use worker::{BoxError, Faults, Mailer, Stats, Worker};

fn env_or(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_string())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let amqp = env_or("IDEM_EXAMPLE_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672");
    let postgres = env_or(
        "IDEM_EXAMPLE_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let store = PostgresStore::connect(&postgres).await?;
    let worker = Worker {
        store: store.clone(),
        shipments: "idem_example_shipments".into(),
        mailer: Mailer {
            idem: Idem::new(store),
            sent: AtomicU64::new(0),
        },
        stats: Stats::default(),
        faults: Faults::default(),
    };
    worker.setup().await?;

    // Order ids of this run, so that a second run does its work again.
    let run = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let orders: Vec<String> = (1..=5).map(|i| format!("{run}-{i}")).collect();
    let queue = format!("idem-example-orders-{run}");

    let conn = Connection::connect(&amqp, ConnectionProperties::default()).await?;
    let channel = conn.create_channel().await?;
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await?;
    for order in orders.iter().chain(&orders) {
        channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                order.as_bytes(),
                BasicProperties::default(),
            )
            .await?;
    }
    println!("published {} orders, each twice", orders.len());

    // Manual acks (`no_ack: false`, the default), one unacked message at a time.
    channel.basic_qos(1, BasicQosOptions::default()).await?;
    let consumer = channel
        .basic_consume(
            queue.as_str().into(),
            "idem-example".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let expected = 2 * orders.len() as u64;
    let consumed = async {
        while Stats::get(&worker.stats.acks) < expected {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        ended = worker.run(consumer) => { ended?; }
        _ = tokio::time::timeout(Duration::from_secs(30), consumed) => {}
    }

    let shipped: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {} WHERE order_id LIKE $1",
        worker.shipments
    ))
    .bind(format!("{run}-%"))
    .fetch_one(worker.store.pool())
    .await?;
    println!(
        "deliveries: {}, duplicates: {}, acked: {}; shipment rows: {shipped}, emails sent: {}",
        Stats::get(&worker.stats.deliveries),
        Stats::get(&worker.stats.duplicates),
        Stats::get(&worker.stats.acks),
        Stats::get(&worker.mailer.sent),
    );
    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await?;
    conn.close(200, "done".into()).await?;
    Ok(())
}
