use idem::idempotent;

pub struct Service {
    pub store: idem::MemoryStore,
}

impl Service {
    // `store` takes the engine (`Idem`), not a bare store.
    #[idempotent(store = self.store, scope = "service::charge")]
    pub async fn charge(&self, amount: u64) -> u64 {
        amount
    }
}

fn main() {}
