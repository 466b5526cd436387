use idem::idempotent;

pub struct Orders;

impl Orders {
    // No `#[idem::scoped]` on the impl and no `scope`: the method's type is unknown here.
    #[idempotent(key = id)]
    pub async fn create(&self, id: u64) -> u64 {
        id
    }
}

fn main() {}
