//! Bad input to the engine, through the facade: invalid keys, options and URLs are refused
//! before any store access, and durations too large to add are refused, not overflowed.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idem::{store::Bytes, store::Claim, store::Store, Error, Fingerprint, Idem, Key, MemoryStore};
use support::engine::{key, setup};
use support::stores::ClaimFresh;

#[tokio::test]
async fn bad_input_is_refused_before_any_store_access() {
    let (store, idem) = setup();
    let ran = AtomicBool::new(false);
    let body = || async {
        ran.store(true, Ordering::SeqCst);
        1u8
    };
    // A key that failed to build, as `#[idempotent]` passes it on (through its hidden
    // helper): its error is the call's answer.
    let empty = idem::__private::call(&idem, Key::new("s", ""), Fingerprint::NONE)
        .run(body)
        .await;
    assert!(
        matches!(&empty, Err(Error::InvalidKey { reason, .. }) if reason.contains("empty")),
        "{empty:?}"
    );
    let long = idem::__private::call(&idem, Key::new("s", "k".repeat(1025)), Fingerprint::NONE)
        .run(body)
        .await;
    let msg = long.unwrap_err().to_string();
    assert!(msg.contains("1025 bytes") && msg.contains("1024"), "{msg}");
    let slash = Key::new("a/b", "k").unwrap_err().to_string();
    assert!(slash.contains('/'), "{slash}");
    let zero_ttl = idem
        .call(key("zero-ttl"), Fingerprint::NONE)
        .ttl(Duration::ZERO)
        .run(body)
        .await;
    assert!(
        matches!(&zero_ttl, Err(Error::InvalidOption { option: "ttl", .. })),
        "{zero_ttl:?}"
    );
    assert!(zero_ttl
        .unwrap_err()
        .to_string()
        .contains("engine-tests/zero-ttl"));
    let zero_lease = idem
        .call(key("zero-lease"), Fingerprint::NONE)
        .lease(Duration::ZERO)
        .run(body)
        .await;
    assert!(matches!(
        zero_lease,
        Err(Error::InvalidOption {
            option: "lease",
            ..
        })
    ));
    assert_eq!(
        store.calls.load(Ordering::SeqCst),
        0,
        "nothing reached the store"
    );
    assert!(!ran.load(Ordering::SeqCst), "the body never ran");

    let built = Idem::builder()
        .store(MemoryStore::new())
        .ttl(Duration::ZERO)
        .build();
    // A configuration error, not a failure to connect.
    let err = built.unwrap_err();
    assert!(matches!(err, Error::Config { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "invalid idem configuration: Idem::builder(): `ttl` is 0ns; it must be at least 1ms"
    );
    let no_store = Idem::builder().build().unwrap_err();
    assert!(matches!(no_store, Error::Config { .. }), "{no_store:?}");
    assert!(no_store.to_string().contains(".store("), "{no_store}");
    let unknown = idem::connect("mongodb://localhost").await.unwrap_err();
    assert!(matches!(unknown, Error::Config { .. }), "{unknown:?}");
}

#[tokio::test]
async fn huge_durations_are_refused_not_overflowed() {
    let (store, idem) = setup();
    let out = idem
        .call(key("forever"), Fingerprint::NONE)
        .ttl(Duration::MAX)
        .run(|| async { 1u8 })
        .await;
    match out {
        Err(Error::InvalidOption {
            option: "ttl",
            reason,
            ..
        }) => {
            assert!(reason.contains("100 years"), "{reason}")
        }
        other => panic!("expected InvalidOption, got {other:?}"),
    }
    let out = idem
        .call(key("forever"), Fingerprint::NONE)
        .lease(Duration::MAX)
        .run(|| async { 1u8 })
        .await;
    assert!(
        matches!(
            out,
            Err(Error::InvalidOption {
                option: "lease",
                ..
            })
        ),
        "{out:?}"
    );
    assert_eq!(store.calls.load(Ordering::SeqCst), 0);
    assert!(Idem::builder()
        .store(MemoryStore::new())
        .ttl(Duration::MAX)
        .build()
        .is_err());
    // A store used directly saturates instead of panicking.
    let memory = MemoryStore::new();
    let Claim::Acquired { token, .. } = memory
        .claim_fresh(&key("direct"), Duration::MAX)
        .await
        .unwrap()
    else {
        panic!()
    };
    memory
        .complete(&key("direct"), token, Bytes::new(), Duration::MAX)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_retry_after_out_of_range_is_refused() {
    let built = Idem::builder()
        .store(MemoryStore::new())
        .retry_after(Duration::ZERO)
        .build();
    match built {
        Err(Error::Config { message, .. }) => assert!(message.contains("retry_after"), "{message}"),
        other => panic!("expected Config, got {other:?}"),
    }
    let (store, idem) = setup();
    let out = idem
        .call(key("retry-after-zero"), Fingerprint::NONE)
        .retry_after(Duration::MAX)
        .run(|| async { 1u8 })
        .await;
    assert!(
        matches!(
            out,
            Err(Error::InvalidOption {
                option: "retry_after",
                ..
            })
        ),
        "{out:?}"
    );
    assert_eq!(store.calls.load(Ordering::SeqCst), 0);
}
