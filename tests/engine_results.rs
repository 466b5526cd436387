//! Stored results, through the facade: records that do not decode are errors naming the
//! key, codecs are kept apart, the local cache answers replays, and a result that cannot be
//! sealed (its codec refuses it, its `Serialize` panics) keeps its claim instead of inviting
//! a second run.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{
    store::Bytes, store::Claim, store::Record, store::Store, DecodeError, Error, Fingerprint, Idem,
    Key, Origin,
};
use support::engine::{key, setup, PayError};
use support::stores::{ClaimFresh, Faulty};

#[tokio::test]
async fn records_that_do_not_decode_are_errors_naming_the_key() {
    let (store, idem) = setup();
    // Junk bytes under the key.
    let k = key("junk");
    let Claim::Acquired { token, .. } =
        store.claim_fresh(&k, Duration::from_secs(5)).await.unwrap()
    else {
        panic!()
    };
    store
        .complete(
            &k,
            token,
            Bytes::from_static(b"not an envelope"),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let err = idem
        .call(k, Fingerprint::NONE)
        .run(|| async { 1u32 })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Decode {
                source: DecodeError::NotAnEnvelope,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("engine-tests/junk"), "{err}");

    // A record of a shape the type cannot read: the codec's error, never a panic.
    let _: Vec<u32> = idem
        .call(key("typed"), Fingerprint::NONE)
        .run(|| async { vec![1, 2] })
        .await
        .unwrap();
    let err = idem
        .call(key("typed"), Fingerprint::NONE)
        .run(|| async { "text".to_string() })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Decode {
                source: DecodeError::Payload { codec: "json", .. },
                ..
            }
        ),
        "{err:?}"
    );
    // A type that reads the same shape replays it: records do not carry type names, so a
    // result type may be renamed, moved or widened.
    let widened: Vec<u64> = idem
        .call(key("typed"), Fingerprint::NONE)
        .run(|| async { vec![9u64] })
        .await
        .unwrap();
    assert_eq!(widened, vec![1, 2]);

    // A record written under another result version is refused, both ways.
    let _: u32 = idem
        .call(key("versioned"), Fingerprint::NONE)
        .version(2)
        .run(|| async { 1u32 })
        .await
        .unwrap();
    for other in [0, 1, 3] {
        let err = idem
            .call(key("versioned"), Fingerprint::NONE)
            .version(other)
            .run(|| async { 2u32 })
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Decode {
                    source: DecodeError::ResultVersion { found: 2, expected },
                    ..
                } if expected == other
            ),
            "{err:?}"
        );
    }

    // A cached error read by a call that does not cache errors.
    let _: Result<u32, PayError> = idem
        .call(key("cached-err"), Fingerprint::NONE)
        .run_caching_errors(|_: &PayError| true, || async { Err(PayError::Declined) })
        .await;
    let err = idem
        .call(key("cached-err"), Fingerprint::NONE)
        .run(|| async { 1u32 })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Decode {
                source: DecodeError::UnexpectedError,
                ..
            }
        ),
        "{err:?}"
    );
}

#[cfg(feature = "postcard")]
#[tokio::test]
async fn codecs_are_kept_apart() {
    use idem::codec::{Json, Postcard};
    let (_, idem) = setup();
    let v: (u8, String) = idem
        .call(key("pc"), Fingerprint::NONE)
        .codec(Postcard)
        .run(|| async { (1, "x".into()) })
        .await
        .unwrap();
    assert_eq!(v, (1, "x".into()));
    let replay: (u8, String) = idem
        .call(key("pc"), Fingerprint::NONE)
        .codec(Postcard)
        .run(|| async { (2, "y".into()) })
        .await
        .unwrap();
    assert_eq!(replay, (1, "x".into()));
    let err = idem
        .call(key("pc"), Fingerprint::NONE)
        .codec(Json)
        .run(|| async { (3u8, String::new()) })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Decode {
                source: DecodeError::Codec {
                    found: 2,
                    expected: 1
                },
                ..
            }
        ),
        "{err:?}"
    );
}

#[cfg(feature = "bincode")]
#[tokio::test]
async fn the_bincode_codec_round_trips() {
    let (_, idem) = setup();
    let idem2 = Idem::builder()
        .shared_store(idem.store().clone())
        .codec(idem::codec::BuiltinCodec::Bincode)
        .build()
        .unwrap();
    let v: Vec<i64> = idem2
        .call(key("bc"), Fingerprint::NONE)
        .run(|| async { vec![-1, 2] })
        .await
        .unwrap();
    let replay: Vec<i64> = idem2
        .call(key("bc"), Fingerprint::NONE)
        .run(|| async { vec![] })
        .await
        .unwrap();
    assert_eq!(v, replay);
}

