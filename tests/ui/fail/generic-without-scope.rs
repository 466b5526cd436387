use idem::idempotent;
use serde::{de::DeserializeOwned, Serialize};

#[idempotent(key = id)]
async fn load<T: Serialize + DeserializeOwned + Default + Send>(id: u64) -> T {
    T::default()
}

#[idempotent]
async fn greet(name: impl Serialize + AsRef<str> + Send) -> String {
    name.as_ref().to_uppercase()
}

fn main() {}
