//! Bad input, as proptest properties run by `cargo test` (the same properties as the
//! cargo-fuzz targets in `fuzz/`, which run them for longer):
//!
//! - the record envelope decoder, reached through the public API: arbitrary bytes planted
//!   under a key with `Store::complete`, then replayed with `Idem::call(..).run(..)`, never
//!   panic and never decode into a value of the wrong type: the answer is `Error::Decode`
//!   naming the key, or the value a valid envelope holds;
//! - a record stored for one type and read as another is `Error::Decode`;
//! - the digest encoder: arbitrary values never panic, a digest is 32 hex digits, the same
//!   for the same value, independent of map order, different for different values;
//! - keys: arbitrary scope and id never panic in `Key::new`; a key is accepted exactly when
//!   the rules say, keeps its parts, and two different keys never share a stored form.

use std::collections::{BTreeMap, HashMap};

use idem::{store::Store, store::Token, Error, Fingerprint, Idem, Key, MemoryStore};
use proptest::prelude::*;
use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// The limits ARCHITECTURE.md ("Keys") gives a key's parts, in bytes.
const MAX_SCOPE_LEN: usize = 256;
const MAX_ID_LEN: usize = 1024;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// Plants `bytes` as the completed record of a fresh key.
async fn plant(store: &MemoryStore, id: &str, bytes: Vec<u8>) -> Key {
    let key = Key::new("reliability.bad-input", id).unwrap();
    let token = Token::random();
    store
        .claim(
            &key,
            &Fingerprint::NONE,
            token,
            std::time::Duration::from_secs(60),
        )
        .await
        .unwrap();
    store
        .complete(
            &key,
            token,
            bytes.into(),
            std::time::Duration::from_secs(60),
        )
        .await
        .unwrap();
    key
}

/// The stored bytes of a real record of `value`: a valid envelope.
async fn envelope_of<T: Serialize + DeserializeOwned + Send + 'static>(
    idem: &Idem,
    id: &str,
    value: T,
) -> Vec<u8> {
    let key = Key::new("reliability.bad-input.real", id).unwrap();
    let _: T = idem
        .call(key.clone(), Fingerprint::NONE)
        .run(|| async { value })
        .await
        .unwrap();
    match idem.store().get(&key).await.unwrap() {
        Some(idem::store::Record::Completed { payload, .. }) => payload.to_vec(),
        other => panic!("{other:?}"),
    }
}

/// Replays `key` as a `T`; a body run is a failure (the record is there).
async fn replay<T: Serialize + DeserializeOwned + Send + 'static>(
    idem: &Idem,
    key: Key,
) -> Result<T, Error> {
    idem.call(key, Fingerprint::NONE)
        .run(|| async { panic!("a completed record made the body run") })
        .await
}

/// The property for one target type: arbitrary bytes decode into `Error::Decode` naming
/// the key, or into exactly the value the bytes' payload holds behind a valid header.
fn check_bytes<T>(bytes: Vec<u8>, header: &[u8])
where
    T: Serialize + DeserializeOwned + Send + PartialEq + std::fmt::Debug + 'static,
{
    rt().block_on(async {
        let store = MemoryStore::new();
        let idem = Idem::new(store.clone());
        let key = plant(&store, "arbitrary", bytes.clone()).await;
        match replay::<T>(&idem, key.clone()).await {
            Err(Error::Decode { key: k, .. }) => assert_eq!(k, key),
            Ok(v) => {
                // Only a valid envelope decodes: this codec's header, then the payload.
                // Format 1 (byte 4 = 1) is read, on purpose: its bytes 7..15 hold a
                // type-name hash that is not checked. Format 2 must carry the
                // reading call's result version (0) there.
                assert!(bytes.len() >= header.len(), "{bytes:?} decoded to {v:?}");
                assert_eq!(&bytes[..4], &header[..4], "decoded without the magic");
                assert!(
                    bytes[4] == header[4] || bytes[4] == 1,
                    "decoded under an unknown format {}: {bytes:?}",
                    bytes[4]
                );
                assert_eq!(
                    &bytes[5..7],
                    &header[5..7],
                    "decoded under a foreign codec or kind"
                );
                if bytes[4] == header[4] {
                    assert_eq!(
                        &bytes[7..15],
                        &header[7..15],
                        "decoded under a foreign result version"
                    );
                }
                let payload: T = serde_json::from_slice(&bytes[header.len()..])
                    .expect("decoded a payload that is not JSON of the type");
                assert_eq!(payload, v);
            }
            // Only the exact bytes of a hold (format 2, JSON, version 0, `{"step":..}`
            // with a valid name) hold a key.
            Err(Error::OutcomeUnknown { key: k, step }) => {
                assert_eq!(k, key);
                assert_eq!(
                    idem_core::envelope::held_step(&bytes).as_deref(),
                    Some(step.as_str()),
                    "{bytes:?} read as a hold it is not"
                );
            }
            Err(other) => panic!("arbitrary bytes answered {other:?}"),
        }
    });
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    order: String,
    cents: u64,
}

