//! Hostile review of steps, holds and resolutions on the memory store. Each test either
//! pins a bug (named `bug_*`, failing at the commit attacked) or measures a race and
//! asserts the promise (`attack_*`).
//!
//! Interleavings are forced with a gate: a store wrapper that stops a chosen operation of a
//! chosen task (a task-local tag) until the test lets it go.

mod support;

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use idem::{
    steps::Resolution, steps::Resolved, steps::Step, store::Bytes, store::Record, store::Store,
    store::StoreError, store::StoreWrapper, Error, Fingerprint, Idem, Key, MemoryStore,
};
use tokio::sync::Notify;

tokio::task_local! {
    static WHO: &'static str;
}

fn key(id: &str) -> Key {
    Key::new("tests::steps_attack", id).unwrap()
}

fn ambiguous() -> Error {
    support::engine::ambiguous("gateway timed out after the request was sent")
}

fn is_step(key: &Key) -> bool {
    key.scope().contains("#step:")
}

/// One stop: the next `op` by the task tagged `who` on a step key (or a call key).
struct Rule {
    who: &'static str,
    op: &'static str,
    step_key: bool,
    reached: Arc<Notify>,
    go: Arc<Notify>,
}

#[derive(Debug, Clone)]
struct Gated {
    inner: MemoryStore,
    rules: Arc<Mutex<Vec<RuleBox>>>,
}

struct RuleBox(Rule);
impl std::fmt::Debug for RuleBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rule({} {} step={})",
            self.0.who, self.0.op, self.0.step_key
        )
    }
}

