//! Inside an `#[async_trait]` impl: `#[async_trait]` on the impl expands first, and
//! `#[idempotent]` on the method rewrites the future it returns.
use idem::{store::async_trait, idempotent, Idem, MemoryStore};

#[async_trait]
pub trait Payments {
    async fn charge(&self, order_id: String, amount: u64) -> Result<u64, idem::Error>;
    async fn refund(&self, order: (String, u64)) -> Result<u64, idem::Error>;
}

pub struct Service {
    idem: Idem,
}

#[async_trait]
#[idem::scoped]
impl Payments for Service {
    #[idempotent(key = order_id, store = self.idem)]
    async fn charge(&self, order_id: String, amount: u64) -> Result<u64, idem::Error> {
        let _ = &self.idem;
        Ok(amount)
    }

    #[idempotent(store = self.idem)]
    async fn refund(&self, (order_id, amount): (String, u64)) -> Result<u64, idem::Error> {
        Ok(amount + order_id.len() as u64)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // The functions without `store = ...` run on the global engine.
    let _ = idem::set_global(idem::Idem::new(idem::MemoryStore::new()));
    let service = Service {
        idem: Idem::new(MemoryStore::new()),
    };
    assert_eq!(service.charge("o-1".into(), 5).await.unwrap(), 5);
    assert_eq!(service.charge("o-1".into(), 5).await.unwrap(), 5);
    assert_eq!(service.refund(("o-1".into(), 5)).await.unwrap(), 8);
    let dynamic: &dyn Payments = &service;
    assert_eq!(dynamic.charge("o-1".into(), 5).await.unwrap(), 5);
}
