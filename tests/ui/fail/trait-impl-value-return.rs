use idem::idempotent;

// A trait with a native `async fn`: its signature is the trait's, so the macro cannot make
// the method return `Result<u64, idem::Error>`.
pub trait Payments {
    async fn charge(&self, amount: u64) -> u64;
}

pub struct Service;

#[idem::scoped]
impl Payments for Service {
    #[idempotent]
    async fn charge(&self, amount: u64) -> u64 {
        amount
    }
}

fn main() {}
