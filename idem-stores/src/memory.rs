//! `MemoryStore`: records in a `DashMap`, on tokio's clock. The default store, and what
//! unit tests use: `tokio::time::pause()` and `advance()` drive its leases and expiry.

use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use idem_core::{Capabilities, Claim, Fence, Fingerprint, Key, Record, Store, StoreError, Token};
use tokio::sync::Notify;
use tokio::time::Instant;

/// How often, at most, a claim sweeps out ended records.
const DEFAULT_SWEEP_EVERY: Duration = Duration::from_secs(1);
/// How long an in-progress record whose lease ended is kept before a sweep drops it, so
/// that the claim taking it over can still tell it is a recovery (and log it).
const ABANDONED_GRACE: Duration = Duration::from_secs(60);

/// An in-process store. Records live as long as the process (or their ttl); clones share
/// the same records.
///
/// Ended records (expired results, and leases that ended over a minute ago) are swept by
/// claims that come at least a second apart, and by [`MemoryStore::purge_expired`], so the map does not grow
/// without bound. No map guard is ever held across an `.await`.
#[derive(Clone, Default)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

struct Shared {
    /// Each state boxed: the map's table, which runs between half and seven eighths full,
    /// then holds a key and a pointer (32 bytes) per slot instead of the whole state; at
    /// 1,000,000 records that saves about 100 bytes a record (`idem-integration/benches/footprint.rs`).
    records: DashMap<Key, Box<State>>,
    /// One `Notify` per key that has waiters; removed when the last waiter leaves.
    waiters: DashMap<Key, Arc<Notify>>,
    origin: Instant,
    /// Milliseconds after `origin` of the last sweep.
    last_sweep_ms: AtomicU64,
    sweep_every: Duration,
    /// The wall clock at `origin`, in microseconds since the Unix epoch: with tokio's clock
    /// after it, the clock fences start from.
    origin_us: u64,
    /// The last fence given, to any key: each claim that acquires takes a larger one.
    last_fence: AtomicU64,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            records: DashMap::new(),
            waiters: DashMap::new(),
            origin: Instant::now(),
            last_sweep_ms: AtomicU64::new(0),
            sweep_every: DEFAULT_SWEEP_EVERY,
            origin_us: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
            last_fence: AtomicU64::new(0),
        }
    }
}

/// One waiter's share of a key's `Notify`: the entry is created by the first waiter of a
/// key and removed by the last one to leave, however it leaves.
struct Waiting<'a> {
    waiters: &'a DashMap<Key, Arc<Notify>>,
    key: &'a Key,
    notify: Option<Arc<Notify>>,
}

impl<'a> Waiting<'a> {
    fn enter(waiters: &'a DashMap<Key, Arc<Notify>>, key: &'a Key) -> Self {
        let notify = waiters
            .entry(key.clone())
            .or_insert_with(|| Arc::new(Notify::new()))
            .clone();
        Waiting {
            waiters,
            key,
            notify: Some(notify),
        }
    }

    fn notify(&self) -> &Notify {
        self.notify.as_deref().expect("held until dropped")
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        // Our clone goes first, so that the last waiter sees only the map's own.
        drop(self.notify.take());
        self.waiters
            .remove_if(self.key, |_, n| Arc::strong_count(n) == 1);
    }
}

/// `now + d`, saturating at the engine's longest duration instead of panicking on
/// overflow when a caller hands the store a huge lease or ttl directly.
fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .unwrap_or_else(|| now + idem_core::MAX_DURATION)
}

#[derive(Clone)]
enum State {
    InProgress {
        fingerprint: Fingerprint,
        token: Token,
        lease_until: Instant,
        /// The claim's fence, answered again to a resent claim.
        fence: Fence,
    },
    Completed {
        fingerprint: Fingerprint,
        /// The token that completed it, so that a repeated complete is recognised.
        token: Token,
        payload: Bytes,
        expires_at: Instant,
    },
}

impl State {
    /// When the record stops counting: its lease ends or its ttl runs out.
    fn ends_at(&self) -> Instant {
        match self {
            State::InProgress { lease_until, .. } => *lease_until,
            State::Completed { expires_at, .. } => *expires_at,
        }
    }