fn header() -> Vec<u8> {
    rt().block_on(async {
        let idem = Idem::new(MemoryStore::new());
        let sealed = envelope_of(&idem, "header", 7u64).await;
        sealed[..sealed.len() - 1].to_vec()
    })
}

/// The case proptest found: a header whose format byte reads 1 is a format-1 envelope,
/// read on purpose (its type-name hash is not checked), so it decodes to its payload.
#[test]
fn reliability_bad_input_a_format_1_header_is_read() {
    let mut bytes = header();
    bytes[4] = 1;
    bytes[7..15].copy_from_slice(&0x5eed_u64.to_le_bytes());
    bytes.extend_from_slice(b"7");
    let header = header();
    check_bytes::<u64>(bytes.clone(), &header);
    let value = rt().block_on(async {
        let store = MemoryStore::new();
        let idem = Idem::new(store.clone());
        let key = plant(&store, "format-1", bytes).await;
        replay::<u64>(&idem, key).await
    });
    assert_eq!(value.unwrap(), 7);
}

/// Bytes that are mostly almost-envelopes: a real header with some bytes flipped, or not,
/// then arbitrary or JSON-ish payload bytes; and some wholly arbitrary.
fn envelope_bytes() -> impl Strategy<Value = Vec<u8>> {
    let header = header();
    let json = prop_oneof![
        Just(b"7".to_vec()),
        Just(b"\"text\"".to_vec()),
        Just(b"{\"order\":\"o\",\"cents\":5}".to_vec()),
        Just(b"[1,2]".to_vec()),
        Just(b"null".to_vec()),
        Just(b"true".to_vec()),
        prop::collection::vec(any::<u8>(), 0..40),
    ];
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..64),
        (prop::collection::vec((0..15usize, any::<u8>()), 0..2), json).prop_map(
            move |(flips, payload)| {
                let mut b = header.clone();
                for (at, v) in flips {
                    b[at] = v;
                }
                b.extend_from_slice(&payload);
                b
            }
        ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn reliability_bad_input_envelope_never_panics_or_lies(bytes in envelope_bytes()) {
        let header = header();
        check_bytes::<u64>(bytes.clone(), &header);
        check_bytes::<String>(bytes.clone(), &header);
        check_bytes::<Receipt>(bytes.clone(), &header);
        check_bytes::<Vec<u32>>(bytes, &header);
    }

    #[test]
    fn reliability_bad_input_digest_is_stable_and_order_free(
        entries in prop::collection::vec((".{0,12}", any::<i64>()), 0..12),
        other in prop::collection::vec((".{0,12}", any::<i64>()), 0..12),
    ) {
        let hashed: HashMap<String, i64> = entries.iter().cloned().collect();
        let sorted: BTreeMap<String, i64> = entries.iter().cloned().collect();
        let reversed: HashMap<String, i64> = sorted.iter().rev().map(|(k, v)| (k.clone(), *v)).collect();
        let d = idem_core::digest_hex(&hashed);
        prop_assert_eq!(d.len(), 32);
        prop_assert!(d.bytes().all(|b| b.is_ascii_hexdigit()));
        prop_assert_eq!(&d, &idem_core::digest_hex(&sorted));
        prop_assert_eq!(&d, &idem_core::digest_hex(&reversed));
        let other: BTreeMap<String, i64> = other.into_iter().collect();
        if other != sorted {
            prop_assert_ne!(d, idem_core::digest_hex(&other));
        }
    }

    #[test]
    fn reliability_bad_input_keys_follow_the_rules(
        scope in prop_oneof![".{0,8}", "[a-z/%{}\\x00]{0,6}", Just("s".repeat(257))],
        id in prop_oneof![".{0,8}", "[a-z/%{}\\x00\\n]{0,6}", Just("i".repeat(1025))],
        scope2 in "[a-z/%{}]{1,4}",
        id2 in "[a-z/%{}]{1,4}",
    ) {
        let valid = !scope.is_empty()
            && scope.len() <= MAX_SCOPE_LEN
            && !scope.contains('/')
            && !id.is_empty()
            && id.len() <= MAX_ID_LEN;
        match Key::new(&scope, &id) {
            Ok(k) => {
                prop_assert!(valid, "accepted {scope:?} / {id:?}");
                prop_assert_eq!(k.scope(), scope.as_str());
                prop_assert_eq!(k.id(), id.as_str());
                prop_assert_eq!(k.as_str(), format!("{scope}/{id}"));
                // Display escapes what a terminal would act on, and never panics.
                let shown = k.to_string();
                prop_assert!(!shown.chars().any(|c| c.is_control()), "{shown:?}");
                if let Ok(k2) = Key::new(&scope2, &id2) {
                    prop_assert_eq!(k == k2, k.as_str() == k2.as_str());
                    prop_assert_eq!(k == k2, (scope.as_str(), id.as_str()) == (scope2.as_str(), id2.as_str()));
                }
            }
            Err(Error::InvalidKey { reason, .. }) => {
                prop_assert!(!valid, "refused {scope:?} / {id:?}: {reason}");
            }
            Err(other) => prop_assert!(false, "{other:?}"),
        }
    }
}

