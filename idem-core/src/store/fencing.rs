//! Who holds a claim: the caller's [`Token`], which the store checks on every write of the
//! holder, and the store's [`Fence`], which orders the holders for the systems a body
//! writes to.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;

/// A fencing token: chosen by the caller of [`Store::claim`](crate::Store::claim) (the engine makes one with
/// [`Token::random`] for each call) and kept by the store as the claim's token. The store
/// accepts `complete`, `extend` and `release` only with the current token, so a holder that
/// outlived its lease cannot overwrite its successor's result.
///
/// Because the caller chooses it, an operation resent with the same token (after a lost
/// reply, or by a client that retries on its own) is recognised as the same operation, not a
/// new one.
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
/// What a store that [assigns fences](crate::Capabilities::assigns_fences) promises:
///
/// - A claim that acquires a key gets a fence larger than that of the key's claim before
///   it, when it takes over an ended lease (`previous + 1` at least, whatever the clock).
/// - A claim resent with the same token answers the same fence.
/// - After the record is gone (released, expired, deleted) the key keeps no number, so the
///   next claim's fence comes from the store's clock: the built-in stores assign
///   `max(previous + 1, clock in microseconds since the Unix epoch)`, computed in the
///   claim's own atomic operation on the store's clock. It is larger than every earlier fence
///   of the key as long as that clock has not been set back between the two claims; if the
///   clock goes backwards, fences stay increasing across takeovers and resends, but a claim
///   of a key that had no record may get a smaller fence than one given before the clock
///   stepped back (until the clock has caught up with it).
///
/// [`Fence::NONE`] (zero) is what a store that assigns no fences answers, and what a record
/// written before fences existed reads as.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Fence(u64);

impl Fence {
    /// No fence: what a store without [`Capabilities::assigns_fences`](crate::Capabilities::assigns_fences) answers.
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
    /// atomic operation.
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

#[cfg(test)]
mod tests {
    use super::*;

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
