//! Model-based test of the store contract, on every backend: proptest draws sequences of
//! claim (new token or resent), complete, release, extend, get, delete and clock advances
//! from three clients over three keys, runs them against the store, and checks every
//! answer against a small reference model of the store contract in ARCHITECTURE.md (the
//! model is `Model` below, a few dozen lines).
//!
//! The keys are a call's, the record of one of its steps (`key.step("charge")`: what
//! `idem::step` claims and completes, under the scope `<scope>#step:charge` and the call's
//! id), and another call's: step records go through the same model as results, and a
//! store that told records apart by their id alone, or by their scope alone, mixes two of
//! them up (`reliability_model_catches_a_store_that_mixes_up_a_call_and_its_step` checks
//! that the model catches it).
//!
//! Time: a lease or ttl is LONG (never ends within a case) or SHORT. The memory store runs
//! on tokio's paused clock, so an `Advance` is exact. Remote stores keep their own clock, so
//! an `Advance` sleeps until every SHORT deadline has passed for sure, and the harness
//! inserts an `Advance` of its own before a step that could otherwise run into a SHORT
//! deadline: every step then has one answer the model can predict.
//!
//! ```text
//! cargo test -p idem-integration --all-features --test reliability_model
//! IDEM_RELIABILITY_SCALE=4 cargo test ...   # 4 times the cases (default: 256 memory, 48 remote)
//! ```
//!
//! A failure is shrunk to a short sequence, printed, and its seed is kept in
//! `idem-integration/tests/reliability_model.regressions` (committed), which every later
//! run replays first.