/// A record stored for one type, read as another: `Error::Decode`, for every pair.
#[tokio::test]
async fn reliability_bad_input_no_record_decodes_as_another_type() {
    let idem = Idem::new(MemoryStore::new());
    let records = [
        envelope_of(&idem, "u64", 7u64).await,
        envelope_of(&idem, "string", "seven".to_string()).await,
        envelope_of(
            &idem,
            "receipt",
            Receipt {
                order: "o".into(),
                cents: 7,
            },
        )
        .await,
        envelope_of(&idem, "list", vec!["a".to_string()]).await,
        envelope_of(&idem, "bool", true).await,
    ];
    let mut refused = 0;
    for (i, bytes) in records.iter().enumerate() {
        let mem = MemoryStore::new();
        let reader = Idem::new(mem.clone());
        let key = plant(&mem, &format!("typed-{i}"), bytes.clone()).await;
        let outcomes = [
            replay::<u64>(&reader, key.clone()).await.is_ok(),
            replay::<String>(&reader, key.clone()).await.is_ok(),
            replay::<Receipt>(&reader, key.clone()).await.is_ok(),
            replay::<Vec<String>>(&reader, key.clone()).await.is_ok(),
            replay::<bool>(&reader, key.clone()).await.is_ok(),
        ];
        for (j, ok) in outcomes.iter().enumerate() {
            assert_eq!(*ok, i == j, "record {i} read as type {j}");
            refused += usize::from(!ok);
        }
    }
    assert_eq!(refused, 20);
    eprintln!("reliability bad input: 5 record types read as each other, 20 pairs refused");
}
