//! Hostile review: the resolution bugs found on the memory store (tests/steps_attack.rs),
//! on every real backend. FAILING at the commit attacked: holds are byte-identical, so a
//! stale compare-and-set resolves a newer hold (ABA), and NotRan then Ran both answer
//! Resolved. Backends from `IDEM_TEST_*` (skipped when unset); SQLite in a temp file.

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::testing::backend_url;
use idem::{
    steps::Resolution, steps::Resolved, steps::Step, store::Bytes, store::Store, store::StoreError,
    store::StoreWrapper, Error, Fingerprint, Idem, Key,
};
use tokio::sync::Notify;

tokio::task_local! {
    static WHO: &'static str;
}

fn urls() -> Vec<(&'static str, String)> {
    let dir = std::env::temp_dir().join(format!("idem-steps-attack-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut out = vec![("sqlite", format!("sqlite://{}", dir.join("a.db").display()))];
    for (name, var) in [
        ("postgres", "IDEM_TEST_POSTGRES_URL"),
        ("mysql", "IDEM_TEST_MYSQL_URL"),
        ("redis", "IDEM_TEST_REDIS_URL"),
    ] {
        if let Some(url) = backend_url(var) {
            out.push((name, url));
        }
    }
    out
}

fn key(backend: &str, id: &str) -> Key {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    Key::new("attack.steps", format!("{backend}-{id}-{now}")).unwrap()
}

fn ambiguous() -> Error {
    Error::Config {
        message: "gateway timed out after the request was sent".into(),
        source: None,
    }
}

/// A step to stop at: the operation, whether on a step's record, and the notifies that say
/// it was reached and let it go on.
type Stop = (&'static str, bool, Arc<Notify>, Arc<Notify>);

#[derive(Debug, Clone)]
struct Gated {
    inner: Arc<dyn Store>,
    /// (who, op on a step key?) -> (reached, go)
    rules: Arc<Mutex<Vec<Stop>>>,
}

impl Gated {
    fn stop(&self, who: &'static str, step_key: bool) -> (Arc<Notify>, Arc<Notify>) {
        let (r, g) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        self.rules
            .lock()
            .unwrap()
            .push((who, step_key, r.clone(), g.clone()));
        (r, g)
    }
}

#[idem::store::async_trait]
impl StoreWrapper for Gated {
    type Inner = Arc<dyn Store>;
    fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }
    async fn replace(
        &self,
        key: &Key,
        expected: &[u8],
        new: Option<(Bytes, Duration)>,
    ) -> Result<bool, StoreError> {
        if let Ok(who) = WHO.try_with(|w| *w) {
            let step = key.scope().contains("#step:");
            let hit = {
                let mut rules = self.rules.lock().unwrap();
                let at = rules.iter().position(|r| r.0 == who && r.1 == step);
                at.map(|i| rules.remove(i))
            };
            if let Some((_, _, reached, go)) = hit {
                reached.notify_one();
                go.notified().await;
            }
        }
        self.inner.replace(key, expected, new).await
    }
}

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
    assert!(matches!(out, Err(Error::OutcomeUnknown { .. })), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bug_every_store_a_stale_resolution_resolves_a_newer_hold() {
    let mut failures = Vec::new();
    for (backend, url) in urls() {
        let store = Gated {
            inner: idem::stores::connect(&url).await.unwrap(),
            rules: Default::default(),
        };
        let idem = Idem::new(store.clone());
        let (k, charges) = (key(backend, "aba"), Arc::new(AtomicU32::new(0)));
        hold(&idem, &k, &charges).await;
        let (reached, go) = store.stop("a", true);
        let a = {
            let (idem, k) = (idem.clone(), k.clone());
            tokio::spawn(WHO.scope("a", async move {
                idem.resolve(&k, "charge", Resolution::NotRan).await
            }))
        };
        reached.notified().await;
        assert_eq!(
            idem.resolve(&k, "charge", Resolution::NotRan)
                .await
                .unwrap(),
            Resolved::Resolved
        );
        hold(&idem, &k, &charges).await;
        go.notify_one();
        let a = a.await.unwrap();
        let next = attempt(&idem, &k, &charges, false).await;
        eprintln!(
            "{backend}: stale resolution {a:?}, next {next:?}, charges {}",
            charges.load(SeqCst)
        );
        if !matches!(next, Err(Error::OutcomeUnknown { .. })) {
            failures.push(format!(
                "{backend}: {next:?} after {} charges",
                charges.load(SeqCst)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "a stale resolution resolved a newer hold: {failures:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bug_every_store_not_ran_then_ran_both_answer_resolved() {
    let mut failures = Vec::new();
    for (backend, url) in urls() {
        let store = Gated {
            inner: idem::stores::connect(&url).await.unwrap(),
            rules: Default::default(),
        };
        let idem = Idem::new(store.clone());
        let (k, charges) = (key(backend, "mixed"), AtomicU32::new(0));
        hold(&idem, &k, &charges).await;
        let (reached, go) = store.stop("a", false);
        let a = {
            let (idem, k) = (idem.clone(), k.clone());
            tokio::spawn(WHO.scope("a", async move {
                idem.resolve(&k, "charge", Resolution::NotRan).await
            }))
        };
        reached.notified().await;
        let b = idem
            .resolve(&k, "charge", Resolution::ran("ch_b").unwrap())
            .await
            .unwrap();
        go.notify_one();
        let a = a.await.unwrap().unwrap();
        eprintln!("{backend}: NotRan {a:?}, Ran {b:?}");
        if a == Resolved::Resolved && b == Resolved::Resolved {
            failures.push(backend);
        }
    }
    assert!(
        failures.is_empty(),
        "both answered Resolved on {failures:?}"
    );
}