// The store tests' support (the Redis Cluster of `IDEM_TEST_REDIS_CLUSTER`), shared with
// `idem-stores`' own tests.
#[path = "../../idem-stores/tests/support/mod.rs"]
mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem_core::{
    async_trait, Claim, Fence, Fingerprint, Key, Record, Store, StoreError, StoreWrapper, Token,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use tokio::time::Instant;

const CLIENTS: usize = 3;
const KEYS: usize = 3;
/// Never ends within a case.
const LONG: Duration = Duration::from_secs(3600);
/// A step that takes this long hung: a failure.
const STEP_LIMIT: Duration = Duration::from_secs(10);
/// Starts the error of a case the machine ran too slowly to judge: rejected, not failed.
const TOO_SLOW: &str = "too slow to judge";

/// The timing of one backend's cases.
#[derive(Clone, Copy)]
struct Timing {
    /// The short lease or ttl.
    short: Duration,
    /// How long a step may take at most: a step starts only when every live SHORT deadline
    /// is at least this far off.
    step_budget: Duration,
    /// Added after a SHORT deadline before it counts as passed (the store's clock
    /// granularity and its distance from ours).
    slack: Duration,
}

/// Tokio's paused clock: exact.
const PAUSED: Timing = Timing {
    short: Duration::from_millis(500),
    step_budget: Duration::ZERO,
    slack: Duration::from_millis(1),
};
/// Real time, the store's clock on this machine.
const REAL: Timing = Timing {
    short: Duration::from_millis(700),
    step_budget: Duration::from_millis(350),
    slack: Duration::from_millis(60),
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Span {
    Short,
    Long,
}

#[derive(Debug, Clone)]
enum Op {
    /// `fresh`: with a new token; otherwise the client's last token on that key (a resend).
    Claim {
        client: usize,
        key: usize,
        fresh: bool,
        fp: u8,
        lease: Span,
    },
    Complete {
        client: usize,
        key: usize,
        ttl: Span,
    },
    Release {
        client: usize,
        key: usize,
    },
    Extend {
        client: usize,
        key: usize,
        lease: Span,
    },
    Get {
        key: usize,
    },
    Delete {
        key: usize,
    },
    /// Every SHORT deadline passes.
    Advance,
}

fn span() -> impl Strategy<Value = Span> {
    prop_oneof![3 => Just(Span::Long), 2 => Just(Span::Short)]
}

fn op() -> impl Strategy<Value = Op> {
    let c = 0..CLIENTS;
    let k = 0..KEYS;
    prop_oneof![
        5 => (c.clone(), k.clone(), prop::bool::weighted(0.7), 0..3u8, span())
            .prop_map(|(client, key, fresh, fp, lease)| Op::Claim { client, key, fresh, fp, lease }),
        3 => (c.clone(), k.clone(), span()).prop_map(|(client, key, ttl)| Op::Complete { client, key, ttl }),
        2 => (c.clone(), k.clone()).prop_map(|(client, key)| Op::Release { client, key }),
        2 => (c, k.clone(), span()).prop_map(|(client, key, lease)| Op::Extend { client, key, lease }),
        2 => k.clone().prop_map(|key| Op::Get { key }),
        1 => k.prop_map(|key| Op::Delete { key }),
        1 => Just(Op::Advance),
    ]
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..28)
}

/// Fingerprint 0 is NONE; the store keeps whatever it is given and compares nothing.
fn fingerprint(n: u8) -> Fingerprint {
    if n == 0 {
        Fingerprint::NONE
    } else {
        Fingerprint::of(&n)
    }
}

/// A record as the contract sees it.
#[derive(Debug, Clone, PartialEq)]
enum Rec {
    InProgress {
        fp: Fingerprint,
        token: Token,
        lease: Duration,
        short: bool,
        /// The fence its claim answered, which a resent claim answers again.
        fence: Fence,
    },
    /// An in-progress record whose lease ended and that nobody took over: invisible to
    /// `get`, taken over by a claim (a recovery), and it fences its old holder.
    Ended { token: Token },
    Completed {
        fp: Fingerprint,
        token: Token,
        payload: Bytes,
        short: bool,
    },
    /// A completed record whose ttl ended: gone, though the store may still hold the bytes
    /// until it sweeps them.
    Expired { token: Token },
}

/// The reference model: one optional record per key, each client's last token per key,
/// and the largest fence each key was given.
#[derive(Debug, Default)]
struct Model {
    recs: [Option<Rec>; KEYS],
    tokens: [[Option<Token>; KEYS]; CLIENTS],
    fences: [Fence; KEYS],
}

impl Model {
    fn advance(&mut self) {
        for rec in self.recs.iter_mut() {
            *rec = match rec.take() {
                Some(Rec::InProgress {
                    token, short: true, ..
                }) => Some(Rec::Ended { token }),
                Some(Rec::Completed {
                    token, short: true, ..
                }) => Some(Rec::Expired { token }),
                other => other,
            };
        }
    }

    fn has_short(&self) -> bool {
        self.recs.iter().any(|r| {
            matches!(
                r,
                Some(Rec::InProgress { short: true, .. })
                    | Some(Rec::Completed { short: true, .. })
            )
        })
    }

    /// The live in-progress record of `key` held by `token`, if it is one.
    fn held_by(&self, key: usize, token: Token) -> bool {
        matches!(&self.recs[key], Some(Rec::InProgress { token: t, .. }) if *t == token)
    }
}

fn lease_of(span: Span, t: &Timing) -> Duration {
    match span {
        Span::Short => t.short,
        Span::Long => LONG,
    }
}

/// The keys of a case in `scope`: a call's, the record of its step `charge` (the same id,
/// the scope `<scope>#step:charge`), and another call's (the same scope, another id).
fn case_keys(scope: &str) -> Vec<Key> {
    let call = Key::new(scope, "k0").unwrap();
    let step = call.step("charge").unwrap();
    let other = Key::new(scope, "k1").unwrap();
    vec![call, step, other]
}

/// Runs one sequence against `store`; the first answer the model does not allow is the
/// error.
async fn run_case(
    store: &dyn Store,
    scope: &str,
    ops: &[Op],
    timing: Timing,
) -> Result<(), String> {
    let keys = case_keys(scope);
    let mut m = Model::default();
    let assigns_fences = store.capabilities().assigns_fences;
    let mut next_token = 1u64;
    // The last moment a live SHORT deadline is sure not to have passed, and the first at
    // which every one has passed for sure.
    let mut alive_until: Option<Instant> = None;
    let mut dead_after: Option<Instant> = None;
    let mut forced = 0u32;

    macro_rules! fail {
        ($i:expr, $op:expr, $($arg:tt)*) => {
            return Err(format!("step {} {:?}: {} (model before the step: {:?})", $i, $op, format!($($arg)*), m.recs))
        };
    }

    for (i, op) in ops.iter().enumerate() {
        let advance_now = |alive_until: Option<Instant>| {
            alive_until.is_some_and(|a| Instant::now() + timing.step_budget >= a)
        };
        if matches!(op, Op::Advance) || (m.has_short() && advance_now(alive_until)) {
            if !matches!(op, Op::Advance) {
                forced += 1;
            }
            if let Some(d) = dead_after.take() {
                tokio::time::sleep_until(d).await;
            }
            alive_until = None;
            m.advance();
            if matches!(op, Op::Advance) {
                continue;
            }
        }
        let started = Instant::now();
        // Awaits a store step; bounded, and checked against the timing premise before
        // its answer is: the answer was predicted on the premise that no SHORT deadline
        // passed while the step ran, and a step that outran its budget breaks the premise
        // (on a starved machine), which says nothing about the store.
        macro_rules! timed {
            ($step:expr) => {{
                let out = match tokio::time::timeout(STEP_LIMIT, $step).await {
                    Ok(out) => out,
                    Err(_) => return Err(format!("step {i} {op:?} hung for {STEP_LIMIT:?}")),
                };
                if let Some(a) = alive_until {
                    let now = Instant::now();
                    if now >= a {
                        return Err(format!(
                            "{TOO_SLOW}: step {i} {op:?} took {:?}, past a SHORT deadline (step budget {:?})",
                            now - started,
                            timing.step_budget
                        ));
                    }
                }
                out
            }};
        }
        // Records the SHORT deadline a step just set.
        let set_short = |alive_until: &mut Option<Instant>, dead_after: &mut Option<Instant>| {
            let a = started + timing.short;
            let d = Instant::now() + timing.short + timing.slack;
            *alive_until = Some(alive_until.map_or(a, |x| x.min(a)));
            *dead_after = Some(dead_after.map_or(d, |x| x.max(d)));
        };
        match *op {
            Op::Claim {
                client,
                key,
                fresh,
                fp,
                lease,
            } => {
                let token = match (fresh, m.tokens[client][key]) {
                    (false, Some(t)) => t,
                    _ => {
                        let t = Token::from_u64((client as u64) << 32 | next_token);
                        next_token += 1;
                        m.tokens[client][key] = Some(t);
                        t
                    }
                };
                let fp = fingerprint(fp);
                let d = lease_of(lease, &timing);
                let got = timed!(store.claim(&keys[key], &fp, token, d))
                    .map_err(|e| format!("step {i} {op:?}: claim failed: {e}"))?;
                // Every claim that acquires has a fence above the key's earlier ones; a
                // resent claim answers its first fence (checked below).
                let fence = match &got {
                    Claim::Acquired { fence, .. } => *fence,
                    _ => Fence::NONE,
                };
                let resent = m.held_by(key, token);
                if let Claim::Acquired { .. } = got {
                    if !assigns_fences && fence != Fence::NONE {
                        fail!(i, op, "a store without assigns_fences answered {fence:?}");
                    }
                    if assigns_fences && !resent && fence <= m.fences[key] {
                        fail!(
                            i,
                            op,
                            "fence {fence:?} is not above the key's last, {:?}",
                            m.fences[key]
                        );
                    }
                }
                match (&m.recs[key], got) {
                    (
                        None | Some(Rec::Expired { .. }),
                        Claim::Acquired {
                            token: t,
                            recovered,
                            ..
                        },
                    ) => {
                        if t != token || recovered {
                            fail!(i, op, "a free key: Acquired {{ {token:?}, recovered: false }}, got {t:?} recovered {recovered}");
                        }
                    }
                    (
                        Some(Rec::Ended { .. }),
                        Claim::Acquired {
                            token: t,
                            recovered,
                            ..
                        },
                    ) => {
                        if t != token || !recovered {
                            fail!(i, op, "an ended lease: Acquired {{ {token:?}, recovered: true }}, got {t:?} recovered {recovered}");
                        }
                    }
                    (
                        Some(Rec::InProgress { token: held, .. }),
                        Claim::Acquired {
                            token: t,
                            recovered,
                            ..
                        },
                    ) if *held == token => {
                        if t != token || recovered {
                            fail!(i, op, "a resent claim: Acquired {{ {token:?}, recovered: false }}, got {t:?} recovered {recovered}");
                        }
                        if let Some(Rec::InProgress { fence: first, .. }) = &m.recs[key] {
                            if fence != *first {
                                fail!(i, op, "a resent claim answered {fence:?}, its first answer was {first:?}");
                            }
                        }
                        // The record is left as it was: its lease is not renewed.
                        continue;
                    }
                    (
                        Some(Rec::InProgress {
                            fp: held_fp,
                            token: held,
                            lease: held_lease,
                            ..
                        }),
                        Claim::InProgress {
                            fingerprint,
                            retry_after,
                        },
                    ) if *held != token => {
                        if fingerprint != *held_fp {
                            fail!(i, op, "InProgress names fingerprint {fingerprint:?}, the holder's is {held_fp:?}");
                        }
                        if retry_after.is_zero() || retry_after > *held_lease {
                            fail!(
                                i,
                                op,
                                "retry_after {retry_after:?} outside (0, {held_lease:?}]"
                            );
                        }
                        continue;
                    }
                    (
                        Some(Rec::Completed {
                            fp: cfp, payload, ..
                        }),
                        Claim::Completed {
                            fingerprint,
                            payload: got,
                        },
                    ) => {
                        if fingerprint != *cfp || got != *payload {
                            fail!(i, op, "Completed {{ {fingerprint:?}, {got:?} }}, stored were {cfp:?}, {payload:?}");
                        }
                        continue;
                    }
                    (expected, got) => {
                        fail!(i, op, "model has {expected:?}, store answered {got:?}")
                    }
                }
                m.recs[key] = Some(Rec::InProgress {
                    fp,
                    token,
                    lease: d,
                    short: lease == Span::Short,
                    fence,
                });
                m.fences[key] = m.fences[key].max(fence);
                if lease == Span::Short {
                    set_short(&mut alive_until, &mut dead_after);
                }
            }
            Op::Complete { client, key, ttl } => {
                let token = m.tokens[client][key].unwrap_or(Token::from_u64(u64::MAX));
                let payload = Bytes::from(format!("c{client}-step{i}"));
                let got = timed!(store.complete(
                    &keys[key],
                    token,
                    payload.clone(),
                    lease_of(ttl, &timing)
                ));
                let repeat =
                    matches!(&m.recs[key], Some(Rec::Completed { token: t, .. }) if *t == token);
                match got {
                    Ok(()) if m.held_by(key, token) => {
                        let Some(Rec::InProgress { fp, .. }) = m.recs[key].clone() else {
                            unreachable!()
                        };
                        m.recs[key] = Some(Rec::Completed {
                            fp,
                            token,
                            payload,
                            short: ttl == Span::Short,
                        });
                        if ttl == Span::Short {
                            set_short(&mut alive_until, &mut dead_after);
                        }
                    }
                    // A repeat of a complete that succeeded: the first result stays.
                    Ok(()) if repeat => {}
                    Err(StoreError::Fenced) if !m.held_by(key, token) && !repeat => {}
                    other => fail!(i, op, "with {token:?}: got {other:?}"),
                }
            }
            Op::Release { client, key } => {
                let token = m.tokens[client][key].unwrap_or(Token::from_u64(u64::MAX));
                let got = timed!(store.release(&keys[key], token));
                match (&m.recs[key], got) {
                    (Some(Rec::InProgress { token: t, .. }), Ok(())) if *t == token => {
                        m.recs[key] = None
                    }
                    (None, Ok(())) => {}
                    // Gone, though its bytes may not be swept yet: nothing to release
                    // either way, and nothing changes.
                    (Some(Rec::Expired { .. }), Ok(()) | Err(StoreError::Fenced)) => {}
                    (
                        Some(Rec::InProgress { .. } | Rec::Ended { .. } | Rec::Completed { .. }),
                        Err(StoreError::Fenced),
                    ) if !m.held_by(key, token) => {}
                    (expected, got) => {
                        fail!(i, op, "with {token:?} over {expected:?}: got {got:?}")
                    }
                }
            }
            Op::Extend { client, key, lease } => {
                let token = m.tokens[client][key].unwrap_or(Token::from_u64(u64::MAX));
                let d = lease_of(lease, &timing);
                let got = timed!(store.extend(&keys[key], token, d));
                match got {
                    Ok(()) if m.held_by(key, token) => {
                        if let Some(Rec::InProgress {
                            lease: l, short, ..
                        }) = &mut m.recs[key]
                        {
                            *l = d;
                            *short = lease == Span::Short;
                        }
                        if lease == Span::Short {
                            set_short(&mut alive_until, &mut dead_after);
                        }
                    }
                    Err(StoreError::Fenced) if !m.held_by(key, token) => {}
                    other => fail!(i, op, "with {token:?}: got {other:?}"),
                }
            }
            Op::Get { key } => {
                let got = timed!(store.get(&keys[key]))
                    .map_err(|e| format!("step {i} {op:?}: get failed: {e}"))?;
                match (&m.recs[key], got) {
                    (None | Some(Rec::Ended { .. } | Rec::Expired { .. }), None) => {}
                    (
                        Some(Rec::InProgress {
                            fp, token, lease, ..
                        }),
                        Some(Record::InProgress {
                            fingerprint,
                            token: t,
                            lease_remaining,
                        }),
                    ) if fingerprint == *fp
                        && t == *token
                        && !lease_remaining.is_zero()
                        && lease_remaining <= *lease => {}
                    (
                        Some(Rec::Completed { fp, payload, .. }),
                        Some(Record::Completed {
                            fingerprint,
                            payload: p,
                        }),
                    ) if fingerprint == *fp && p == *payload => {}
                    (expected, got) => fail!(i, op, "model has {expected:?}, store shows {got:?}"),
                }
            }
            Op::Delete { key } => {
                let got = timed!(store.delete(&keys[key]))
                    .map_err(|e| format!("step {i} {op:?}: delete failed: {e}"))?;
                let live = matches!(
                    m.recs[key],
                    Some(Rec::InProgress { .. } | Rec::Completed { .. })
                );
                if got != live {
                    fail!(
                        i,
                        op,
                        "delete answered {got}, the model has {:?}",
                        m.recs[key]
                    );
                }
                m.recs[key] = None;
            }
            Op::Advance => unreachable!(),
        }
    }
    let _ = forced;
    Ok(())
}

/// `default` cases, times `IDEM_RELIABILITY_SCALE` (1 when unset; `.ci/run` sets more).
fn cases(default: u32) -> u32 {
    let scale: u32 = std::env::var("IDEM_RELIABILITY_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    default * scale
}

/// A scope no other case, process or run uses.
fn scope(backend: &str) -> String {
    idem_core::testing::unique_scope(&format!("reliability.model.{backend}"))
}

/// Runs `cases` sequences, each in a scope of its own on `store`, `block`ed on by
/// `block_on`; panics with the shrunk sequence when one breaks the model.
fn check(
    backend: &str,
    cases: u32,
    timing: Timing,
    run: impl Fn(&str, &[Op], Timing) -> Result<(), String>,
) {
    let mut runner = TestRunner::new(Config {
        cases,
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        // Shrinking a remote case costs real sleeps: bound it.
        max_shrink_time: 120_000,
        ..Config::default()
    });
    let started = std::time::Instant::now();
    let too_slow = std::sync::atomic::AtomicU32::new(0);
    let result = runner.run(&ops(), |ops| {
        run(&scope(backend), &ops, timing).map_err(|e| {
            if e.starts_with(TOO_SLOW) {
                too_slow.fetch_add(1, Ordering::Relaxed);
                TestCaseError::reject(e)
            } else {
                TestCaseError::fail(e)
            }
        })
    });
    if let Err(e) = result {
        panic!("{backend}: the store broke the contract model: {e}");
    }
    eprintln!(
        "reliability model {backend}: {cases} cases passed in {:.1?} ({} more set aside: a step outran its timing budget)",
        started.elapsed(),
        too_slow.load(Ordering::Relaxed)
    );
}

/// One runtime for every case of a remote backend, and the store it made.
fn remote(
    backend: &str,
    cases_default: u32,
    make: impl std::future::Future<Output = Option<Arc<dyn Store>>>,
) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let Some(store) = rt.block_on(make) else {
        return;
    };
    check(backend, cases(cases_default), REAL, |scope, ops, timing| {
        rt.block_on(run_case(&*store, scope, ops, timing))
    });
}

#[test]
fn reliability_model_memory() {
    check("memory", cases(256), PAUSED, |scope, ops, timing| {
        // A fresh paused clock and store per case: time moves only when the case says.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let store = idem_stores::MemoryStore::new();
        rt.block_on(run_case(&store, scope, ops, timing))
    });
}

#[cfg(feature = "sqlite")]
#[test]
fn reliability_model_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.db");
    remote("sqlite", 48, async move {
        let store = idem_stores::SqliteStore::open(path).await.unwrap();
        store.migrate().await.unwrap();
        Some(Arc::new(store) as Arc<dyn Store>)
    });
}

