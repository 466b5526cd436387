//! Generic functions with where-clauses, `impl Trait` arguments (each with the `scope`
//! a generic fn needs), generic impls, and results named through aliases.
use std::fmt::Debug;

use idem::idempotent;
use serde::{de::DeserializeOwned, Serialize};

#[idempotent(scope = "generics::echo")]
async fn echo<T>(value: T) -> T
where
    T: Serialize + DeserializeOwned + Debug + Send,
{
    value
}

#[idempotent(key = id, scope = "generics::describe")]
async fn describe(id: impl Serialize + Send, label: impl AsRef<str> + Serialize) -> String {
    label.as_ref().to_uppercase()
}

pub trait Entity: Serialize + DeserializeOwned + Send + Sync {
    const KIND: &'static str;
}

impl Entity for u64 {
    const KIND: &'static str = "count";
}

pub struct Repo<T> {
    items: Vec<T>,
}

#[idem::scoped]
impl<T: Entity + Clone> Repo<T> {
    // Instantiations share the explicit scope; the key tells them apart.
    #[idempotent(key = (T::KIND, index), scope = "generics::Repo::load")]
    pub async fn load(&self, index: usize) -> Option<T> {
        self.items.get(index).cloned()
    }
}

type AppResult<T> = Result<T, idem::Error>;

#[idempotent]
async fn aliased(amount: u64) -> AppResult<u64> {
    Ok(amount * 2)
}

mod errors {
    pub type Result<T> = std::result::Result<T, idem::Error>;
}

#[idempotent]
async fn path_alias(amount: u64) -> errors::Result<u64> {
    Ok(amount)
}

impl From<idem::Error> for Wrapped {
    fn from(e: idem::Error) -> Self {
        Wrapped(e.to_string())
    }
}
#[derive(Debug)]
struct Wrapped(String);

#[idempotent]
async fn question_mark(input: String) -> Result<u64, Wrapped> {
    let n: u64 = input.parse().map_err(|_| Wrapped("not a number".into()))?;
    let checked = n.checked_add(1).ok_or(Wrapped("overflow".into()))?;
    Ok(checked)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // The functions without `store = ...` run on the global engine.
    let _ = idem::set_global(idem::Idem::new(idem::MemoryStore::new()));
    assert_eq!(echo(vec![1u8, 2]).await.unwrap(), vec![1, 2]);
    assert_eq!(describe(7u32, "x".to_string()).await.unwrap(), "X");
    assert_eq!(aliased(2).await.unwrap(), 4);
    let repo = Repo { items: vec![5u64] };
    assert_eq!(repo.load(0).await.unwrap(), Some(5));
    assert_eq!(path_alias(2).await.unwrap(), 2);
    assert_eq!(question_mark("41".into()).await.unwrap(), 42);
}