impl Gated {
    fn new() -> Self {
        Gated {
            inner: MemoryStore::new(),
            rules: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Stops the next `op` of task `who` on a step key (`step_key`) or call key; answers
    /// (reached, go).
    fn stop(
        &self,
        who: &'static str,
        op: &'static str,
        step_key: bool,
    ) -> (Arc<Notify>, Arc<Notify>) {
        let (reached, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        self.rules.lock().unwrap().push(RuleBox(Rule {
            who,
            op,
            step_key,
            reached: reached.clone(),
            go: go.clone(),
        }));
        (reached, go)
    }

    async fn gate(&self, op: &'static str, key: &Key) {
        let Ok(who) = WHO.try_with(|w| *w) else {
            return;
        };
        let hit = {
            let mut rules = self.rules.lock().unwrap();
            let at = rules
                .iter()
                .position(|r| r.0.who == who && r.0.op == op && r.0.step_key == is_step(key));
            at.map(|i| rules.remove(i))
        };
        if let Some(RuleBox(rule)) = hit {
            rule.reached.notify_one();
            rule.go.notified().await;
        }
    }
}

#[idem::store::async_trait]
impl StoreWrapper for Gated {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.inner
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.gate("get", key).await;
        self.inner.get(key).await
    }
    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        self.gate("delete", key).await;
        self.inner.delete(key).await
    }
    async fn replace(
        &self,
        key: &Key,
        expected: &[u8],
        new: Option<(Bytes, Duration)>,
    ) -> Result<bool, StoreError> {
        self.gate("replace", key).await;
        self.inner.replace(key, expected, new).await
    }
}

/// One attempt of a checkout whose `charge` step counts its runs, and fails ambiguously
/// when `fail` is set.
async fn attempt(idem: &Idem, k: &Key, charges: &AtomicU32, fail: bool) -> Result<String, Error> {
    idem.call(k.clone(), Fingerprint::NONE)
        .run_fallible(|| async move {
            Step::new("charge")
                .unknown_if(|_: &Error| true)
                .run(|| async move {
                    let n = charges.fetch_add(1, SeqCst) + 1;
                    match fail {
                        true => Err(ambiguous()),
                        false => Ok(format!("ch_run_{n}")),
                    }
                })
                .await
        })
        .await
}

async fn hold(idem: &Idem, k: &Key, charges: &AtomicU32) {
    let out = attempt(idem, k, charges, true).await;
    assert!(
        matches!(&out, Err(Error::OutcomeUnknown { step, .. }) if step == "charge"),
        "{out:?}"
    );
}

/// Two resolvers, NotRan then Ran: the NotRan deletes the step's hold and stops before
/// lifting the key's hold; the Ran one then finds no step record and the key still held,
/// so it writes its value. Both answer `Resolved`: "two resolutions racing each other write
/// once (the other answers NotHeld or AlreadyResolved)" is broken, and the resolver told
/// `Resolved` for NotRan has had its answer silently overwritten.
#[tokio::test]
async fn bug_mixed_resolutions_not_ran_then_ran_both_answer_resolved() {
    let store = Gated::new();
    let idem = Idem::new(store.clone());
    let (k, charges) = (key("mixed"), AtomicU32::new(0));
    hold(&idem, &k, &charges).await;

    let (reached, go) = store.stop("a", "replace", false);
    let a = {
        let (idem, k) = (idem.clone(), k.clone());
        tokio::spawn(WHO.scope("a", async move {
            idem.resolve(&k, "charge", Resolution::NotRan).await
        }))
    };
    reached.notified().await; // A deleted the step's hold, and has not lifted the key's.
    let b = idem
        .resolve(&k, "charge", Resolution::ran("ch_b").unwrap())
        .await
        .unwrap();
    go.notify_one();
    let a = a.await.unwrap().unwrap();
    let after = attempt(&idem, &k, &charges, false).await;
    eprintln!("A (not ran) answered {a:?}, B (ran) answered {b:?}; next call: {after:?}");
    assert!(
        !(a == Resolved::Resolved && b == Resolved::Resolved),
        "both resolutions answered Resolved, the step's record is B's ({after:?}), A's NotRan was overwritten"
    );
}

/// ABA: the hold's bytes are the same for every hold of a step (`{"step":"charge"}`), so a
/// resolution that read the first hold, stalled, and resumes after that hold was resolved
/// and the step was held *again* by a later attempt, compare-and-sets the *new* hold and
/// resolves it. Here two honest operators both say the first charge did not happen; the
/// second attempt's charge (outcome unknown, never looked at by anyone) is resolved as
/// not-ran by the stale one, and the next call charges a third time.
#[tokio::test]
async fn bug_a_stale_resolution_resolves_a_newer_hold_of_the_same_step() {
    let store = Gated::new();
    let idem = Idem::new(store.clone());
    let (k, charges) = (key("aba"), AtomicU32::new(0));
    hold(&idem, &k, &charges).await; // charge #1, unknown

    // A read both holds and stops before its first write.
    let (reached, go) = store.stop("a", "replace", true);
    let a = {
        let (idem, k) = (idem.clone(), k.clone());
        tokio::spawn(WHO.scope("a", async move {
            idem.resolve(&k, "charge", Resolution::NotRan).await
        }))
    };
    reached.notified().await;
    // B resolves the same (first) outcome, and the retry holds the key again.
    assert_eq!(
        idem.resolve(&k, "charge", Resolution::NotRan)
            .await
            .unwrap(),
        Resolved::Resolved
    );
    hold(&idem, &k, &charges).await; // charge #2, unknown: nobody has resolved it
    assert_eq!(charges.load(SeqCst), 2);
    go.notify_one();
    let a = a.await.unwrap().unwrap();
    let next = attempt(&idem, &k, &charges, false).await;
    eprintln!(
        "stale A answered {a:?}; next call {next:?}; charges {}",
        charges.load(SeqCst)
    );
    assert!(
        matches!(next, Err(Error::OutcomeUnknown { .. })),
        "the second hold was resolved by a resolution about the first: the next call ran the charge again ({next:?}, {} runs)",
        charges.load(SeqCst)
    );
}

/// The same ABA through the reconcile hook across two processes (engines): process 1's
/// hook is asked about the first hold and answers late; meanwhile the key is resolved by
/// hand and held again by process 2's attempt. The hook's stale "not ran" resolves the
/// second hold, and process 1's caller runs the charge a third time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bug_a_late_reconcile_answer_resolves_a_newer_hold() {
    let store = Arc::new(MemoryStore::new());
    let asked = Arc::new(Notify::new());
    let answer = Arc::new(Notify::new());
    let p1 = {
        let (asked, answer) = (asked.clone(), answer.clone());
        Idem::builder()
            .store(store.clone())
            .reconcile(move |_| {
                let (asked, answer) = (asked.clone(), answer.clone());
                async move {
                    asked.notify_one();
                    answer.notified().await;
                    Some(Resolution::NotRan) // true of the first charge
                }
            })
            .build()
            .unwrap()
    };
    let p2 = Idem::new(store.clone());
    let k = key("late-hook");
    let charges = Arc::new(AtomicU32::new(0));
    hold(&p2, &k, &charges).await; // charge #1
    let caller = {
        let (p1, k, charges) = (p1.clone(), k.clone(), charges.clone());
        tokio::spawn(async move { attempt(&p1, &k, &charges, false).await })
    };
    asked.notified().await;
    p2.resolve(&k, "charge", Resolution::NotRan).await.unwrap();
    hold(&p2, &k, &charges).await; // charge #2, unknown
    answer.notify_one();
    let out = caller.await.unwrap();
    eprintln!(
        "process 1's caller: {out:?}; charges {}",
        charges.load(SeqCst)
    );
    assert!(
        matches!(out, Err(Error::OutcomeUnknown { .. })),
        "a hook's answer about the first hold resolved the second: the charge ran again ({out:?}, {} runs)",
        charges.load(SeqCst)
    );
}