#[cfg(feature = "postgres")]
#[test]
fn reliability_model_postgres() {
    remote("postgres", 48, async {
        let url = idem_core::testing::backend_url("IDEM_TEST_POSTGRES_URL")?;
        let store = idem_stores::PostgresStore::connect(&url).await.unwrap();
        // A table of its own; every case has a scope of its own in it.
        let table = "idem_reliability_model";
        let store = store.with_table(table).unwrap();
        store.migrate().await.unwrap();
        Some(Arc::new(store) as Arc<dyn Store>)
    });
}

#[cfg(feature = "mysql")]
#[test]
fn reliability_model_mysql() {
    remote("mysql", 48, async {
        let url = idem_core::testing::backend_url("IDEM_TEST_MYSQL_URL")?;
        let store = idem_stores::MySqlStore::connect(&url).await.unwrap();
        // A table (and claim procedure) of its own; every case has a scope of its own in it.
        let table = "idem_reliability_model";
        let store = store.with_table(table).unwrap();
        store.migrate().await.unwrap();
        Some(Arc::new(store) as Arc<dyn Store>)
    });
}

#[cfg(feature = "redis")]
#[test]
fn reliability_model_redis() {
    remote("redis", 48, async {
        let url = idem_core::testing::backend_url("IDEM_TEST_REDIS_URL")?;
        let store = idem_stores::RedisStore::open(&url).await.unwrap();
        Some(Arc::new(store) as Arc<dyn Store>)
    });
}

