//! Receivers: `&self`, `&mut self`, `self: Arc<Self>`; the store and the key may borrow
//! `self` while the body takes it.
use std::sync::Arc;

use idem::{idempotent, Idem, MemoryStore};

pub struct Service {
    idem: Idem,
    calls: u32,
}

#[idem::scoped]
impl Service {
    #[idempotent(key = order_id, store = self.idem)]
    pub async fn by_ref(&self, order_id: String) -> u32 {
        self.calls + order_id.len() as u32
    }

    #[idempotent(store = self.idem, scope = "service::by_mut")]
    pub async fn by_mut(&mut self, amount: u32) -> u32 {
        self.calls += 1;
        self.calls + amount
    }

    #[idempotent(key = (self.calls, amount), store = self.idem)]
    pub async fn by_arc(self: Arc<Self>, amount: u32) -> u32 {
        self.calls + amount
    }

    /// Docs and attributes stay on the function.
    #[idempotent(store = self.idem)]
    #[allow(clippy::unused_async)]
    pub(crate) async fn with_docs(&self) {}
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut service = Service {
        idem: Idem::new(MemoryStore::new()),
        calls: 0,
    };
    assert_eq!(service.by_ref("abc".into()).await.unwrap(), 3);
    assert_eq!(service.by_mut(1).await.unwrap(), 2);
    assert_eq!(service.by_mut(1).await.unwrap(), 2);
    service.with_docs().await.unwrap();
    let service = Arc::new(service);
    assert_eq!(service.clone().by_arc(1).await.unwrap(), 2);
}