/// `forget` of a held key lifts the key's hold (compare-and-set), then deletes the step's
/// record unconditionally (`forget_steps`, a plain delete). A resolution that lands between
/// the two (it finds the step's hold, the key's already lifted) writes its value and answers
/// `Resolved`; forget's delete then erases that value, and the next attempt charges again
/// although a resolution said, and was told it was stored, that the charge happened.
/// (An attempt in the gap is harmless: it replays the step's hold and holds the key again,
/// so `forget` answered `true` and the key is still held.)
#[tokio::test]
async fn bug_forget_of_a_held_key_deletes_a_value_a_resolution_stored_since() {
    let store = Gated::new();
    let idem = Idem::new(store.clone());
    let (k, charges) = (key("forget"), AtomicU32::new(0));
    hold(&idem, &k, &charges).await; // charge #1

    let (reached, go) = store.stop("f", "replace", true);
    let f = {
        let (idem, k) = (idem.clone(), k.clone());
        tokio::spawn(WHO.scope("f", async move { idem.forget(&k).await }))
    };
    reached.notified().await; // the key's hold is gone, the step's removal not yet sent
    let r = idem
        .resolve(&k, "charge", Resolution::ran("ch_1").unwrap())
        .await
        .unwrap();
    go.notify_one();
    let forgot = f.await.unwrap().unwrap();
    let next = attempt(&idem, &k, &charges, false).await;
    eprintln!(
        "resolve answered {r:?}, forget {forgot}; next attempt {next:?}, charges {}",
        charges.load(SeqCst)
    );
    assert!(
        r != Resolved::Resolved || next.as_deref().ok() == Some("ch_1"),
        "the resolution answered Resolved with its value stored, and forget deleted that value afterwards: charged again ({next:?})"
    );
}

