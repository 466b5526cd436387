use idem::idempotent;

pub struct Repo<T>(Vec<T>);

#[idem::scoped]
impl<T: Clone + serde::Serialize + serde::de::DeserializeOwned + Send + Sync> Repo<T> {
    #[idempotent(key = index)]
    pub async fn load(&self, index: usize) -> Option<T> {
        self.0.get(index).cloned()
    }

    #[idempotent(key = index)]
    pub async fn peek(&self, index: usize) -> bool {
        index < self.0.len()
    }
}

fn main() {}
