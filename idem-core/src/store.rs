//! The store contract: what every backend implements.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use serde::Serialize;

use crate::digest;
use crate::error::StoreError;
use crate::key::Key;

/// A fencing token: chosen by the caller of [`Store::claim`] (the engine makes one with
/// [`Token::random`] for each call) and kept by the store as the claim's token. The store
/// accepts `complete`, `extend` and `release` only with the current token, so a holder that
/// outlived its lease cannot overwrite its successor's result.
///
/// Because the caller chooses it, a step resent with the same token (after a lost reply, or
/// by a client that retries on its own) is recognised as the same step, not a new one.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token(pub(crate) u64);

impl Token {
    /// The token a store kept as the number `n` (what [`get`](Token::get) gave it). For
    /// stores reading a token back and for tests; a caller's own token comes from
    /// [`Token::random`].
    pub const fn from_u64(n: u64) -> Token {
        Token(n)
    }

    /// The token as a number, for a store to keep.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// A token no other call of this process has had, and that another process repeats
    /// with odds of 2^-64: a SplitMix64 sequence (a bijection of a counter, so no repeat
    /// within 2^64 calls) from a per-process random start. Each thread takes the counter in
    /// blocks of 1,024 values and counts through its block alone, so that threads
    /// calling at once do not contend for one shared counter on every call.
    pub fn random() -> Token {
        const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;
        thread_local! {
            /// The next counter value of this thread's block, and how many are left in it.
            static BLOCK: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
        }
        static STATE: LazyLock<AtomicU64> = LazyLock::new(|| {
            // std's RandomState is seeded from the OS; the pid and the time keep two
            // processes apart even where that seed were weak.
            let mut h = RandomState::new().build_hasher();
            h.write_u32(std::process::id());
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            h.write_u128(nanos);
            AtomicU64::new(h.finish())
        });
        // The first of `n` counter values taken from the process's counter.
        let take = |n: u64| {
            STATE
                .fetch_add(GAMMA.wrapping_mul(n), Ordering::Relaxed)
                .wrapping_add(GAMMA)
        };
        let mut z = BLOCK
            .try_with(|block| {
                let (mut next, mut left) = block.get();
                if left == 0 {
                    (next, left) = (take(TOKEN_BLOCK), TOKEN_BLOCK);
                }
                block.set((next.wrapping_add(GAMMA), left - 1));
                next
            })
            // A thread being torn down takes a block of one.
            .unwrap_or_else(|_| take(1));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Token(z ^ (z >> 31))
    }
}