/// Many engines (processes) on one store, each with a hook answering Ran / NotRan / None
/// at random, callers retrying, and resolutions by hand at the same time. Counts step runs,
/// LeaseLost and answers per round. The promise checked: no LeaseLost (a resolution never
/// ends a claim), and an attempt that gets a value gets the one stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn attack_racing_callers_hooks_and_resolvers() {
    let store = Arc::new(MemoryStore::new());
    let seed = Arc::new(AtomicU32::new(12345));
    let rnd = {
        let seed = seed.clone();
        move || {
            let mut x = seed.fetch_add(0x9E37_79B9, SeqCst);
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        }
    };
    let engines: Vec<Idem> = (0..4)
        .map(|_| {
            let rnd = rnd.clone();
            Idem::builder()
                .store(store.clone())
                .reconcile(move |_| {
                    let r = rnd();
                    async move {
                        tokio::task::yield_now().await;
                        match r % 3 {
                            0 => Some(Resolution::ran("ch_hook").unwrap()),
                            1 => Some(Resolution::NotRan),
                            _ => None,
                        }
                    }
                })
                .build()
                .unwrap()
        })
        .collect();
    let (mut lease_lost, mut both_resolved, mut runs_total, mut other) = (0, 0, 0, Vec::new());
    for round in 0..40 {
        let k = key(&format!("race-{round}"));
        let charges = Arc::new(AtomicU32::new(0));
        hold(&engines[0], &k, &charges).await;
        let mut tasks = Vec::new();
        for i in 0..12usize {
            let (idem, k, charges) = (engines[i % 4].clone(), k.clone(), charges.clone());
            let fail = rnd() % 4 == 0;
            tasks.push(tokio::spawn(async move {
                match attempt(&idem, &k, &charges, fail).await {
                    Ok(v) => format!("ok:{v}"),
                    Err(Error::LeaseLost { .. }) => "lease_lost".into(),
                    Err(Error::OutcomeUnknown { .. }) => "unknown".into(),
                    Err(Error::InProgress { .. }) => "in_progress".into(),
                    Err(e) => format!("err:{e}"),
                }
            }));
        }
        let resolvers: Vec<_> = (0..4)
            .map(|i| {
                let (idem, k) = (engines[i].clone(), k.clone());
                let res = match i % 2 {
                    0 => Resolution::ran(&format!("ch_hand_{i}")).unwrap(),
                    _ => Resolution::NotRan,
                };
                tokio::spawn(async move { idem.resolve(&k, "charge", res).await })
            })
            .collect();
        let answers = join_all(tasks).await;
        let resolved: Vec<_> = join_all(resolvers)
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        let n_resolved = resolved
            .iter()
            .filter(|r| matches!(r, Ok(Resolved::Resolved)))
            .count();
        if n_resolved > 1 {
            both_resolved += 1;
        }
        runs_total += charges.load(SeqCst);
        for a in answers {
            let a = a.unwrap();
            if a == "lease_lost" {
                lease_lost += 1;
            } else if a.starts_with("err:") {
                other.push(a);
            }
        }
    }
    eprintln!(
        "rounds 40: lease_lost {lease_lost}, rounds with >1 Resolved by hand {both_resolved}, step runs {runs_total}, other errors {other:?}"
    );
    assert_eq!(
        lease_lost, 0,
        "a resolution ended a running attempt's claim"
    );
}