/// A counting store with a local cache in front of it.
fn with_local_cache() -> (Arc<Faulty>, Idem) {
    let store = Arc::new(Faulty::default());
    let idem = Idem::builder()
        .store(store.clone())
        .local_cache(100, Duration::from_secs(60))
        .build()
        .unwrap();
    (store, idem)
}

#[tokio::test]
async fn the_local_cache_answers_replays_without_the_store() {
    let (store, idem) = with_local_cache();
    let fp = Fingerprint::of("payload");
    for _ in 0..10 {
        let v: u32 = idem
            .call(key("hot"), fp)
            .run(|| async { 11 })
            .await
            .unwrap();
        assert_eq!(v, 11);
    }
    assert_eq!(
        store.claims.load(Ordering::SeqCst),
        1,
        "replays came from the local cache"
    );
    let reuse = idem
        .call(key("hot"), Fingerprint::of("other"))
        .run(|| async { 12u32 })
        .await;
    assert!(
        matches!(reuse, Err(Error::KeyReuse { .. })),
        "the cache checks fingerprints too"
    );
    assert!(idem.forget(&key("hot")).await.unwrap());
    let v: u32 = idem
        .call(key("hot"), fp)
        .run(|| async { 13 })
        .await
        .unwrap();
    assert_eq!(v, 13, "forget clears the cache as well as the store");
}

/// The local cache answers before the call's future is built, but not past a bad option:
/// a zero lease on a key the cache holds is refused as it is on any other key.
#[tokio::test]
async fn an_invalid_option_is_refused_even_when_the_local_cache_has_the_key() {
    let (_, idem) = with_local_cache();
    let run = |lease: Duration| {
        idem.call(key("cached-bad-option"), Fingerprint::NONE)
            .lease(lease)
            .with_outcome()
            .run(|| async { 7u32 })
    };
    let first = run(Duration::from_secs(5)).await.unwrap();
    let again = run(Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        (first.origin(), again.origin()),
        (Origin::Ran, Origin::LocalCache)
    );
    let bad = run(Duration::ZERO).await;
    assert!(
        matches!(
            bad,
            Err(Error::InvalidOption {
                option: "lease",
                ..
            })
        ),
        "{bad:?}"
    );
}

#[tokio::test]
async fn a_result_that_does_not_survive_its_codec_is_refused_and_not_rerun() {
    let (_, idem) = setup();
    let runs = AtomicU32::new(0);
    // JSON cannot encode a map with tuple keys.
    // The first call is refused; the claim it leaves held keeps a retry from running
    // the side effect again until its lease ends.
    for attempt in 0..2 {
        let out = idem
            .call(key("tuple-keys"), Fingerprint::NONE)
            .run(|| async {
                runs.fetch_add(1, Ordering::SeqCst);
                std::collections::HashMap::from([((1u8, 2u8), 3u8)])
            })
            .await;
        if attempt == 0 {
            assert!(matches!(out, Err(Error::Encode { .. })), "{out:?}");
        } else {
            assert!(matches!(out, Err(Error::InProgress { .. })), "{out:?}");
        }
    }
    // JSON writes NaN as null, which does not decode back into an f64: the first caller
    // would otherwise get a value that every replay fails to decode.
    // The first call is refused; the claim it leaves held keeps a retry from running
    // the side effect again until its lease ends.
    for attempt in 0..2 {
        let out = idem
            .call(key("nan"), Fingerprint::NONE)
            .run(|| async {
                runs.fetch_add(1, Ordering::SeqCst);
                f64::NAN
            })
            .await;
        if attempt == 0 {
            assert!(matches!(out, Err(Error::Encode { .. })), "{out:?}");
        } else {
            assert!(matches!(out, Err(Error::InProgress { .. })), "{out:?}");
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2, "neither body ran twice");
}

/// A result whose `Serialize` panics: the body ran (its side effect is done), but the value
/// cannot be sealed.
#[derive(Debug, PartialEq, serde::Deserialize)]
struct PanicsOnSerialize(u32);

impl serde::Serialize for PanicsOnSerialize {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        panic!("Serialize of PanicsOnSerialize")
    }
}

/// A codec whose encode panics, or fails, whatever it is given.
struct BrokenCodec {
    panics: bool,
}

