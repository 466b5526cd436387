//! The store through consumer dedup: the first mark of a key tells duplicates apart, a
//! reused id with another payload is refused, and concurrent deliveries have one first.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::support::*;
use crate::{Error, Fingerprint, Idem, Store};

/// Consumer dedup: the first mark of a key is [`Origin::Ran`](crate::Origin::Ran),
/// every later one [`Origin::Store`](crate::Origin::Store); a handler run
/// through `consume` runs once, and its key then reads as processed to `mark_processed`.
#[doc(hidden)]
pub async fn dedup_marks_once_and_tells_duplicates(store: Arc<dyn Store>) {
    use crate::Origin;
    let idem = Idem::builder().shared_store(store).build().unwrap();
    let scope = unique_scope("dedup");
    let k = key(&scope, "orders:3:1042");
    assert!(!idem.is_processed(&k).await.unwrap());
    assert_eq!(
        idem.mark_processed(k.clone(), Fingerprint::NONE)
            .await
            .unwrap(),
        Origin::Ran
    );
    for _ in 0..3 {
        assert_eq!(
            idem.mark_processed(k.clone(), Fingerprint::NONE)
                .await
                .unwrap(),
            Origin::Store
        );
    }
    assert!(idem.is_processed(&k).await.unwrap());
    // Another key of the same scope is its own message.
    let other = key(&scope, "orders:3:1043");
    assert_eq!(
        idem.mark_processed(other, Fingerprint::NONE).await.unwrap(),
        Origin::Ran
    );

    let runs = AtomicU64::new(0);
    let handled = key(&scope, "order-confirmation:o-7:1");
    let mut deliveries = Vec::new();
    for _ in 0..3 {
        let outcome = idem
            .consume(handled.clone(), Fingerprint::NONE)
            .run(|| async {
                runs.fetch_add(1, Ordering::SeqCst);
            })
            .await
            .unwrap();
        deliveries.push(outcome.origin());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(deliveries, [Origin::Ran, Origin::Store, Origin::Store]);
    assert_eq!(
        idem.mark_processed(handled, Fingerprint::NONE)
            .await
            .unwrap(),
        Origin::Store
    );
}

/// Consumer dedup with the message's fingerprint: a redelivery of the same payload is a
/// duplicate; the same id with another payload is [`Error::KeyReuse`] through
/// `mark_processed` and `consume` alike, and its handler does not run; a record marked
/// without a fingerprint matches any payload.
#[doc(hidden)]
pub async fn dedup_refuses_a_reused_id_with_another_payload(store: Arc<dyn Store>) {
    use crate::Origin;
    let idem = Idem::builder().shared_store(store).build().unwrap();
    let scope = unique_scope("dedup-reuse");
    let (a, b) = (Fingerprint::of("payload a"), Fingerprint::of("payload b"));

    let marked = key(&scope, "evt-1");
    assert_eq!(
        idem.mark_processed(marked.clone(), a).await.unwrap(),
        Origin::Ran
    );
    assert_eq!(
        idem.mark_processed(marked.clone(), a).await.unwrap(),
        Origin::Store
    );
    assert!(matches!(
        idem.mark_processed(marked.clone(), b).await,
        Err(Error::KeyReuse { .. })
    ));

    let runs = AtomicU64::new(0);
    let handled = key(&scope, "evt-2");
    let run = || async {
        runs.fetch_add(1, Ordering::SeqCst);
    };
    let first = idem.consume(handled.clone(), a).run(run).await.unwrap();
    assert_eq!(first.origin(), Origin::Ran);
    let again = idem.consume(handled.clone(), a).run(run).await.unwrap();
    assert_eq!(again.origin(), Origin::Store);
    let reused = idem.consume(handled.clone(), b).run(run).await;
    assert!(matches!(reused, Err(Error::KeyReuse { .. })), "{reused:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the reused id did not run");
    // Each path sees the other's fingerprint.
    assert!(matches!(
        idem.mark_processed(handled, b).await,
        Err(Error::KeyReuse { .. })
    ));

    // Marked without a fingerprint: any payload is a duplicate of it.
    let trusted = key(&scope, "evt-3");
    idem.mark_processed(trusted.clone(), Fingerprint::NONE)
        .await
        .unwrap();
    assert_eq!(
        idem.mark_processed(trusted, b).await.unwrap(),
        Origin::Store
    );
}

/// Consumer dedup under real concurrency: 20 deliveries of one key marked at once, exactly
/// one is the first.
#[doc(hidden)]
pub async fn dedup_concurrent_deliveries_have_one_first(store: Arc<dyn Store>) {
    use crate::Origin;
    let idem = Idem::builder().shared_store(store).build().unwrap();
    let k = key(&unique_scope("dedup-concurrent"), "msg-1");
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let idem = idem.clone();
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            // A duplicate that finds the first still running retries, as a consumer
            // requeueing it would.
            loop {
                match idem.mark_processed(k.clone(), Fingerprint::NONE).await {
                    Err(Error::InProgress { .. }) => tokio::task::yield_now().await,
                    other => return other.unwrap(),
                }
            }
        }));
    }
    let mut firsts = 0;
    for t in tasks {
        if t.await.unwrap() == Origin::Ran {
            firsts += 1;
        }
    }
    assert_eq!(
        firsts, 1,
        "exactly one of 20 concurrent deliveries is the first"
    );
}