/// Bad values: `Ran(null)` and a wrong type for a `String` step hold the key (not a run,
/// not a panic); a huge value is stored and replayed; the longest step name works.
#[tokio::test]
async fn attack_bad_resolution_values() {
    let idem = Idem::new(MemoryStore::new());
    for (i, value) in [
        serde_json::Value::Null,
        serde_json::json!(42),
        serde_json::json!({"id": "ch"}),
    ]
    .into_iter()
    .enumerate()
    {
        let (k, charges) = (key(&format!("bad-{i}")), AtomicU32::new(0));
        hold(&idem, &k, &charges).await;
        let r = idem
            .resolve(&k, "charge", Resolution::Ran(value.clone()))
            .await
            .unwrap();
        assert_eq!(r, Resolved::Resolved);
        let out = attempt(&idem, &k, &charges, false).await;
        assert!(
            matches!(out, Err(Error::OutcomeUnknown { .. })),
            "{value}: {out:?}"
        );
        assert_eq!(charges.load(SeqCst), 1, "{value}");
        // And it can be resolved again, correctly this time.
        let again = idem
            .resolve(&k, "charge", Resolution::ran("ch_fixed").unwrap())
            .await
            .unwrap();
        assert_eq!(again, Resolved::Resolved, "{value}");
        assert_eq!(
            attempt(&idem, &k, &charges, false).await.unwrap(),
            "ch_fixed"
        );
        assert_eq!(charges.load(SeqCst), 1);
    }
    let (k, charges) = (key("huge"), AtomicU32::new(0));
    hold(&idem, &k, &charges).await;
    let huge = "x".repeat(8 << 20);
    idem.resolve(&k, "charge", Resolution::ran(&huge).unwrap())
        .await
        .unwrap();
    assert_eq!(
        attempt(&idem, &k, &charges, false).await.unwrap().len(),
        huge.len()
    );

    let long = "s".repeat(64);
    let k = key("long-step");
    let out = idem
        .call(k.clone(), Fingerprint::NONE)
        .run_fallible(|| async {
            Step::new(&long)
                .unknown_if(|_: &Error| true)
                .run(|| async { Err::<String, _>(ambiguous()) })
                .await
        })
        .await;
    assert!(matches!(out, Err(Error::OutcomeUnknown { .. })), "{out:?}");
    assert_eq!(
        idem.resolve(&k, &long, Resolution::NotRan).await.unwrap(),
        Resolved::Resolved
    );
    let bad = idem.resolve(&k, &"s".repeat(65), Resolution::NotRan).await;
    assert!(
        matches!(bad, Err(Error::Step { .. }) | Err(Error::InvalidKey { .. })),
        "{bad:?}"
    );
}

/// Changed payload after an Err, a panic, a hold, and a resolution: never the first
/// payload's steps.
#[tokio::test]
async fn attack_changed_payload_after_err_panic_hold_resolution() {
    let idem = Idem::new(MemoryStore::new());
    let charges = Arc::new(AtomicU32::new(0));
    async fn pay(
        idem: &Idem,
        k: &Key,
        amount: u32,
        charges: &AtomicU32,
        how: &'static str,
    ) -> Result<String, Error> {
        idem.call(k.clone(), Fingerprint::of(&amount))
            .run_fallible(|| async move {
                let ch = Step::new("charge")
                    .unknown_if(|_: &Error| how == "hold")
                    .run(|| async move {
                        charges.fetch_add(1, SeqCst);
                        if how == "hold" {
                            return Err(ambiguous());
                        }
                        Ok::<_, Error>(format!("ch_{amount}"))
                    })
                    .await?;
                match how {
                    "err" => Err(Error::Config {
                        message: "later".into(),
                        source: None,
                    }),
                    "panic" => panic!("after the charge"),
                    _ => Ok(ch),
                }
            })
            .await
    }
    // after an Err
    let k = key("cp-err");
    assert!(pay(&idem, &k, 100, &charges, "err").await.is_err());
    let o = pay(&idem, &k, 5000, &charges, "ok").await;
    assert!(matches!(o, Err(Error::KeyReuse { .. })), "after err: {o:?}");
    // after a panic
    let k = key("cp-panic");
    let p = {
        let (idem, k, charges) = (idem.clone(), k.clone(), charges.clone());
        tokio::spawn(async move { pay(&idem, &k, 100, &charges, "panic").await })
    };
    assert!(p.await.is_err());
    tokio::time::sleep(Duration::from_millis(50)).await; // the background release
    let o = pay(&idem, &k, 5000, &charges, "ok").await;
    assert!(
        matches!(
            o,
            Err(Error::KeyReuse { .. }) | Err(Error::InProgress { .. })
        ),
        "after panic: {o:?}"
    );
    // while held
    let k = key("cp-hold");
    assert!(matches!(
        pay(&idem, &k, 100, &charges, "hold").await,
        Err(Error::OutcomeUnknown { .. })
    ));
    let o = pay(&idem, &k, 5000, &charges, "ok").await;
    assert!(matches!(o, Err(Error::KeyReuse { .. })), "held: {o:?}");
    // after a Ran resolution
    idem.resolve(&k, "charge", Resolution::ran("ch_100").unwrap())
        .await
        .unwrap();
    let o = pay(&idem, &k, 5000, &charges, "ok").await;
    assert!(matches!(o, Err(Error::KeyReuse { .. })), "after ran: {o:?}");
    assert_eq!(pay(&idem, &k, 100, &charges, "ok").await.unwrap(), "ch_100");
}

