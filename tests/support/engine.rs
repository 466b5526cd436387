//! The fixtures of the `engine_*` test files: an engine on a `Faulty` store, the key scope
//! they share, an error type a body returns, and a wait for a claim to be released.

use std::sync::Arc;
use std::time::Duration;

use idem::{store::Store, Error, Idem, Key};

use super::stores::Faulty;

/// An engine on a fresh `Faulty` store, and the store.
pub fn setup() -> (Arc<Faulty>, Idem) {
    let store = Arc::new(Faulty::default());
    let idem = Idem::builder().store(store.clone()).build().unwrap();
    (store, idem)
}

/// `id` in the scope of the engine tests.
pub fn key(id: &str) -> Key {
    Key::new("engine-tests", id).unwrap()
}

/// An ambiguous failure of a call's side effect (it may or may not have happened):
/// `message`, as a caller's own error.
pub fn ambiguous(message: &str) -> Error {
    Error::Config {
        message: message.into(),
        source: None,
    }
}

/// A body's error: two of the caller's own, and idem's.
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum PayError {
    Declined,
    Timeout,
    Idem(String),
}

impl From<Error> for PayError {
    fn from(e: Error) -> Self {
        PayError::Idem(e.to_string())
    }
}

/// Polls until `k` holds no record (its claim was released); panics after about a second.
pub async fn wait_until_released(store: &dyn Store, k: &Key) {
    for _ in 0..200 {
        if store.get(k).await.unwrap().is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the claim on {k} was never released");
}
