use idem::{store::async_trait, idempotent};

#[async_trait]
pub trait Payments {
    async fn charge(&self, amount: u64) -> u64;
}

pub struct Service;

#[async_trait]
#[idem::scoped]
impl Payments for Service {
    #[idempotent]
    async fn charge(&self, amount: u64) -> u64 {
        amount
    }
}

fn main() {}
