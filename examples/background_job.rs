//! A queue consumer that sends an order confirmation email. The queue delivers at least
//! once: messages come again after a crash, a timeout or a rebalance, sometimes to two
//! workers at the same time. The handler is keyed by the business event,
//! `order-confirmation:{order_id}:{version}`, so each version of an order is confirmed
//! once, and a new version (the order changed) is confirmed again.
//!
//! `cargo run --example background_job` (memory store), or with a URL:
//! `IDEM_URL=sqlite://jobs.db cargo run --example background_job --features sqlite`

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{idempotent, Idem};
use serde::{Deserialize, Serialize};

/// A message from the queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: u64,
    pub version: u32,
    pub email: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sent {
    pub message_id: String,
}

#[derive(Debug)]
pub enum JobError {
    /// The mail server failed: the job goes back on the queue and runs again.
    Smtp(String),
    /// idem: another worker is sending this very email, the store failed, ...
    Idem(idem::Error),
}

impl From<idem::Error> for JobError {
    fn from(e: idem::Error) -> Self {
        JobError::Idem(e)
    }
}

/// Stands for the mail server: counts emails really sent and fails the first attempt.
#[derive(Default)]
pub struct Mailer {
    attempts: AtomicU32,
    sent: Mutex<Vec<String>>,
}

impl Mailer {
    async fn send(&self, to: &str, subject: &str) -> Result<Sent, JobError> {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if self.attempts.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(JobError::Smtp("421 try again later".into()));
        }
        let mut sent = self.sent.lock().unwrap();
        sent.push(format!("{to}: {subject}"));
        Ok(Sent {
            message_id: format!("msg-{}", sent.len()),
        })
    }
}

/// The job handler. The engine is the global one (`idem::set_global` in `main`); the mailer
/// is a dependency, not part of the event, so it is skipped.
#[idempotent(
    key = format!("order-confirmation:{}:{}", event.order_id, event.version),
    scope = "jobs::order_confirmation",
    skip(mailer),
    ttl = "7d",
    lease = "1m",
)]
async fn send_order_confirmation(mailer: &Mailer, event: OrderPlaced) -> Result<Sent, JobError> {
    let subject = format!("Order {} confirmed (v{})", event.order_id, event.version);
    mailer.send(&event.email, &subject).await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("IDEM_URL").unwrap_or_else(|_| "memory://".into());
    let store = idem::stores::connect(&url).await?;
    idem::set_global(Idem::builder().shared_store(store).build()?)
        .map_err(|_| "the global engine was already set")?;

    let event = |order_id, version| OrderPlaced {
        order_id,
        version,
        email: format!("customer-{order_id}@example.com"),
    };
    // Order 1 is delivered three times, order 2 twice, and order 1 changes (version 2).
    let queue = Arc::new(Mutex::new(VecDeque::from(vec![
        event(1, 1),
        event(1, 1),
        event(2, 1),
        event(1, 1),
        event(2, 1),
        event(1, 2),
    ])));
    let mailer = Arc::new(Mailer::default());

    // Four workers take messages from the queue; a failed job goes back on the queue.
    let workers: Vec<_> = (0..4)
        .map(|worker| {
            let (queue, mailer) = (queue.clone(), mailer.clone());
            tokio::spawn(async move {
                loop {
                    let Some(job) = queue.lock().unwrap().pop_front() else {
                        break;
                    };
                    match send_order_confirmation(&mailer, job.clone()).await {
                        Ok(sent) => println!(
                            "worker {worker}: order {} v{} -> {}",
                            job.order_id, job.version, sent.message_id
                        ),
                        Err(e) => {
                            println!(
                                "worker {worker}: order {} v{} failed ({e:?}); requeued",
                                job.order_id, job.version
                            );
                            tokio::time::sleep(Duration::from_millis(30)).await;
                            queue.lock().unwrap().push_back(job);
                        }
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await?;
    }

    let sent = mailer.sent.lock().unwrap().clone();
    println!("store:  {url}");
    println!("emails sent ({}):", sent.len());
    for email in &sent {
        println!("  {email}");
    }
    // One email per (order, version), whatever the deliveries and the failure.
    if sent.len() != 3 {
        return Err(format!("expected 3 emails, sent {}", sent.len()).into());
    }
    Ok(())
}