    /// When a sweep may drop the record.
    fn sweepable_at(&self) -> Instant {
        match self {
            State::InProgress { lease_until, .. } => *lease_until + ABANDONED_GRACE,
            State::Completed { expires_at, .. } => *expires_at,
        }
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("records", &self.shared.records.len())
            .finish()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many records the map holds, ended ones not yet swept included.
    pub fn len(&self) -> usize {
        self.shared.records.len()
    }

    /// Whether the map holds no record.
    pub fn is_empty(&self) -> bool {
        self.shared.records.is_empty()
    }

    /// How many keys have a waiter entry: the tests' way to see that none is left behind.
    #[cfg(test)]
    fn waiter_entries(&self) -> usize {
        self.shared.waiters.len()
    }

    /// Removes every ended record now (in-progress ones a minute after their lease ended);
    /// returns how many.
    pub fn purge_expired(&self) -> usize {
        let now = Instant::now();
        let before = self.shared.records.len();
        self.shared
            .records
            .retain(|_, state| state.sweepable_at() > now);
        self.note_sweep(now);
        before.saturating_sub(self.shared.records.len())
    }

    fn note_sweep(&self, now: Instant) {
        let ms = now.duration_since(self.shared.origin).as_millis() as u64;
        self.shared.last_sweep_ms.store(ms, Ordering::Relaxed);
    }

    fn maybe_sweep(&self, now: Instant) {
        let now_ms = now.duration_since(self.shared.origin).as_millis() as u64;
        let last = self.shared.last_sweep_ms.load(Ordering::Relaxed);
        let every = self.shared.sweep_every.as_millis() as u64;
        if now_ms.saturating_sub(last) < every {
            return;
        }
        // One sweeper at a time; the others go on.
        if self
            .shared
            .last_sweep_ms
            .compare_exchange(last, now_ms, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.shared
                .records
                .retain(|_, state| state.sweepable_at() > now);
        }
    }

    /// A fence larger than every fence this store gave before, to any key:
    /// `max(last + 1, clock)`, where the clock is the wall clock when the store was made
    /// plus tokio's clock since, in microseconds. One counter for the whole store, so that
    /// fences increase across a release, an expiry and a sweep, which leave nothing under
    /// the key; the clock keeps a new process's fences above those of the one before it
    /// (unless the wall clock was set back between the two).
    fn next_fence(&self, now: Instant) -> Fence {
        let elapsed = now
            .saturating_duration_since(self.shared.origin)
            .as_micros();
        let clock = self
            .shared
            .origin_us
            .saturating_add(u64::try_from(elapsed).unwrap_or(u64::MAX));
        let mut last = self.shared.last_fence.load(Ordering::Relaxed);
        loop {
            let next = Fence::next(Fence::from_u64(last), clock);
            match self.shared.last_fence.compare_exchange_weak(
                last,
                next.get(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return next,
                Err(seen) => last = seen,
            }
        }
    }

    fn wake(&self, key: &Key) {
        if let Some(n) = self.shared.waiters.get(key) {
            n.notify_waiters();
        }
    }

    /// Applies `f` to the in-progress record held by `token` whose lease has not ended;
    /// `Fenced` otherwise. `f` returns the new state, or `None` to delete the record.
    ///
    /// A record that `token` already completed and that has not expired is left as it is
    /// and answers `Ok` when `f` would complete it (`repeat_of_complete`): the repeat of a
    /// complete that succeeded. Checked under the same entry lock, so a repeat racing its
    /// original is told apart too.
    fn with_held(
        &self,
        key: &Key,
        token: Token,
        repeat_of_complete: bool,
        f: impl FnOnce(&Fingerprint, Fence) -> Option<State>,
    ) -> Result<(), StoreError> {
        let now = Instant::now();
        match self.shared.records.entry(key.clone()) {
            Entry::Occupied(mut e) => match &**e.get() {
                State::Completed {
                    token: by,
                    expires_at,
                    ..
                } if repeat_of_complete && *by == token && *expires_at > now => Ok(()),
                State::InProgress {
                    token: held,
                    lease_until,
                    fingerprint,
                    fence,
                } if *held == token && *lease_until > now => {
                    let (fingerprint, fence) = (*fingerprint, *fence);
                    match f(&fingerprint, fence) {
                        // In the same box: a complete or an extend allocates nothing.
                        Some(next) => **e.get_mut() = next,
                        None => {
                            e.remove();
                        }
                    }
                    Ok(())
                }
                _ => Err(StoreError::Fenced),
            },
            Entry::Vacant(_) => Err(StoreError::Fenced),
        }
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn claim(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let now = Instant::now();
        self.maybe_sweep(now);
        // Taken under the entry's lock, so that two claims of a key get their fences in
        // the order they hold it.
        let held = |fence| State::InProgress {
            fingerprint: *fingerprint,
            token,
            lease_until: later(now, lease),
            fence,
        };
        Ok(match self.shared.records.entry(key.clone()) {
            Entry::Vacant(v) => {
                let fence = self.next_fence(now);
                v.insert(Box::new(held(fence)));
                Claim::Acquired {
                    token,
                    recovered: false,
                    fence,
                }
            }
            Entry::Occupied(mut e) => match &**e.get() {
                State::Completed {
                    fingerprint,
                    payload,
                    expires_at,
                    ..
                } if *expires_at > now => Claim::Completed {
                    fingerprint: *fingerprint,
                    payload: payload.clone(),
                },
                // The caller's own claim, resent: the same claim, left as it is.
                State::InProgress {
                    token: holder,
                    lease_until,
                    fence,
                    ..
                } if *lease_until > now && *holder == token => Claim::Acquired {
                    token,
                    recovered: false,
                    fence: *fence,
                },
                State::InProgress {
                    fingerprint,
                    lease_until,
                    ..
                } if *lease_until > now => Claim::InProgress {
                    fingerprint: *fingerprint,
                    retry_after: *lease_until - now,
                },
                ended => {
                    let recovered = matches!(ended, State::InProgress { .. });
                    let fence = self.next_fence(now);
                    **e.get_mut() = held(fence);
                    Claim::Acquired {
                        token,
                        recovered,
                        fence,
                    }
                }
            },
        })
    }

    async fn complete(
        &self,
        key: &Key,
        token: Token,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let expires_at = later(Instant::now(), ttl);
        self.with_held(key, token, true, |fp, _| {
            Some(State::Completed {
                fingerprint: *fp,
                token,
                payload,
                expires_at,
            })
        })?;
        self.wake(key);
        Ok(())
    }

    async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError> {
        match self.with_held(key, token, false, |_, _| None) {
            // Nothing under the key: a repeat whose first release deleted the claim.
            Err(StoreError::Fenced) if !self.shared.records.contains_key(key) => Ok(()),
            Err(e) => Err(e),
            Ok(()) => {
                self.wake(key);
                Ok(())
            }
        }
    }

    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
        let lease_until = later(Instant::now(), lease);
        self.with_held(key, token, false, |fp, fence| {
            Some(State::InProgress {
                fingerprint: *fp,
                token,
                lease_until,
                fence,
            })
        })
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let now = Instant::now();
        let Some(state) = self.shared.records.get(key).map(|s| State::clone(&s)) else {
            return Ok(None);
        };
        Ok(match state {
            State::InProgress {
                fingerprint,
                token,
                lease_until,
                ..
            } if lease_until > now => Some(Record::InProgress {
                fingerprint,
                token,
                lease_remaining: lease_until - now,
            }),
            State::Completed {
                fingerprint,
                payload,
                expires_at,
                ..
            } if expires_at > now => Some(Record::Completed {
                fingerprint,
                payload,
            }),
            _ => None,
        })
    }

    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        let now = Instant::now();
        let removed = self.shared.records.remove(key);
        self.wake(key);
        Ok(removed.is_some_and(|(_, state)| state.ends_at() > now))
    }

    async fn replace(
        &self,
        key: &Key,
        expected: &[u8],
        new: Option<(Bytes, Duration)>,
    ) -> Result<bool, StoreError> {
        let now = Instant::now();
        let Entry::Occupied(mut entry) = self.shared.records.entry(key.clone()) else {
            return Ok(false);
        };
        let State::Completed {
            fingerprint,
            token,
            payload,
            expires_at,
        } = &**entry.get()
        else {
            return Ok(false);
        };
        if *expires_at <= now || payload[..] != *expected {
            return Ok(false);
        }
        match new {
            Some((payload, ttl)) => {
                let (fingerprint, token) = (*fingerprint, *token);
                entry.insert(Box::new(State::Completed {
                    fingerprint,
                    token,
                    payload,
                    expires_at: later(now, ttl),
                }));
                drop(entry);
            }
            None => {
                entry.remove();
            }
        }
        self.wake(key);
        Ok(true)
    }

    async fn wait(&self, key: &Key, at_most: Duration) -> Result<(), StoreError> {
        // The guard leaves the map when the wait ends or is cancelled (the caller's timeout
        // or a dropped call drops this future at the `.await`), not only when it returns.
        let waiting = Waiting::enter(&self.shared.waiters, key);
        let mut notified = pin!(waiting.notify().notified());
        notified.as_mut().enable();
        // Look again after registering, so a change that came in between is not missed.
        let still_held = matches!(
            self.shared.records.get(key).map(|s| State::clone(&s)),
            Some(State::InProgress { lease_until, .. }) if lease_until > Instant::now()
        );
        if still_held {
            let _ = tokio::time::timeout(at_most, notified).await;
        }
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
            .with_wakes_waiters(true)
            .with_reports_recovery(true)
            .with_assigns_fences(true)
            .with_replaces_records(true)
    }

    fn backend(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> Key {
        Key::new("memory-tests", id).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn expired_records_are_swept() {
        let store = MemoryStore::new();
        for i in 0..1000 {
            let k = key(&format!("k{i}"));
            let Claim::Acquired { token, .. } = store
                .claim(
                    &k,
                    &Fingerprint::NONE,
                    Token::random(),
                    Duration::from_secs(5),
                )
                .await
                .unwrap()
            else {
                panic!("fresh key not acquired");
            };
            store
                .complete(&k, token, Bytes::from_static(b"v"), Duration::from_secs(60))
                .await
                .unwrap();
        }
        assert_eq!(store.len(), 1000);
        tokio::time::advance(Duration::from_secs(61)).await;
        // One claim after the sweep interval sweeps everything that ended.
        store
            .claim(
                &key("fresh"),
                &Fingerprint::NONE,
                Token::random(),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        assert_eq!(store.len(), 1, "only the fresh claim is left");
    }

    #[tokio::test(start_paused = true)]
    async fn live_records_survive_a_sweep_and_purge_counts() {
        let store = MemoryStore::new();
        let short = key("short");
        let long = key("long");
        for (k, ttl) in [(&short, 10), (&long, 100)] {
            let Claim::Acquired { token, .. } = store
                .claim(
                    k,
                    &Fingerprint::NONE,
                    Token::random(),
                    Duration::from_secs(5),
                )
                .await
                .unwrap()
            else {
                panic!();
            };
            store
                .complete(k, token, Bytes::new(), Duration::from_secs(ttl))
                .await
                .unwrap();
        }
        tokio::time::advance(Duration::from_secs(50)).await;
        assert_eq!(store.purge_expired(), 1);
        assert!(store.get(&long).await.unwrap().is_some());
        assert!(store.get(&short).await.unwrap().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_map_is_emptied_after_waiting() {
        let store = MemoryStore::new();
        let k = key("w");
        store
            .claim(
                &k,
                &Fingerprint::NONE,
                Token::random(),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        store.wait(&k, Duration::from_millis(10)).await.unwrap();
        assert_eq!(store.waiter_entries(), 0);
    }

    /// A wait the caller gives up on (its own timeout, a dropped call) leaves no entry
    /// behind: 200,000 cancelled waits once kept 21 MiB for as long as the store lived.
    #[tokio::test(start_paused = true)]
    async fn cancelled_waits_leave_no_waiter_entries() {
        let store = MemoryStore::new();
        let held = key("held");
        store
            .claim(
                &held,
                &Fingerprint::NONE,
                Token::random(),
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        for i in 0..1000 {
            let k = key(&format!("held-{i}"));
            store
                .claim(
                    &k,
                    &Fingerprint::NONE,
                    Token::random(),
                    Duration::from_secs(60),
                )
                .await
                .unwrap();
            let cancelled = tokio::time::timeout(
                Duration::from_millis(1),
                store.wait(&k, Duration::from_secs(30)),
            )
            .await;
            assert!(cancelled.is_err(), "the wait was cancelled, not ended");
        }
        assert_eq!(store.waiter_entries(), 0);

        // A waiter still waiting keeps its key's entry while another one is cancelled.
        let staying = tokio::spawn({
            let (store, held) = (store.clone(), held.clone());
            async move { store.wait(&held, Duration::from_secs(30)).await }
        });
        tokio::task::yield_now().await;
        assert_eq!(store.waiter_entries(), 1);
        let _ = tokio::time::timeout(
            Duration::from_millis(1),
            store.wait(&held, Duration::from_secs(30)),
        )
        .await;
        assert_eq!(
            store.waiter_entries(),
            1,
            "the staying waiter keeps its entry"
        );
        store.delete(&held).await.unwrap();
        staying.await.unwrap().unwrap();
        assert_eq!(store.waiter_entries(), 0);
    }
}
