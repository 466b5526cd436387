//! The replay signal: whether a call's result is its own run's or a replay, and from where.
//!
//! A call answers its bare value by default. After [`Call::with_outcome`](super::Call::with_outcome)
//! its run methods answer an [`Outcome`] instead: the value and its [`Origin`].

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
