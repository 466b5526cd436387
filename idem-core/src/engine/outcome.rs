//! The replay signal: whether a call's result is its own run's or a replay, and from where.
//!
//! A call answers its bare value by default. After [`Call::with_outcome`](super::Call::with_outcome)
//! its run methods answer an [`Outcome`] instead: the value and its [`Origin`]. The choice is
//! a type parameter of the call ([`Answer`]), so that each run method exists once and says
//! in its type what it answers.

/// Where a call's result came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Origin {
    /// This call ran the body, and its result is now stored. Also a body run without
    /// idempotency ([`MissingKey::Run`](crate::MissingKey::Run)).
    Ran,
    /// A replay: the result another call stored, read from the store.
    Store,
    /// A replay from the engine's local cache
    /// ([`IdemBuilder::local_cache`](crate::IdemBuilder::local_cache)), without a store
    /// round trip.
    LocalCache,
}

impl Origin {
    /// Whether the result is a replay of an earlier call's ([`Origin::Store`] or
    /// [`Origin::LocalCache`]).
    pub fn is_replay(self) -> bool {
        !matches!(self, Origin::Ran)
    }
}

/// A call's result and where it came from: what the run methods of a call answer after
/// [`Call::with_outcome`](crate::Call::with_outcome), and what an `#[idempotent]` fn
/// declared to return `Outcome<T>` (or `Result<Outcome<T>, E>`) returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use]
pub struct Outcome<T> {
    value: T,
    origin: Origin,
}

impl<T> Outcome<T> {
    /// An outcome, for tests and doubles of code that returns one.
    pub fn new(value: T, origin: Origin) -> Self {
        Outcome { value, origin }
    }

    /// The value.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// The value, dropping where it came from.
    pub fn into_value(self) -> T {
        self.value
    }

    /// Where the value came from.
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// Whether the value is a replay of an earlier call's result.
    pub fn is_replay(&self) -> bool {
        self.origin.is_replay()
    }

    /// The same origin with the value mapped.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        Outcome {
            value: f(self.value),
            origin: self.origin,
        }
    }
}

/// What a call's run methods answer for a value `T`: `T` itself ([`Bare`], the default) or
/// an [`Outcome<T>`] ([`WithOutcome`]). Sealed: only these two exist.
pub trait Answer: sealed::Sealed {
    /// The answer for a value `T`.
    type Out<T>;
    /// The answer for `value`, which came from `origin`.
    fn answer<T>(value: T, origin: Origin) -> Self::Out<T>;
}

/// A call answers its bare value (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct Bare;

/// A call answers an [`Outcome`]: see [`Call::with_outcome`](crate::Call::with_outcome).
#[derive(Debug, Clone, Copy, Default)]
pub struct WithOutcome;

impl Answer for Bare {
    type Out<T> = T;
    fn answer<T>(value: T, _: Origin) -> T {
        value
    }
}

impl Answer for WithOutcome {
    type Out<T> = Outcome<T>;
    fn answer<T>(value: T, origin: Origin) -> Outcome<T> {
        Outcome::new(value, origin)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Bare {}
    impl Sealed for super::WithOutcome {}
}
