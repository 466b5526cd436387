//! The behaviours of [`Store::replace`]: a completed record swapped or deleted only while it
//! holds the payload the caller read, in one atomic operation.

use std::sync::Arc;

use bytes::Bytes;

use super::support::{acquire, claim_anew, fp, key, unique_scope, LONG, PAST_SHORT, SHORT};
use crate::{Claim, Record, Store};

/// A store that sets `replaces_records` swaps a completed record only when its payload is
/// the one expected: never a missing record, an in-progress claim or another payload, and
/// never twice from the same expected payload. The fingerprint stays. One that does not set
/// it answers an error and changes nothing.
#[doc(hidden)]
pub async fn replace_swaps_only_the_completed_payload_it_expects(store: Arc<dyn Store>) {
    let k = key(&unique_scope("replace"), "k");
    let new = || Some((Bytes::from_static(b"value"), LONG));
    if !store.capabilities().replaces_records {
        let t = acquire(&*store, &k, &fp(3), LONG).await;
        store
            .complete(&k, t, Bytes::from_static(b"hold"), LONG)
            .await
            .unwrap();
        assert!(
            store.replace(&k, b"hold", new()).await.is_err(),
            "a store without `replaces_records` answered a replace"
        );
        match store.get(&k).await.unwrap() {
            Some(Record::Completed { payload, .. }) => assert_eq!(&payload[..], b"hold"),
            other => panic!("a refused replace changed the record: {other:?}"),
        }
        return;
    }
    assert!(
        !store.replace(&k, b"hold", new()).await.unwrap(),
        "replaced a record that is not there"
    );
    assert!(
        store.get(&k).await.unwrap().is_none(),
        "a replace created a record"
    );
    let t = acquire(&*store, &k, &fp(3), LONG).await;
    assert!(
        !store.replace(&k, b"", new()).await.unwrap(),
        "replaced an in-progress claim"
    );
    assert!(
        !store.replace(&k, b"hold", None).await.unwrap(),
        "deleted an in-progress claim"
    );
    assert!(
        matches!(store.get(&k).await.unwrap(), Some(Record::InProgress { token, .. }) if token == t),
        "the claim did not survive a refused replace"
    );
    store
        .complete(&k, t, Bytes::from_static(b"hold"), LONG)
        .await
        .unwrap();
    assert!(
        !store.replace(&k, b"hol", new()).await.unwrap(),
        "replaced a record whose payload is another (a prefix of it)"
    );
    assert!(
        !store.replace(&k, b"hold!", new()).await.unwrap(),
        "replaced a record whose payload is another (longer)"
    );
    assert!(store.replace(&k, b"hold", new()).await.unwrap());
    match store.get(&k).await.unwrap() {
        Some(Record::Completed {
            fingerprint,
            payload,
        }) => {
            assert_eq!(&payload[..], b"value");
            assert_eq!(fingerprint, fp(3), "a replace kept the fingerprint");
        }
        other => panic!("expected the new payload, got {other:?}"),
    }
    assert!(
        !store.replace(&k, b"hold", None).await.unwrap(),
        "a second replace from the same payload went through"
    );
    match claim_anew(&*store, &k, &fp(3), LONG).await.unwrap() {
        Claim::Completed { payload, .. } => assert_eq!(&payload[..], b"value"),
        other => panic!("expected the new payload, got {other:?}"),
    }
    assert!(store.replace(&k, b"value", None).await.unwrap());
    assert!(store.get(&k).await.unwrap().is_none(), "deleted by replace");
    assert!(
        matches!(
            claim_anew(&*store, &k, &fp(4), LONG).await.unwrap(),
            Claim::Acquired { .. }
        ),
        "a key whose record was replaced by nothing is free"
    );
}

/// A replaced record lives for the duration given with its new payload, from the replace:
/// also shorter than the record it replaced, and an ended record is never replaced.
#[doc(hidden)]
pub async fn replace_sets_the_new_records_ttl(store: Arc<dyn Store>) {
    if !store.capabilities().replaces_records {
        return;
    }
    let k = key(&unique_scope("replace-ttl"), "k");
    let t = acquire(&*store, &k, &fp(1), LONG).await;
    store
        .complete(&k, t, Bytes::from_static(b"hold"), LONG)
        .await
        .unwrap();
    let short = Some((Bytes::from_static(b"value"), SHORT));
    assert!(store.replace(&k, b"hold", short).await.unwrap());
    tokio::time::sleep(PAST_SHORT).await;
    assert!(
        store.get(&k).await.unwrap().is_none(),
        "the replaced record outlived its ttl"
    );
    assert!(
        !store.replace(&k, b"value", None).await.unwrap(),
        "replaced a record whose ttl had ended"
    );
}

/// Of many replaces racing from the payload they all read, exactly one goes through.
#[doc(hidden)]
pub async fn concurrent_replaces_have_one_winner(store: Arc<dyn Store>) {
    if !store.capabilities().replaces_records {
        return;
    }
    let k = key(&unique_scope("replace-race"), "k");
    let t = acquire(&*store, &k, &fp(1), LONG).await;
    store
        .complete(&k, t, Bytes::from_static(b"hold"), LONG)
        .await
        .unwrap();
    let barrier = Arc::new(tokio::sync::Barrier::new(20));
    let tasks: Vec<_> = (0..20u8)
        .map(|i| {
            let (store, k, barrier) = (store.clone(), k.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let new = (i % 2 == 0).then(|| (Bytes::from(vec![b'v', i]), LONG));
                store.replace(&k, b"hold", new).await.unwrap()
            })
        })
        .collect();
    let mut won = 0;
    for t in tasks {
        won += u32::from(t.await.unwrap());
    }
    assert_eq!(won, 1, "exactly one replace won");
}
