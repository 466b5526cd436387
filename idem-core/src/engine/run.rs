//! The ways to run a call's body: a value, a fallible body, a body whose chosen errors are
//! kept. Each goes through the one state machine in [`execute`](super::execute), which
//! answers what happened; the run method answers the outcome from it, as the call's
//! [`Answer`] says: bare, or as an [`Outcome`](super::Outcome).
//!
//! The three functions at the bottom are the whole path; the methods, and the helpers
//! `#[idempotent]` expands to (`idem::__private::run`...), call them. They return the
//! engine's future with one step after it, not an `async fn` around it that would hold,
//! and move, a copy of it.

use std::future::Future;

use serde::{de::DeserializeOwned, Serialize};

use super::call::Answer;
use super::call::Answers;
use super::complete::{CacheIf, NoCache, ValueEq, ValueOps};
use super::execute::Happened;
use super::Call;
use crate::codec::Codec;
use crate::error::Error;

impl<'a, C: Codec, A: Answer> Call<'a, C, A> {
    /// Runs a body that cannot fail: its value is stored and replayed.
    pub fn run<T, F, Fut>(
        self,
        body: F,
    ) -> impl Future<Output = Result<A::Out<T>, Error>> + use<'a, C, A, T, F, Fut>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
        T: Serialize + DeserializeOwned,
    {
        run(self, ValueOps::NONE, body)
    }

    /// Runs a fallible body: `Ok` is stored and replayed, `Err` releases the claim so that a
    /// retry runs the body again.
    pub fn run_fallible<T, E, F, Fut>(
        self,
        body: F,
    ) -> impl Future<Output = Result<A::Out<T>, E>> + use<'a, C, A, T, E, F, Fut>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
    {
        run_fallible(self, ValueOps::NONE, E::from, body)
    }

    /// Like [`run_fallible`](Self::run_fallible), but an `Err` for which `cache_if` answers
    /// true is stored and replayed like a success (a declined card stays declined). With
    /// an [`Outcome`](super::Outcome), a replayed error is an `Err`, without one.
    pub fn run_caching_errors<T, E, F, Fut, P>(
        self,
        cache_if: P,
        body: F,
    ) -> impl Future<Output = Result<A::Out<T>, E>> + use<'a, C, A, T, E, F, Fut, P>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error> + Serialize + DeserializeOwned,
        P: Fn(&E) -> bool,
    {
        run_caching_errors(self, (ValueOps::NONE, None), cache_if, body)
    }
}

/// Runs a body that cannot fail, with what is known of its value's type ([`ValueOps`]).
pub(crate) fn run<'a, A, T, F, Fut>(
    call: A,
    ops: ValueOps<T>,
    body: F,
) -> impl Future<Output = Result<A::Out<T>, Error>> + use<'a, A, T, F, Fut>
where
    A: Answers + 'a,
    F: FnOnce() -> Fut,
    Fut: Future<Output = T>,
    T: Serialize + DeserializeOwned,
{
    // Its `Err` can only be idem's: the body's never fails, and `NoCache` stores none.
    let body = || async { Ok::<T, Error>(body().await) };
    let happened = call.into_call::<'a>().execute(body, NoCache, ops);
    async move { answer::<A, T, Error>(happened.await, |e| e) }
}

/// Runs a fallible body, with what is known of its value's type and the conversion of
/// idem's own errors into the body's.
pub(crate) fn run_fallible<'a, A, T, E, F, Fut>(
    call: A,
    ops: ValueOps<T>,
    from_idem: fn(Error) -> E,
    body: F,
) -> impl Future<Output = Result<A::Out<T>, E>> + use<'a, A, T, E, F, Fut>
where
    A: Answers + 'a,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    T: Serialize + DeserializeOwned,
{
    let happened = call.into_call::<'a>().execute(body, NoCache, ops);
    async move { answer::<A, T, E>(happened.await, from_idem) }
}

/// Runs a body whose errors for which `cache_if` answers true are stored and replayed,
/// with what is known of the value's type and the `==` of the error's.
pub(crate) fn run_caching_errors<'a, A, T, E, F, Fut, P>(
    call: A,
    (ops, error_eq): (ValueOps<T>, ValueEq<E>),
    cache_if: P,
    body: F,
) -> impl Future<Output = Result<A::Out<T>, E>> + use<'a, A, T, E, F, Fut, P>
where
    A: Answers + 'a,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    T: Serialize + DeserializeOwned,
    E: From<Error> + Serialize + DeserializeOwned,
    P: Fn(&E) -> bool,
{
    let happened = call
        .into_call::<'a>()
        .execute(body, CacheIf(cache_if, error_eq), ops);
    async move { answer::<A, T, E>(happened.await, E::from) }
}

/// What a run method answers from what happened: the outcome as the kind of call `A`
/// answers it, or idem's own error as the body's error type.
fn answer<A: Answers, T, E>(
    happened: Result<Happened<T, E>, Error>,
    from_idem: impl FnOnce(Error) -> E,
) -> Result<A::Out<T>, E> {
    let (out, origin) = happened.map_err(from_idem)?.into_parts();
    out.map(|value| A::answer(value, origin))
}
