//! The ways to run a call's body: a value, a fallible body, a body whose chosen errors are
//! kept. Each goes through the one state machine in [`execute`](super::execute), and answers
//! what the call's [`Answer`] says: the bare value, or an [`Outcome`](crate::Outcome).
//!
//! They are plain functions that return the engine's future (awaited like an `async fn`):
//! an `async fn` around it would hold, and move, a copy of it.

use std::convert::Infallible;
use std::future::Future;

use serde::{de::DeserializeOwned, Serialize};

use super::complete::{CacheIf, NoCache, ValueEq, ValueOps};
use super::outcome::Answer;
use super::Call;
use crate::codec::Codec;
use crate::error::Error;

impl<'a, C: Codec, R: Answer> Call<'a, C, R> {
    /// Runs a body that cannot fail: its value is stored and replayed.
    pub fn run<T, F, Fut>(
        self,
        body: F,
    ) -> impl Future<Output = Result<R::Out<T>, Error>> + use<'a, C, R, T, F, Fut>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
        T: Serialize + DeserializeOwned,
    {
        self.run_eq(ValueOps::NONE, body)
    }

    /// [`run`](Self::run), also comparing the decoded result with `==` and keeping it
    /// decoded in the local cache when `#[idempotent]` found that its type allows it.
    pub(crate) fn run_eq<T, F, Fut>(
        self,
        eq: ValueOps<T>,
        body: F,
    ) -> impl Future<Output = Result<R::Out<T>, Error>> + use<'a, C, R, T, F, Fut>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
        T: Serialize + DeserializeOwned,
    {
        let body = || async { Ok::<T, Infallible>(body().await) };
        self.execute(body, NoCache, eq, |res| {
            let (out, origin) = res?;
            match out {
                Ok(v) => Ok(R::answer(v, origin)),
                Err(never) => match never {},
            }
        })
    }

    /// Runs a fallible body: `Ok` is stored and replayed, `Err` releases the claim so that a
    /// retry runs the body again.
    pub fn run_fallible<T, E, F, Fut>(
        self,
        body: F,
    ) -> impl Future<Output = Result<R::Out<T>, E>> + use<'a, C, R, T, E, F, Fut>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
    {
        self.run_fallible_with(ValueOps::NONE, E::from, body)
    }

    /// [`run_fallible`](Self::run_fallible) with what is known of the result type (see
    /// [`ValueOps`]), and the conversion of idem's own errors into the body's.
    pub(crate) fn run_fallible_with<T, E, F, Fut, I>(
        self,
        eq: ValueOps<T>,
        from_idem: I,
        body: F,
    ) -> impl Future<Output = Result<R::Out<T>, E>> + use<'a, C, R, T, E, F, Fut, I>
    where
        I: FnOnce(Error) -> E,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
    {
        self.execute(body, NoCache, eq, |res| match res {
            Ok((out, origin)) => out.map(|v| R::answer(v, origin)),
            Err(e) => Err(from_idem(e)),
        })
    }

    /// Like [`run_fallible`](Self::run_fallible), but an `Err` for which `cache_if` answers
    /// true is stored and replayed like a success (a declined card stays declined).
    pub fn run_caching_errors<T, E, F, Fut, P>(
        self,
        cache_if: P,
        body: F,
    ) -> impl Future<Output = Result<R::Out<T>, E>> + use<'a, C, R, T, E, F, Fut, P>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error> + Serialize + DeserializeOwned,
        P: Fn(&E) -> bool,
    {
        self.run_caching_errors_eq(cache_if, (ValueOps::NONE, None), body)
    }

    /// [`run_caching_errors`](Self::run_caching_errors) with what is known of the result
    /// type and the `==` of the error type.
    pub(crate) fn run_caching_errors_eq<T, E, F, Fut, P>(
        self,
        cache_if: P,
        (eq, error_eq): (ValueOps<T>, ValueEq<E>),
        body: F,
    ) -> impl Future<Output = Result<R::Out<T>, E>> + use<'a, C, R, T, E, F, Fut, P>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error> + Serialize + DeserializeOwned,
        P: Fn(&E) -> bool,
    {
        self.execute(body, CacheIf(cache_if, error_eq), eq, |res| match res {
            Ok((out, origin)) => out.map(|v| R::answer(v, origin)),
            Err(e) => Err(E::from(e)),
        })
    }
}
