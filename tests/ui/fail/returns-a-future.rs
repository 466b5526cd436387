use std::future::Future;

use idem::idempotent;

pub struct Service;

#[idem::scoped]
impl Service {
    // A future built by hand (what a trait method looks like without `#[async_trait]` on
    // its impl): the macro needs an `async fn`.
    #[idempotent]
    fn charge(&self, amount: u64) -> impl Future<Output = Result<u64, idem::Error>> + Send {
        async move { Ok(amount) }
    }
}

fn main() {}
