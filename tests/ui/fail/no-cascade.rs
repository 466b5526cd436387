//! A refused attribute is the only message: callers that use the fn's rewritten result,
//! arguments and imports only the attribute names, all compile without a word.
use std::time::Duration;

use idem::{idempotent, Idem, InProgress};

#[idempotent(key = order_id, store = idem, tll = "24h", lease = Duration::from_secs(5))]
async fn charge(idem: &Idem, order_id: String, amount: u64) -> u64 {
    amount
}

#[idempotent(key = id, in_progress = InProgress::Wait)]
async fn refund(id: u64) -> Result<u64, idem::Error> {
    Ok(1)
}

pub struct Payments {
    idem: Idem,
}

#[idem::scoped]
impl Payments {
    #[idempotent(key = order_id, store = self.idem, version = "2")]
    pub async fn capture(&self, order_id: u64) -> String {
        String::new()
    }
}

async fn caller(idem: &Idem) -> Result<u64, idem::Error> {
    let a = charge(idem, "o-1".into(), 5).await?;
    let b = refund(1).await.unwrap();
    let payments = Payments { idem: idem.clone() };
    let c = payments.capture(2).await.expect("captured");
    Ok(a + b + c.len() as u64)
}

fn main() {
    let _ = caller;
}
