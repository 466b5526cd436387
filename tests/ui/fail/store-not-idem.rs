use std::sync::Arc;

use idem::idempotent;

pub struct Service {
    pub store: idem::MemoryStore,
    pub shared: Arc<dyn idem::store::Store>,
}

#[idem::scoped]
impl Service {
    // `store` takes the engine (`Idem`), not a bare store...
    #[idempotent(store = self.store)]
    pub async fn charge(&self, amount: u64) -> u64 {
        amount
    }

    // ...nor a shared one.
    #[idempotent(store = self.shared)]
    pub async fn refund(&self, amount: u64) -> u64 {
        amount
    }
}

fn main() {}
