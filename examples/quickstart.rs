//! One operation, called 3 times in a row and 50 times at once under one key: the side
//! effect happens once and every caller gets the same value.
//!
//! `cargo run --example quickstart` (memory store), or with a URL:
//! `IDEM_URL=sqlite://quickstart.db cargo run --example quickstart --features sqlite`

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use idem::{Fingerprint, Idem, InProgress, Key};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("IDEM_URL").unwrap_or_else(|_| "memory://".into());
    let store = idem::stores::connect(&url).await?;
    let idem = Idem::builder()
        .shared_store(store)
        .in_progress(InProgress::Wait)
        .build()?;
    let side_effects = Arc::new(AtomicU32::new(0));

    let send_welcome_email = |idem: Idem, side_effects: Arc<AtomicU32>| async move {
        let key = Key::new("quickstart::send_welcome_email", "user-7")?;
        idem.run(key, Fingerprint::of("ada@example.com"), || async {
            side_effects.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            format!("email sent to ada@example.com, message id {}", std::process::id())
        })
        .await
    };

    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(send_welcome_email(idem.clone(), side_effects.clone()).await?);
    }
    let concurrent: Vec<_> = (0..50)
        .map(|_| tokio::spawn(send_welcome_email(idem.clone(), side_effects.clone())))
        .collect();
    for task in concurrent {
        answers.push(task.await??);
    }

    let first = &answers[0];
    let all_same = answers.iter().all(|a| a == first);
    println!("store:        {url}");
    println!("calls:        {} (3 in a row, then 50 at once)", answers.len());
    println!(
        "side effects: {} in this run",
        side_effects.load(Ordering::SeqCst)
    );
    println!("same answer:  {all_same}: {first}");
    if !all_same {
        return Err("callers got different answers".into());
    }
    Ok(())
}
