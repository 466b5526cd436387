//! One idempotent function, called 3 times in a row and then 50 times at once with the
//! same key: the side effect happens once, and every caller gets the same value.
//!
//! ```sh
//! cargo run --example quickstart                      # in memory
//! IDEM_URL=sqlite://quickstart.db cargo run --example quickstart --features sqlite
//! ```
//!
//! On SQLite, run it twice: the second run finds the first run's result in the file and
//! sends nothing (its answer names the first run's process).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem::{idempotent, Idem, InProgress};

/// Counts how often the side effect really happened in this process.
static EMAILS_SENT: AtomicU32 = AtomicU32::new(0);

/// Sends the welcome email to a user once, however often it is called. A duplicate that
/// arrives while the first call is still sending waits for its result.
#[idempotent(key = user_id, store = idem, skip(idem), in_progress = "wait")]
async fn send_welcome_email(idem: Idem, user_id: u64, address: String) -> String {
    EMAILS_SENT.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(50)).await; // the mail server is slow
    format!(
        "welcome email to {address}, sent by process {}",
        std::process::id()
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("IDEM_URL").unwrap_or_else(|_| "memory://".into());
    let store = idem::stores::connect(&url).await?;
    let idem = Idem::builder()
        .shared_store(store)
        .in_progress(InProgress::Wait)
        .build()?;

    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(send_welcome_email(idem.clone(), 7, "ada@example.com".into()).await?);
    }
    let at_once: Vec<_> = (0..50)
        .map(|_| {
            tokio::spawn(send_welcome_email(
                idem.clone(),
                7,
                "ada@example.com".into(),
            ))
        })
        .collect();
    for call in at_once {
        answers.push(call.await??);
    }

    let first = &answers[0];
    let all_same = answers.iter().all(|a| a == first);
    println!("store:        {url}");
    println!(
        "calls:        {} (3 in a row, then 50 at once)",
        answers.len()
    );
    println!(
        "emails sent:  {} by this run",
        EMAILS_SENT.load(Ordering::SeqCst)
    );
    println!("same answer:  {all_same}: {first}");
    if !all_same {
        return Err("callers got different answers".into());
    }
    Ok(())
}