/// How many counter values of [`Token::random`] a thread takes at once.
const TOKEN_BLOCK: u64 = 1024;

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({:#018x})", self.0)
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A claim's fence: a number the store assigns to each claim of a key, larger than that of
/// every earlier claim of the key, for fencing writes the body makes outside the store.
///
/// The [`Token`] and the fence do two jobs. The token is the caller's and identifies the
/// holder to the store: `complete`, `extend` and `release` take it, and a claim resent with
/// it is the same claim. The fence is the store's and orders the holders for everyone else:
/// a body hands it to the system it writes to, which keeps the highest fence it has seen
/// and refuses a write with a lower one (`UPDATE accounts SET ..., fence = $1 WHERE id = $2
/// AND fence < $1`), so a holder that outlived its lease cannot overwrite what its successor
/// wrote there either. A body reads its fence with [`fence()`](crate::fence).
///
/// What a store that [assigns fences](Capabilities::assigns_fences) promises:
///
/// - A claim that acquires a key gets a fence larger than that of the key's claim before
///   it, when it takes over an ended lease (`previous + 1` at least, whatever the clock).
/// - A claim resent with the same token answers the same fence.
/// - After the record is gone (released, expired, deleted) the key keeps no number, so the
///   next claim's fence comes from the store's clock: the built-in stores assign
///   `max(previous + 1, clock in microseconds since the Unix epoch)`, computed in the
///   claim's own atomic step on the store's clock. It is larger than every earlier fence
///   of the key as long as that clock has not been set back between the two claims; if the
///   clock goes backwards, fences stay increasing across takeovers and resends, but a claim
///   of a key that had no record may get a smaller fence than one given before the step
///   back (until the clock has caught up with it).
///
/// [`Fence::NONE`] (zero) is what a store that assigns no fences answers, and what a record
/// written before fences existed reads as.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Fence(u64);

impl Fence {
    /// No fence: what a store without [`Capabilities::assigns_fences`] answers.
    pub const NONE: Fence = Fence(0);

    /// The fence a store assigned as the number `n`.
    pub const fn from_u64(n: u64) -> Fence {
        Fence(n)
    }

    /// The fence as a number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The fence as a signed 64-bit integer, for a SQL `BIGINT` column of your own. The
    /// built-in stores keep fences below 2^63 (their clocks in microseconds reach it in
    /// the year 294,000), so this loses nothing for them; a larger fence saturates.
    pub const fn as_i64(self) -> i64 {
        if self.0 > i64::MAX as u64 {
            i64::MAX
        } else {
            self.0 as i64
        }
    }

    /// The next fence after `previous` on a clock reading `clock`: `max(previous + 1,
    /// clock)`, what the built-in stores assign (each in its own language) in the claim's
    /// atomic step.
    pub const fn next(previous: Fence, clock: u64) -> Fence {
        let after = previous.0.saturating_add(1);
        Fence(if after > clock { after } else { clock })
    }
}

impl fmt::Debug for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fence({})", self.0)
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A 128-bit digest of a request's payload. The same key with a different fingerprint is
/// refused ([`Error::KeyReuse`](crate::Error::KeyReuse)). [`Fingerprint::NONE`] turns the
/// check off: it matches every fingerprint.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub(crate) [u8; 16]);

impl Fingerprint {
    /// No fingerprint: matches any other.
    pub const NONE: Fingerprint = Fingerprint([0; 16]);

    /// The fingerprint of a value, through the same fixed encoding as key digests (but a
    /// different blake3 context, so the two never coincide).
    pub fn of<T: Serialize + ?Sized>(value: &T) -> Fingerprint {
        Fingerprint::reserved(digest::fingerprint_bytes(value))
    }

    /// The fingerprint of the value whose canonical encoding is `encoding`: the same as
    /// [`of`](Fingerprint::of) that value.
    pub(crate) fn of_encoding(encoding: &[u8]) -> Fingerprint {
        Fingerprint::reserved(digest::fingerprint_of_encoding(encoding))
    }

    fn reserved(mut bytes: [u8; 16]) -> Fingerprint {
        if bytes == [0; 16] {
            // Keep NONE reserved; a real digest of zero has odds of 2^-128.
            bytes[15] = 1;
        }
        Fingerprint(bytes)
    }

    /// Whether a request with this fingerprint may use a record with `other`.
    pub fn matches(&self, other: &Fingerprint) -> bool {
        *self == Fingerprint::NONE || *other == Fingerprint::NONE || self == other
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The fingerprint a store kept as `bytes` (what [`as_bytes`](Fingerprint::as_bytes)
    /// gave it; sixteen zeros are [`Fingerprint::NONE`]).
    pub const fn from_bytes(bytes: [u8; 16]) -> Fingerprint {
        Fingerprint(bytes)
    }

    /// Builds a fingerprint from 16 bytes read back from a store.
    pub fn from_slice(bytes: &[u8]) -> Option<Fingerprint> {
        <[u8; 16]>::try_from(bytes).ok().map(Fingerprint)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Fingerprint(")?;
        for b in &self.0[..6] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("..)")
    }
}

/// The answer of [`Store::claim`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Claim {
    /// The caller now holds the key under a lease and must run the body.
    Acquired {
        /// The fencing token of this claim: the one the caller gave.
        token: Token,
        /// Whether an earlier claim's lease had ended and this one took the key over.
        recovered: bool,
        /// The claim's fence, assigned by the store: larger than the fence of every earlier
        /// claim of the key (see [`Fence`]), the same for a resent claim.
        /// [`Fence::NONE`] from a store without [`Capabilities::assigns_fences`].
        fence: Fence,
    },
    /// Another claim holds the key and its lease has not ended.
    InProgress {
        /// The fingerprint of the request holding the key.
        fingerprint: Fingerprint,
        /// How long that claim's lease still runs. (The engine's
        /// [`Error::InProgress`](crate::Error::InProgress) gives a shorter hint, bounded
        /// by this one.)
        retry_after: Duration,
    },
    /// The key has a stored result.
    Completed {
        /// The fingerprint of the request that stored it.
        fingerprint: Fingerprint,
        /// The stored bytes (a record envelope).
        payload: Bytes,
    },
}

/// What [`Store::get`] sees under a key.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Record {
    /// Held by a claim whose lease has not ended.
    InProgress {
        /// The fingerprint of the request holding the key.
        fingerprint: Fingerprint,
        /// The current fencing token.
        token: Token,
        /// How long the lease still runs.
        lease_remaining: Duration,
    },
    /// A stored result within its time to live.
    Completed {
        /// The fingerprint of the request that stored it.
        fingerprint: Fingerprint,
        /// The stored bytes.
        payload: Bytes,
    },
}

/// What a backend can and cannot do beyond the contract. The conformance suite checks
/// each flag both ways.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// [`Store::wait`] returns as soon as a record completes or is released, instead of
    /// sleeping out its time (callers then poll with backoff).
    pub wakes_waiters: bool,
    /// A claim that takes over an in-progress record whose lease ended answers
    /// `Claim::Acquired { recovered: true }`: the store keeps an ended lease long enough to
    /// tell a takeover from a fresh key. Without it, such a takeover answers
    /// `recovered: false`, as for a key never used.
    pub reports_recovery: bool,
    /// Every `Claim::Acquired` carries a [`Fence`] larger than that of every earlier claim
    /// of the key, and a resent claim the same fence again: the promise [`Fence`] spells
    /// out. Every built-in store assigns fences. Without it (the default, for a store
    /// written before fences existed), claims answer [`Fence::NONE`] and a body's
    /// [`fence()`](crate::fence) is `None`: there is nothing to fence its writes with.
    pub assigns_fences: bool,
    /// [`Store::replace`] swaps a completed record for another, or deletes it, in one atomic
    /// step that compares its payload first. Every built-in store replaces records; the
    /// engine needs it to resolve a step's unknown outcome ([`Idem::resolve`](crate::Idem::resolve)),
    /// and refuses to resolve on a store without it rather than risk deleting what another
    /// resolution or a running attempt wrote.
    pub replaces_records: bool,
}

impl Capabilities {
    /// No optional capability.
    pub const NONE: Capabilities = Capabilities {
        wakes_waiters: false,
        reports_recovery: false,
        assigns_fences: false,
        replaces_records: false,
    };

    /// Sets [`Capabilities::replaces_records`].
    pub const fn with_replaces_records(mut self, yes: bool) -> Self {
        self.replaces_records = yes;
        self
    }

    /// Sets [`Capabilities::assigns_fences`].
    pub const fn with_assigns_fences(mut self, yes: bool) -> Self {
        self.assigns_fences = yes;
        self
    }

    /// Sets [`Capabilities::reports_recovery`].
    pub const fn with_reports_recovery(mut self, yes: bool) -> Self {
        self.reports_recovery = yes;
        self
    }

    /// Sets [`Capabilities::wakes_waiters`].
    pub const fn with_wakes_waiters(mut self, yes: bool) -> Self {
        self.wakes_waiters = yes;
        self
    }
}

/// Where idempotency records live. Every step is atomic on one key.
///
/// Time (lease and record expiry) is the store's own clock: Redis `PX`, Postgres `now()`,
/// tokio's clock in memory; never one client's wall clock.
///
/// A step repeated with the same token has the effect of one: a client or a network that
/// resends a claim, complete, extend or release after losing its reply gets the answer of
/// the first, and the record is as the first left it.
///
/// Every backend passes the conformance suite in `idem::testing` (feature `testing`).
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// In one atomic step: no live record, or an in-progress record whose lease has ended,
    /// becomes an in-progress record held for `lease` under `token` (`Acquired`,
    /// `recovered` when a lease was taken over); a live in-progress record answers
    /// `InProgress`, unless it is held by `token` itself: then this is a resent claim,
    /// answered `Acquired { token, recovered: false, fence }` with the fence it was first
    /// given, and the record left unchanged; a completed record answers `Completed` with its
    /// payload.
    ///
    /// `token` must be new for every call ([`Token::random`]); it is the claim's fencing
    /// token. A store that [assigns fences](Capabilities::assigns_fences) gives each claim
    /// that acquires the key a [`Fence`] larger than the one before, in the same atomic
    /// step; any other store answers [`Fence::NONE`].
    async fn claim(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError>;

    /// Stores the result for `ttl` if `token` is current; [`StoreError::Fenced`] otherwise.
    /// Repeated after it succeeded (the record is completed under `token` and live), it
    /// answers `Ok` and leaves the stored record (payload and expiry) as it is.
    async fn complete(
        &self,
        key: &Key,
        token: Token,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError>;

    /// Deletes the in-progress record if `token` is current, so that a retry runs again.
    /// When the key holds no record at all (a repeat: the first release deleted it), `Ok`;
    /// [`StoreError::Fenced`] when it holds anything else: another token's claim, an ended
    /// lease, or a completed record.
    async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError>;

    /// Sets the lease of the in-progress record to `lease` from now if `token` is current
    /// (so a repeat sets the same deadline again, it does not add up);
    /// [`StoreError::Fenced`] otherwise.
    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError>;

    /// The live record under `key`, if any.
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError>;

    /// Deletes whatever lives under `key`; whether there was something.
    async fn delete(&self, key: &Key) -> Result<bool, StoreError>;

    /// In one atomic step: when the live record under `key` is a completed one whose payload
    /// is exactly `expected`, replaces it by `new` and answers `true`; anything else (no live
    /// record, an in-progress claim, another payload) is left as it is and answers `false`.
    /// `new` is the payload that takes its place (the record keeps its fingerprint and lives
    /// for the duration given, from now), or `None` to delete it.
    ///
    /// This is how a step's unknown outcome is resolved without ever deleting what another
    /// resolution, or an attempt that started since, wrote. A store that offers it sets
    /// [`Capabilities::replaces_records`]; the default answers a [`StoreError::Backend`]
    /// saying it does not.
    async fn replace(
        &self,
        key: &Key,
        expected: &[u8],
        new: Option<(Bytes, Duration)>,
    ) -> Result<bool, StoreError> {
        let _ = (key, expected, new);
        Err(StoreError::Backend {
            backend: self.backend(),
            source: "this store does not replace records (`Store::replace`)".into(),
        })
    }

    /// Waits up to `at_most` for the record under `key` to change (complete or release).
    /// It may return early for no reason; callers claim again after it. The default sleeps
    /// `at_most`, and callers poll with capped backoff.
    async fn wait(&self, key: &Key, at_most: Duration) -> Result<(), StoreError> {
        let _ = key;
        tokio::time::sleep(at_most).await;
        Ok(())
    }

    /// What this backend offers beyond the contract.
    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
    }

    /// The backend's name, as errors and logs show it: `"memory"`, `"sqlite"`,
    /// `"postgres"`, `"mysql"`, `"redis"`, `"redis-cluster"`; `"custom"` unless a store says
    /// otherwise.
    /// The engine names it in the [`StoreError::Timeout`] of an operation that ran out of time.
    fn backend(&self) -> &'static str {
        "custom"
    }

    /// How long an operation of this store takes at most, when the store bounds each one itself:
    /// `Some(d)` promises that [`claim`](Store::claim), [`complete`](Store::complete),
    /// [`release`](Store::release), [`extend`](Store::extend), [`get`](Store::get) and
    /// [`delete`](Store::delete) each answer within `d`, with a [`StoreError::Timeout`]
    /// naming the operation if nothing else. The engine then runs such an operation under no
    /// timer of its own when `d` is within its limit (the store timeout; for a complete, also
    /// no more than what is left of the lease), rather than under two (the Redis store
    /// bounds each script by its command timeout). [`wait`](Store::wait) is not covered: it
    /// is always timed by the engine. `None`, the default, promises nothing.
    fn step_bound(&self) -> Option<Duration> {
        None
    }
}

macro_rules! forward_store {
    ($($ty:ty),*) => {$(
        #[async_trait]
        impl<S: Store + ?Sized> Store for $ty {
            async fn claim(&self, key: &Key, fingerprint: &Fingerprint, token: Token, lease: Duration) -> Result<Claim, StoreError> {
                (**self).claim(key, fingerprint, token, lease).await
            }
            async fn complete(&self, key: &Key, token: Token, payload: Bytes, ttl: Duration) -> Result<(), StoreError> {
                (**self).complete(key, token, payload, ttl).await
            }
            async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError> {
                (**self).release(key, token).await
            }
            async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
                (**self).extend(key, token, lease).await
            }
            async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
                (**self).get(key).await
            }
            async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
                (**self).delete(key).await
            }
            async fn replace(&self, key: &Key, expected: &[u8], new: Option<(Bytes, Duration)>) -> Result<bool, StoreError> {
                (**self).replace(key, expected, new).await
            }
            async fn wait(&self, key: &Key, at_most: Duration) -> Result<(), StoreError> {
                (**self).wait(key, at_most).await
            }
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            fn backend(&self) -> &'static str {
                (**self).backend()
            }
            fn step_bound(&self) -> Option<Duration> {
                (**self).step_bound()
            }
        }
    )*};
}
// `Box<S>` is a `StoreWrapper` (see wrapper.rs), and a store through it.
forward_store!(Arc<S>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_of_an_encoding_is_the_fingerprint_of_its_value() {
        #[derive(serde::Serialize)]
        struct Charge<'a> {
            order_id: &'a str,
            amount_cents: u64,
            tags: Vec<&'a str>,
        }
        let charge = Charge {
            order_id: "o-1",
            amount_cents: 1250,
            tags: vec!["a", "b"],
        };
        let values: [&dyn erased::Value; 4] = [&("order", 42u32), &charge, &(), &Some(-0.0f64)];
        for value in values {
            let encoding = value.encoding();
            assert_eq!(Fingerprint::of_encoding(&encoding), value.fingerprint());
        }
        // An encoding longer than asked for is not kept.
        assert!(crate::digest::encoding(&charge, 8).is_none());
    }

    /// Values of several types behind one trait, for the test above.
    mod erased {
        use super::Fingerprint;
        pub trait Value {
            fn encoding(&self) -> Box<[u8]>;
            fn fingerprint(&self) -> Fingerprint;
        }
        impl<T: serde::Serialize> Value for T {
            fn encoding(&self) -> Box<[u8]> {
                crate::digest::encoding(self, usize::MAX).expect("encodes")
            }
            fn fingerprint(&self) -> Fingerprint {
                Fingerprint::of(self)
            }
        }
    }

    #[test]
    fn random_tokens_do_not_repeat() {
        let tokens: std::collections::HashSet<_> = (0..100_000).map(|_| Token::random()).collect();
        assert_eq!(tokens.len(), 100_000);
    }

    #[test]
    fn random_tokens_do_not_repeat_across_threads() {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| (0..10_000).map(|_| Token::random()).collect::<Vec<_>>())
            })
            .collect();
        let mut all = std::collections::HashSet::new();
        for t in threads {
            for token in t.join().unwrap() {
                assert!(all.insert(token), "{token:?} was handed out twice");
            }
        }
    }
}