/// A resolution cut at each of its store steps (the future dropped), then a second
/// resolution and a retry: never a double run, never a key held with no way out.
#[tokio::test]
async fn attack_resolution_cut_at_each_await() {
    for (n, (op, step_key)) in [
        ("get", true),
        ("get", false),
        ("replace", true),
        ("replace", false),
    ]
    .into_iter()
    .enumerate()
    {
        for ran in [true, false] {
            let store = Gated::new();
            let idem = Idem::new(store.clone());
            let (k, charges) = (key(&format!("cut-{n}-{ran}")), AtomicU32::new(0));
            hold(&idem, &k, &charges).await;
            let (_reached, _go) = store.stop("c", op, step_key);
            let res = match ran {
                true => Resolution::ran("ch_first").unwrap(),
                false => Resolution::NotRan,
            };
            let cut = tokio::time::timeout(
                Duration::from_millis(50),
                WHO.scope("c", idem.resolve(&k, "charge", res.clone())),
            )
            .await;
            assert!(cut.is_err(), "{op} {step_key}: not cut");
            let second = idem.resolve(&k, "charge", res).await;
            let next = attempt(&idem, &k, &charges, false).await;
            eprintln!("cut at {op} step={step_key} ran={ran}: second {second:?}, next {next:?}");
            let runs = charges.load(SeqCst);
            match ran {
                true => assert_eq!(next.unwrap(), "ch_first", "{op} {step_key}"),
                false => assert!(next.is_ok() && runs == 2, "{op} {step_key}: {next:?}"),
            }
        }
    }
}