#[cfg(feature = "redis-cluster")]
#[test]
fn reliability_model_redis_cluster() {
    remote("redis-cluster", 48, async {
        let store = support::redis_server::cluster_store().await?;
        Some(Arc::new(store) as Arc<dyn Store>)
    });
}

/// Sequences kept as explicit regression cases: the ones the model's first drafts got
/// wrong or that sit on a leeway of the contract, run against the memory store on a paused
/// clock (proptest's own seeds of any real failure go to `reliability_model.regressions`).
#[test]
fn reliability_model_regressions() {
    use Op::*;
    let cases: Vec<(&str, Vec<Op>)> = vec![
        (
            // Shrunk by CI on Postgres: a delete after the claim's lease ended left the
            // ended row, and the old holder's release was answered `Fenced`, where every
            // other store had nothing left under the key and answered `Ok`.
            "release after a delete of an ended claim",
            vec![
                Claim {
                    client: 0,
                    key: 1,
                    fresh: false,
                    fp: 0,
                    lease: Span::Short,
                },
                Advance,
                Delete { key: 1 },
                Release { client: 0, key: 1 },
            ],
        ),
        (
            // A claim resent after its own lease ended takes the key over: a recovery.
            "resent claim after its own lease ended",
            vec![
                Claim {
                    client: 0,
                    key: 0,
                    fresh: true,
                    fp: 0,
                    lease: Span::Short,
                },
                Advance,
                Claim {
                    client: 0,
                    key: 0,
                    fresh: false,
                    fp: 0,
                    lease: Span::Long,
                },
            ],
        ),
        (
            // Release by the token of a completed record whose ttl ended: nothing changes.
            "release over an expired result",
            vec![
                Claim {
                    client: 0,
                    key: 0,
                    fresh: true,
                    fp: 1,
                    lease: Span::Long,
                },
                Complete {
                    client: 0,
                    key: 0,
                    ttl: Span::Short,
                },
                Advance,
                Release { client: 0, key: 0 },
                Get { key: 0 },
                Claim {
                    client: 1,
                    key: 0,
                    fresh: true,
                    fp: 2,
                    lease: Span::Long,
                },
            ],
        ),
        (
            // A repeated complete keeps the first result; another token is fenced.
            "repeated complete, then another token",
            vec![
                Claim {
                    client: 0,
                    key: 1,
                    fresh: true,
                    fp: 1,
                    lease: Span::Long,
                },
                Complete {
                    client: 0,
                    key: 1,
                    ttl: Span::Long,
                },
                Complete {
                    client: 0,
                    key: 1,
                    ttl: Span::Short,
                },
                Complete {
                    client: 1,
                    key: 1,
                    ttl: Span::Long,
                },
                Get { key: 1 },
            ],
        ),
        (
            // The holder whose lease was taken over cannot extend, complete or release.
            "stale holder after a takeover",
            vec![
                Claim {
                    client: 0,
                    key: 0,
                    fresh: true,
                    fp: 1,
                    lease: Span::Short,
                },
                Advance,
                Claim {
                    client: 1,
                    key: 0,
                    fresh: true,
                    fp: 1,
                    lease: Span::Long,
                },
                Extend {
                    client: 0,
                    key: 0,
                    lease: Span::Long,
                },
                Complete {
                    client: 0,
                    key: 0,
                    ttl: Span::Long,
                },
                Release { client: 0, key: 0 },
                Get { key: 0 },
                Delete { key: 0 },
                Delete { key: 0 },
            ],
        ),
    ];
    for (name, ops) in cases {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let store = idem_stores::MemoryStore::new();
        if let Err(e) = rt.block_on(run_case(&store, &scope("regression"), &ops, PAUSED)) {
            panic!("{name}: {e}");
        }
    }
}

