//! What a record holds: payloads of any size and byte round-trip, keys that differ in any
//! byte stay apart, and the claim's fingerprint is kept.

use std::sync::Arc;

use bytes::Bytes;

use super::support::*;
use crate::{Claim, Fingerprint, Record, Store};

/// An empty payload is stored and replayed as empty, not as missing.
#[doc(hidden)]
pub async fn empty_payload_round_trips(store: Arc<dyn Store>) {
    let k = key(&unique_scope("empty"), "k");
    let t = acquire(&*store, &k, &fp(1), LONG).await;
    store.complete(&k, t, Bytes::new(), LONG).await.unwrap();
    assert_eq!(completed_payload(&*store, &k).await, Bytes::new());
}

/// A 1 MiB payload round-trips byte for byte.
#[doc(hidden)]
pub async fn large_payload_round_trips(store: Arc<dyn Store>) {
    let k = key(&unique_scope("large"), "k");
    let payload: Bytes = (0..(1usize << 20))
        .map(|i| (i * 31 % 251) as u8)
        .collect::<Vec<_>>()
        .into();
    let t = acquire(&*store, &k, &fp(1), LONG).await;
    store.complete(&k, t, payload.clone(), LONG).await.unwrap();
    let back = completed_payload(&*store, &k).await;
    assert_eq!(back.len(), payload.len());
    assert!(back == payload, "1 MiB payload changed on the way");
}

/// Every byte value, NUL and invalid UTF-8 included, round-trips.
#[doc(hidden)]
pub async fn binary_payload_round_trips(store: Arc<dyn Store>) {
    let k = key(&unique_scope("binary"), "k");
    let mut payload: Vec<u8> = (0..=255u8).collect();
    payload.extend_from_slice(&[0, 0, 0xff, 0xfe, 0xc3, 0x28]);
    let t = acquire(&*store, &k, &fp(1), LONG).await;
    store
        .complete(&k, t, Bytes::from(payload.clone()), LONG)
        .await
        .unwrap();
    assert_eq!(completed_payload(&*store, &k).await, Bytes::from(payload));
}

async fn distinct_ids(store: &dyn Store, scope: &str, ids: &[String]) {
    for (i, id) in ids.iter().enumerate() {
        let k = key(scope, id);
        let t = acquire(store, &k, &fp(1), LONG).await;
        store
            .complete(&k, t, Bytes::from(i.to_string()), LONG)
            .await
            .unwrap();
    }
    for (i, id) in ids.iter().enumerate() {
        let k = key(scope, id);
        assert_eq!(
            completed_payload(store, &k).await,
            Bytes::from(i.to_string()),
            "key {id:?} reached another key's record"
        );
    }
}

/// Unicode keys that differ only in normalisation or case stay distinct.
#[doc(hidden)]
pub async fn unicode_keys_are_distinct(store: Arc<dyn Store>) {
    let ids: Vec<String> = [
        "café",
        "cafe\u{301}",
        "CAFÉ",
        "日本語",
        "🦀",
        "\u{2126}",
        "\u{3a9}",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    distinct_ids(&*store, &unique_scope("unicode"), &ids).await;
}

/// 1 KiB keys that differ only in their last byte stay distinct.
#[doc(hidden)]
pub async fn long_keys_are_distinct(store: Arc<dyn Store>) {
    let base = "x".repeat(crate::MAX_ID_LEN - 1);
    let ids: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|s| format!("{base}{s}"))
        .collect();
    distinct_ids(&*store, &unique_scope("long"), &ids).await;
}

/// Keys with spaces, glob and hash-tag characters, separators and newlines stay distinct
/// and reach no other key.
#[doc(hidden)]
pub async fn special_character_keys_are_distinct(store: Arc<dyn Store>) {
    let ids: Vec<String> = [
        "a b",
        "a*",
        "*",
        "{a}",
        "{",
        "}",
        "a:b",
        "a/b",
        "a\nb",
        "a\r\nb",
        "'; DROP TABLE x; --",
        "%",
        "_",
        "\\",
        "\"",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    distinct_ids(&*store, &unique_scope("special"), &ids).await;
}

/// Ids holding NUL, every other C0 control character and DEL are keys like any other: each
/// is stored and stays apart from the rest, `"a\0b"` from `"a%00b"` and `"a"` included (a
/// store that escapes such bytes must not map two ids onto one record).
#[doc(hidden)]
pub async fn control_character_keys_are_distinct(store: Arc<dyn Store>) {
    let mut ids: Vec<String> = [
        "a\0b", "a%00b", "a", "a%", "a%25", "a%2500b", "\0", "\0\0", "%00", "%2500", "%",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    ids.extend(
        (0x01u8..=0x1f)
            .chain([0x7f])
            .map(|c| format!("a{}b", char::from(c))),
    );
    distinct_ids(&*store, &unique_scope("control"), &ids).await;
}

/// Equal ids in two scopes are two keys.
#[doc(hidden)]
pub async fn scopes_keep_equal_ids_apart(store: Arc<dyn Store>) {
    let (a, b) = (unique_scope("scope-a"), unique_scope("scope-b"));
    let ka = key(&a, "same-id");
    let kb = key(&b, "same-id");
    let t = acquire(&*store, &ka, &fp(1), LONG).await;
    store
        .complete(&ka, t, Bytes::from_static(b"a"), LONG)
        .await
        .unwrap();
    acquire(&*store, &kb, &fp(1), LONG).await;
}

/// The claim's fingerprint is kept and reported by InProgress, Completed and get.
#[doc(hidden)]
pub async fn fingerprint_is_kept(store: Arc<dyn Store>) {
    let k = key(&unique_scope("fingerprint"), "k");
    let t = acquire(&*store, &k, &fp(7), LONG).await;
    match claim_anew(&*store, &k, &fp(8), LONG).await.unwrap() {
        Claim::InProgress { fingerprint, .. } => assert_eq!(fingerprint, fp(7)),
        other => panic!("expected InProgress, got {other:?}"),
    }
    store
        .complete(&k, t, Bytes::from_static(b"x"), LONG)
        .await
        .unwrap();
    match claim_anew(&*store, &k, &fp(8), LONG).await.unwrap() {
        Claim::Completed { fingerprint, .. } => assert_eq!(fingerprint, fp(7)),
        other => panic!("expected Completed, got {other:?}"),
    }
    let none = key(&unique_scope("fingerprint-none"), "k");
    let t = acquire(&*store, &none, &Fingerprint::NONE, LONG).await;
    store
        .complete(&none, t, Bytes::from_static(b"x"), LONG)
        .await
        .unwrap();
    match store.get(&none).await.unwrap() {
        Some(Record::Completed { fingerprint, .. }) => assert_eq!(fingerprint, Fingerprint::NONE),
        other => panic!("expected Completed, got {other:?}"),
    }
}