/// A reconcile hook that hangs (the provider's API does not answer) stalls every other
/// caller of the held key in the process, unbounded: they wait on the hook's lock with no
/// `wait_timeout`, even in `InProgress::Reject` mode, instead of answering `OutcomeUnknown`
/// (or `InProgress`). Measured with a paused clock: a caller still waiting after an hour.
#[tokio::test(start_paused = true)]
async fn bug_a_hung_reconcile_hook_stalls_every_caller_of_the_key_without_bound() {
    let idem = Idem::builder()
        .store(MemoryStore::new())
        .in_progress(idem::InProgress::Reject)
        .wait_timeout(Duration::from_secs(5))
        .reconcile(|_| async {
            std::future::pending::<()>().await;
            None
        })
        .build()
        .unwrap();
    let (k, charges) = (key("hung-hook"), Arc::new(AtomicU32::new(0)));
    hold(&idem, &k, &charges).await;
    let first = {
        let (idem, k, charges) = (idem.clone(), k.clone(), charges.clone());
        tokio::spawn(async move { attempt(&idem, &k, &charges, false).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await; // the first asks the hook
    let second = tokio::time::timeout(
        Duration::from_secs(3600),
        attempt(&idem, &k, &charges, false),
    )
    .await;
    first.abort();
    eprintln!("second caller after an hour: {second:?}");
    assert!(
        second.is_ok(),
        "a second caller (Reject mode, wait_timeout 5 s) was still waiting on another caller's hung hook after an hour"
    );
}

/// Two services on one scope by mistake (or one service across a deploy that changed a
/// step's type), same key, same (empty) fingerprint: the second service's step of the same
/// name does not decode the first's value, and turns the first's completed value into a
/// hold. The first service's own retry, whose step had completed, now answers
/// `OutcomeUnknown` and needs a person. Measured (design question, not asserted as a bug).
#[tokio::test]
async fn attack_same_scope_by_mistake_turns_a_completed_step_into_a_hold() {
    let idem = Idem::new(MemoryStore::new());
    let k = key("two-services");
    let a = idem
        .call(k.clone(), Fingerprint::NONE)
        .run_fallible(|| async {
            let ch = idem::step("charge", || async { Ok::<_, Error>("ch_1".to_string()) }).await?;
            Err::<String, _>(Error::Config {
                message: format!("later ({ch})"),
                source: None,
            })
        })
        .await;
    assert!(a.is_err());
    let b = idem
        .call(k.clone(), Fingerprint::NONE)
        .run_fallible(|| async { idem::step("charge", || async { Ok::<_, Error>(7u64) }).await })
        .await;
    let a_again = idem
        .call(k.clone(), Fingerprint::NONE)
        .run_fallible(|| async {
            idem::step("charge", || async { Ok::<_, Error>("ch_2".to_string()) }).await
        })
        .await;
    eprintln!("service B: {b:?}; service A's retry: {a_again:?}");
    assert!(matches!(b, Err(Error::OutcomeUnknown { .. })));
}

/// `forget_forced` beside a running attempt younger than its lease: its doc says "its
/// holder's next step, extend or complete is then refused (`LeaseLost`)". A second attempt
/// claims the key, charges, stores the result and deletes the step records; the first then
/// reaches its `charge` step, claims the (deleted) step record afresh, and — being younger
/// than a lease, it does not check that it still holds the call — charges a second time.
#[ignore = "forget_forced is documented as only for a holder known dead: a step the holder starts within its first lease is not checked against the call record (a get per step would cost every call)"]
#[tokio::test]
async fn bug_forget_forced_lets_the_running_holders_next_step_run_a_second_time() {
    let idem = Idem::new(MemoryStore::new());
    let k = key("forced");
    let charges = Arc::new(AtomicU32::new(0));
    let started = Arc::new(Notify::new());
    let go = Arc::new(Notify::new());
    let first = {
        let (idem, k, charges, started, go) = (
            idem.clone(),
            k.clone(),
            charges.clone(),
            started.clone(),
            go.clone(),
        );
        tokio::spawn(async move {
            idem.call(k, Fingerprint::NONE)
                .run_fallible(|| async move {
                    started.notify_one();
                    go.notified().await; // e.g. validating the order, before the charge
                    idem::step("charge", || async move {
                        charges.fetch_add(1, SeqCst);
                        Ok::<_, Error>("ch_first".to_string())
                    })
                    .await
                })
                .await
        })
    };
    started.notified().await;
    assert!(idem.forget_forced(&k).await.unwrap());
    let second = idem
        .call(k.clone(), Fingerprint::NONE)
        .run_fallible(|| async {
            idem::step("charge", || async {
                charges.fetch_add(1, SeqCst);
                Ok::<_, Error>("ch_second".to_string())
            })
            .await
        })
        .await;
    assert_eq!(second.unwrap(), "ch_second");
    tokio::time::sleep(Duration::from_millis(20)).await; // step records deleted in the background
    go.notify_one();
    let first = first.await.unwrap();
    eprintln!("first holder: {first:?}; charges {}", charges.load(SeqCst));
    assert_eq!(
        charges.load(SeqCst),
        1,
        "the forced-out holder's next step ran (charged twice); it answered {first:?}"
    );
}

#[idem::idempotent(key = order_id, store = idem, skip(idem, charges, how))]
async fn macro_pay(
    idem: &Idem,
    charges: &AtomicU32,
    how: &'static str,
    order_id: String,
    amount: u64,
) -> Result<String, Error> {
    let ch = Step::new("charge")
        .unknown_if(|_: &Error| how == "hold")
        .run(|| async move {
            charges.fetch_add(1, SeqCst);
            if how == "hold" {
                return Err(ambiguous());
            }
            Ok::<_, Error>(format!("ch_{amount}"))
        })
        .await?;
    if how == "err" {
        return Err(Error::Config {
            message: "later".into(),
            source: None,
        });
    }
    Ok(ch)
}

/// Through `#[idempotent]`: a changed amount after an Err, a hold and a resolution is
/// `KeyReuse`, never the first amount's charge.
#[tokio::test]
async fn attack_macro_changed_payload_after_err_hold_resolution() {
    let idem = Idem::new(MemoryStore::new());
    let charges = AtomicU32::new(0);
    assert!(macro_pay(&idem, &charges, "err", "m-1".into(), 100)
        .await
        .is_err());
    let o = macro_pay(&idem, &charges, "ok", "m-1".into(), 5000).await;
    assert!(matches!(o, Err(Error::KeyReuse { .. })), "after err: {o:?}");
    let o = macro_pay(&idem, &charges, "hold", "m-2".into(), 100).await;
    assert!(matches!(o, Err(Error::OutcomeUnknown { .. })), "{o:?}");
    let o = macro_pay(&idem, &charges, "ok", "m-2".into(), 5000).await;
    assert!(matches!(o, Err(Error::KeyReuse { .. })), "held: {o:?}");
    let k = Key::new("steps_attack::macro_pay", "m-2");
    eprintln!("macro key guess {k:?}");
    assert_eq!(charges.load(SeqCst), 2);
}

/// Helper for the CLI attack (ignored): holds `tests::steps_attack/cli-N` for N in 0..4 in
/// the SQLite file named by `IDEM_ATTACK_SQLITE`.
#[tokio::test]
#[ignore = "a helper run by hand for the CLI attack: it needs IDEM_ATTACK_SQLITE and leaves held keys behind"]
async fn helper_make_holds_for_the_cli() {
    let Ok(path) = std::env::var("IDEM_ATTACK_SQLITE") else {
        return;
    };
    let idem = idem::connect(&format!("sqlite://{path}")).await.unwrap();
    for n in 0..4 {
        hold(&idem, &key(&format!("cli-{n}")), &AtomicU32::new(0)).await;
    }
}

/// `forget_steps` beside a running attempt: it deletes the step's live claim (no check,
/// unlike `forget`), the step's value then cannot be stored (its claim is gone), the call's
/// claim is kept until its lease ends, and the next attempt runs the step again: a charge
/// that happened, twice, with no hold and no error naming the cause.
#[tokio::test(start_paused = true)]
async fn bug_forget_steps_deletes_a_running_steps_claim_and_the_step_runs_twice() {
    let idem = Idem::builder()
        .store(MemoryStore::new())
        .lease(Duration::from_secs(10))
        .build()
        .unwrap();
    let k = key("forget-steps-live");
    let charges = Arc::new(AtomicU32::new(0));
    let in_step = Arc::new(Notify::new());
    let finish = Arc::new(Notify::new());
    let run = |fin: Option<Arc<Notify>>| {
        let (idem, k, charges, in_step) =
            (idem.clone(), k.clone(), charges.clone(), in_step.clone());
        async move {
            idem.call(k, Fingerprint::NONE)
                .run_fallible(|| async move {
                    idem::step("charge", || async move {
                        charges.fetch_add(1, SeqCst);
                        if let Some(fin) = fin {
                            in_step.notify_one();
                            fin.notified().await;
                        }
                        Ok::<_, Error>("ch".to_string())
                    })
                    .await
                })
                .await
        }
    };
    let first = tokio::spawn(run(Some(finish.clone())));
    in_step.notified().await;
    let deleted = idem.forget_steps(&k, &["charge"]).await;
    finish.notify_one();
    let first = first.await.unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let second = run(None).await;
    eprintln!(
        "forget_steps {deleted:?}; first {first:?}; second {second:?}; charges {}",
        charges.load(SeqCst)
    );
    assert!(
        !matches!(deleted, Ok(1)) || charges.load(SeqCst) == 1,
        "forget_steps deleted a live step claim and the step ran twice"
    );
}