/// A store that keeps each record under its key's id alone, every scope in one: the record
/// of a call's step and the call's own record (the same id) are one record in it.
#[derive(Debug)]
struct ById<S>(S);

fn by_id(key: &Key) -> Key {
    Key::new("by-id", key.id()).unwrap()
}

#[async_trait]
impl<S: Store> StoreWrapper for ById<S> {
    type Inner = S;
    fn inner(&self) -> &S {
        &self.0
    }
    async fn claim(
        &self,
        key: &Key,
        fp: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.0.claim(&by_id(key), fp, token, lease).await
    }
    async fn complete(
        &self,
        key: &Key,
        token: Token,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.0.complete(&by_id(key), token, payload, ttl).await
    }
    async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError> {
        self.0.release(&by_id(key), token).await
    }
    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
        self.0.extend(&by_id(key), token, lease).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.0.get(&by_id(key)).await
    }
    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        self.0.delete(&by_id(key)).await
    }
    async fn wait(&self, key: &Key, at_most: Duration) -> Result<(), StoreError> {
        self.0.wait(&by_id(key), at_most).await
    }
}

/// The model is not blind to step records: a store that mixes up a call's record and its
/// step's (and is otherwise the memory store) breaks it, within the memory backend's cases.
#[test]
fn reliability_model_catches_a_store_that_mixes_up_a_call_and_its_step() {
    let mut runner = TestRunner::new(Config {
        cases: 256,
        // A failure here is what the test wants: no seed is kept for it.
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&ops(), |ops| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let store = ById(idem_stores::MemoryStore::new());
        rt.block_on(run_case(&store, &scope("by-id"), &ops, PAUSED))
            .map_err(TestCaseError::fail)
    });
    match result {
        Err(e) => eprintln!("reliability model: the store keyed by id alone is caught: {e}"),
        Ok(()) => panic!("the model passed a store that keeps a step's record in its call's"),
    }
}
