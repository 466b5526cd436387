// A trait with a native `async fn` returning `Result<T, E>`: the signature is kept, so
// `#[idempotent]` works in its impl without `#[async_trait]`.
use idem::{idempotent, Idem, MemoryStore};

trait Payments {
    async fn charge(&self, order_id: String, amount: u64) -> Result<u64, idem::Error>;
}

struct Service {
    idem: Idem,
}

#[idem::scoped]
impl Payments for Service {
    #[idempotent(key = order_id, store = self.idem)]
    async fn charge(&self, order_id: String, amount: u64) -> Result<u64, idem::Error> {
        Ok(amount)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // The functions without `store = ...` run on the global engine.
    let _ = idem::set_global(idem::Idem::new(idem::MemoryStore::new()));
    let service = Service { idem: Idem::new(MemoryStore::new()) };
    assert_eq!(service.charge("o-1".into(), 5).await.unwrap(), 5);
    assert_eq!(service.charge("o-1".into(), 5).await.unwrap(), 5);
}