impl idem::codec::Codec for BrokenCodec {
    fn id(&self) -> u8 {
        201
    }
    fn name(&self) -> &'static str {
        "broken"
    }
    fn encode<T: serde::Serialize + ?Sized>(&self, _: &T) -> Result<Vec<u8>, idem::BoxError> {
        if self.panics {
            panic!("the broken codec's encode")
        }
        Err("the broken codec cannot encode".into())
    }
    fn decode<T: serde::de::DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, idem::BoxError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

/// After a first call whose body ran and whose result could not be sealed (its task has
/// ended, with a panic or an error), the claim is still held: a retry with the same key
/// gets `InProgress` and does not run the body again.
async fn assert_claim_kept(store: &dyn Store, idem: &Idem, k: &Key, runs: &AtomicU32) {
    // Time for a background release of a dropped guard, if one had been (wrongly) spawned.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        matches!(store.get(k).await.unwrap(), Some(Record::InProgress { .. })),
        "{k}: the claim was released after the body ran"
    );
    let retry = idem
        .call(k.clone(), Fingerprint::NONE)
        .run(|| async {
            runs.fetch_add(1, Ordering::SeqCst);
            7u32
        })
        .await;
    assert!(
        matches!(retry, Err(Error::InProgress { .. })),
        "{k}: {retry:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "{k}: the side effect ran twice"
    );
}

#[tokio::test]
async fn a_result_whose_serialize_panics_keeps_its_claim_until_its_lease_ends() {
    let (store, idem) = setup();
    let runs = Arc::new(AtomicU32::new(0));
    let k = key("serialize-panics");
    let first = {
        let (idem, k, runs) = (idem.clone(), k.clone(), runs.clone());
        tokio::spawn(async move {
            idem.call(k, Fingerprint::NONE)
                .run(|| async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    PanicsOnSerialize(1)
                })
                .await
        })
    };
    assert!(first.await.unwrap_err().is_panic());
    assert_claim_kept(&*store, &idem, &k, &runs).await;

    // The same through `catch_unwind`, with a fallible body, in this very task.
    use futures_util::FutureExt;
    let k = key("serialize-panics-fallible");
    let runs = AtomicU32::new(0);
    let first = std::panic::AssertUnwindSafe(idem.call(k.clone(), Fingerprint::NONE).run_fallible(
        || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, PayError>(PanicsOnSerialize(1))
        },
    ))
    .catch_unwind()
    .await;
    assert!(first.is_err(), "the first call panicked");
    assert_claim_kept(&*store, &idem, &k, &runs).await;
}

#[tokio::test]
async fn a_cached_error_whose_serialize_panics_or_whose_predicate_panics_keeps_its_claim() {
    use futures_util::FutureExt;
    #[derive(Debug, serde::Deserialize)]
    struct Declined;
    impl serde::Serialize for Declined {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            panic!("Serialize of Declined")
        }
    }
    impl From<Error> for Declined {
        fn from(_: Error) -> Self {
            Declined
        }
    }
    let (store, idem) = setup();
    for (id, predicate_panics) in [
        ("error-serialize-panics", false),
        ("predicate-panics", true),
    ] {
        let k = key(id);
        let runs = AtomicU32::new(0);
        let first = std::panic::AssertUnwindSafe(
            idem.call(k.clone(), Fingerprint::NONE).run_caching_errors(
                |_: &Declined| {
                    if predicate_panics {
                        panic!("the cache_errors predicate")
                    }
                    true
                },
                || async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Err::<u32, _>(Declined)
                },
            ),
        )
        .catch_unwind()
        .await;
        assert!(first.is_err(), "{id}: the first call panicked");
        assert_claim_kept(&*store, &idem, &k, &runs).await;
    }
}

#[tokio::test]
async fn a_codec_whose_encode_panics_or_fails_keeps_the_claim() {
    use futures_util::FutureExt;
    let (store, idem) = setup();
    for panics in [true, false] {
        let k = key(if panics {
            "codec-panics"
        } else {
            "codec-fails"
        });
        let runs = AtomicU32::new(0);
        let first = std::panic::AssertUnwindSafe(
            idem.call(k.clone(), Fingerprint::NONE)
                .codec(BrokenCodec { panics })
                .run(|| async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    1u32
                }),
        )
        .catch_unwind()
        .await;
        match first {
            Err(_) => assert!(panics, "only the panicking codec panics"),
            Ok(out) => {
                assert!(!panics);
                assert!(matches!(out, Err(Error::Encode { .. })), "{out:?}");
            }
        }
        assert_claim_kept(&*store, &idem, &k, &runs).await;
    }
}
