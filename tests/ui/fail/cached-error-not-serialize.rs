use idem::idempotent;

// Deserialize only: see result-not-serialize.rs.
#[derive(Debug, serde::Deserialize)]
pub enum PaymentError {
    Declined,
    Idem(String),
}

impl From<idem::Error> for PaymentError {
    fn from(e: idem::Error) -> Self {
        PaymentError::Idem(e.to_string())
    }
}

#[idempotent(cache_errors = |e| matches!(e, PaymentError::Declined))]
async fn charge(amount: u64) -> Result<u64, PaymentError> {
    if amount == 0 {
        return Err(PaymentError::Declined);
    }
    Ok(amount)
}

fn main() {}
