//! The ways to run a call's body: a value, a fallible body, a body whose chosen errors are
//! kept. Each goes through the one state machine in [`execute`](super::execute), and answers
//! what the call's [`Answer`] says: the bare value, or an [`Outcome`](crate::Outcome).

use std::convert::Infallible;
use std::future::Future;

use serde::{de::DeserializeOwned, Serialize};

use super::complete::{CacheIf, NoCache, ValueEq};
use super::outcome::Answer;
use super::Call;
use crate::codec::Codec;
use crate::error::Error;

impl<C: Codec, R: Answer> Call<'_, C, R> {
    /// Runs a body that cannot fail: its value is stored and replayed.
    pub async fn run<T, F, Fut>(self, body: F) -> Result<R::Out<T>, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
        T: Serialize + DeserializeOwned,
    {
        self.run_eq(None, body).await
    }

    /// [`run`](Self::run), also comparing the decoded result with `==` when `#[idempotent]`
    /// found that its type has one.
    pub(crate) async fn run_eq<T, F, Fut>(self, eq: ValueEq<T>, body: F) -> Result<R::Out<T>, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
        T: Serialize + DeserializeOwned,
    {
        let (out, origin) = self
            .execute(|| async { Ok::<T, Infallible>(body().await) }, NoCache, eq)
            .await?;
        match out {
            Ok(v) => Ok(R::answer(v, origin)),
            Err(never) => match never {},
        }
    }

    /// Runs a fallible body: `Ok` is stored and replayed, `Err` releases the claim so that a
    /// retry runs the body again.
    pub async fn run_fallible<T, E, F, Fut>(self, body: F) -> Result<R::Out<T>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
    {
        self.run_fallible_eq(None, body).await
    }

    /// [`run_fallible`](Self::run_fallible) with the `==` of the result type, if known.
    pub(crate) async fn run_fallible_eq<T, E, F, Fut>(
        self,
        eq: ValueEq<T>,
        body: F,
    ) -> Result<R::Out<T>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
    {
        match self.execute(body, NoCache, eq).await {
            Ok((out, origin)) => out.map(|v| R::answer(v, origin)),
            Err(e) => Err(E::from(e)),
        }
    }

    /// Like [`run_fallible`](Self::run_fallible), but an `Err` for which `cache_if` answers
    /// true is stored and replayed like a success (a declined card stays declined).
    pub async fn run_caching_errors<T, E, F, Fut, P>(
        self,
        cache_if: P,
        body: F,
    ) -> Result<R::Out<T>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error> + Serialize + DeserializeOwned,
        P: Fn(&E) -> bool,
    {
        self.run_caching_errors_eq(cache_if, (None, None), body)
            .await
    }

    /// [`run_caching_errors`](Self::run_caching_errors) with the `==` of the result and
    /// error types, if known.
    pub(crate) async fn run_caching_errors_eq<T, E, F, Fut, P>(
        self,
        cache_if: P,
        (eq, error_eq): (ValueEq<T>, ValueEq<E>),
        body: F,
    ) -> Result<R::Out<T>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error> + Serialize + DeserializeOwned,
        P: Fn(&E) -> bool,
    {
        match self.execute(body, CacheIf(cache_if, error_eq), eq).await {
            Ok((out, origin)) => out.map(|v| R::answer(v, origin)),
            Err(e) => Err(E::from(e)),
        }
    }
}
