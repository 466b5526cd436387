//! The store through the engine: a body runs once and every caller gets its value, a result
//! that is not an idem record is a decode error, duplicates wait for one run, and a body
//! sees its claim's fence.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::support::*;
use crate::{
    Claim, Error, Fence, Fingerprint, Idem, InProgress, Key, Store, StoreError, StoreWrapper, Token,
};

/// Records the fence of every claim that acquires: what the store gave, to compare with
/// what the body saw.
#[derive(Debug)]
struct FenceRecorder {
    inner: Arc<dyn Store>,
    given: std::sync::Mutex<Vec<Fence>>,
}

#[crate::async_trait]
impl StoreWrapper for FenceRecorder {
    type Inner = dyn Store;

    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn claim(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let claim = self.inner.claim(key, fingerprint, token, lease).await?;
        if let Claim::Acquired { fence, .. } = &claim {
            self.given.lock().unwrap().push(*fence);
        }
        Ok(claim)
    }
}

/// What a body of [`engine_body_sees_its_fence`] answers: the fence it saw, as an error
/// (so that the claim is released) or a value.
#[derive(Debug)]
enum Seen {
    Idem(#[allow(dead_code)] Error),
    Released(Option<u64>),
}

impl From<Error> for Seen {
    fn from(e: Error) -> Self {
        Seen::Idem(e)
    }
}

/// Through the engine: a body reads its claim's fence with [`crate::fence()`], and it is the
/// fence the store gave that claim (`None` where the store assigns none, and outside a
/// body). After a holder that crashed (its lease ended), the call taking the key over sees a
/// larger fence than the crashed holder's; it fails, and the next call's body sees a larger
/// one still; a replay runs no body.
#[doc(hidden)]
pub async fn engine_body_sees_its_fence(store: Arc<dyn Store>) {
    let assigns = store.capabilities().assigns_fences;
    let recorder = Arc::new(FenceRecorder {
        inner: store.clone(),
        given: Default::default(),
    });
    let idem = Idem::builder()
        .shared_store(recorder.clone())
        .build()
        .unwrap();
    let k = key(&unique_scope("engine-fence"), "k");
    assert_eq!(crate::fence(), None, "no body runs here");

    // A holder that crashed: claimed, and never extended nor completed.
    let crashed = fence_of(&*store, &k, Token::random(), SHORT, "the crashed holder").await;
    tokio::time::sleep(PAST_SHORT).await;

    let failed = idem
        .call(k.clone(), fp(1))
        .run_fallible(|| async {
            Err::<Option<u64>, _>(Seen::Released(crate::fence().map(Fence::get)))
        })
        .await;
    let Err(Seen::Released(first)) = failed else {
        panic!("the first body's error comes back: {failed:?}")
    };
    let ran = idem
        .call(k.clone(), fp(1))
        .run_fallible(|| async { Ok::<_, Seen>(crate::fence().map(Fence::get)) })
        .await
        .unwrap();
    let replayed = idem
        .call(k.clone(), fp(1))
        .run_fallible(|| async { Ok::<_, Seen>(Some(u64::MAX)) })
        .await
        .unwrap();
    assert_eq!(replayed, ran, "a replay answers the stored value");

    let given = recorder.given.lock().unwrap().clone();
    assert_eq!(given.len(), 2, "two claims acquired: {given:?}");
    if assigns {
        assert_eq!(
            first,
            Some(given[0].get()),
            "the body sees the fence its claim got"
        );
        assert_eq!(
            ran,
            Some(given[1].get()),
            "the body sees the fence its claim got"
        );
    } else {
        assert_eq!(
            (first, ran),
            (None, None),
            "no fence where the store assigns none"
        );
    }
    assert_fences(
        &*store,
        &[
            ("the crashed holder", crashed),
            ("the takeover by a call", given[0]),
            ("the call after its release", given[1]),
        ],
    );
}

/// Through the engine: the body runs once, every caller gets its value.
#[doc(hidden)]
pub async fn engine_runs_once_and_replays(store: Arc<dyn Store>) {
    let idem = Idem::builder().shared_store(store).build().unwrap();
    let k = key(&unique_scope("engine"), "k");
    let runs = AtomicU64::new(0);
    for _ in 0..5 {
        let v: Vec<String> = idem
            .call(k.clone(), fp(1))
            .run(|| async {
                runs.fetch_add(1, Ordering::SeqCst);
                vec!["a".to_string(), "é".to_string()]
            })
            .await
            .unwrap();
        assert_eq!(v, vec!["a", "é"]);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let reuse = idem
        .call(k.clone(), fp(2))
        .run(|| async { vec![String::new()] })
        .await;
    assert!(matches!(reuse, Err(Error::KeyReuse { .. })), "{reuse:?}");
}

/// Through the engine: a stored result that is not an idem record (a foreign writer, a
/// damaged row) is `Error::Decode` naming the key, never a value and never a second run.
#[doc(hidden)]
pub async fn engine_undecodable_result_is_a_decode_error_naming_the_key(store: Arc<dyn Store>) {
    let k = key(&unique_scope("junk"), "k");
    let t = acquire(&*store, &k, &fp(1), LONG).await;
    store
        .complete(&k, t, Bytes::from_static(b"not an envelope"), LONG)
        .await
        .unwrap();
    let idem = Idem::builder().shared_store(store).build().unwrap();
    let runs = AtomicU64::new(0);
    let err = idem
        .call(k.clone(), Fingerprint::NONE)
        .run(|| async {
            runs.fetch_add(1, Ordering::SeqCst);
            1u8
        })
        .await
        .unwrap_err();
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the body ran again");
    assert!(
        matches!(&err, Error::Decode { key, .. } if *key == k),
        "{err:?}"
    );
    assert!(err.to_string().contains(k.as_str()), "{err}");
}

/// Through the engine: 20 concurrent duplicates in wait mode, one execution, one value.
#[doc(hidden)]
pub async fn engine_concurrent_duplicates_wait_for_one_run(store: Arc<dyn Store>) {
    let idem = Idem::builder()
        .shared_store(store)
        .in_progress(InProgress::Wait)
        .wait_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let k = key(&unique_scope("engine-wait"), "k");
    let runs = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let (idem, k, runs) = (idem.clone(), k.clone(), runs.clone());
            tokio::spawn(async move {
                idem.call(k, fp(1))
                    .run(|| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        i
                    })
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut values = Vec::new();
    for t in tasks {
        values.push(t.await.unwrap());
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the body ran more than once"
    );
    assert!(
        values.iter().all(|v| *v == values[0]),
        "callers got different values: {values:?}"
    );
}
