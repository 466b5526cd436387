//! What is stored outlives the build that wrote it. These tests read the committed files
//! under `tests/golden/` and must pass forever: records written by every codec (the exact
//! bytes this build writes, and that this build reads them back, also into a renamed and
//! widened type), a record of the first envelope format, the default scopes of a free fn,
//! a method, a generic method and an `#[async_trait]` method, and key ids and fingerprints.
//!
//! Changing a golden file is a breaking change: every record or key stored by users under
//! the old one stops replaying. A mismatch prints what this build produces instead.

use std::path::Path;
use std::time::Duration;

use idem::codec::BuiltinCodec;
use idem::{
    idempotent, store::Bytes, store::Claim, store::Record, store::Store, store::Token, Fingerprint,
    Idem, Key, MemoryStore,
};
use serde::{Deserialize, Serialize};

fn golden(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    let text = text.trim();
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The result type the golden records hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    charge_id: String,
    amount_cents: u64,
    currency: String,
    captured: bool,
}

/// The same result after a refactor: renamed, fields reordered, one field added with a
/// default. JSON records of `Receipt` must still replay into it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct ChargeReceipt {
    currency: String,
    captured: bool,
    amount_cents: u64,
    charge_id: String,
    #[serde(default)]
    refunded_cents: u64,
}

fn receipt() -> Receipt {
    Receipt {
        charge_id: "ch_1".into(),
        amount_cents: 1250,
        currency: "EUR".into(),
        captured: true,
    }
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
enum PaymentError {
    Declined { reason: String },
    Idem(String),
}

impl From<idem::Error> for PaymentError {
    fn from(e: idem::Error) -> Self {
        PaymentError::Idem(e.to_string())
    }
}

fn key(id: &str) -> Key {
    Key::new("golden", id).unwrap()
}

/// The bytes a completed record holds under `key`.
async fn stored_bytes(store: &dyn Store, key: &Key) -> Bytes {
    match store.get(key).await.unwrap() {
        Some(Record::Completed { payload, .. }) => payload,
        other => panic!("expected a completed record under {key}, got {other:?}"),
    }
}

/// Puts `bytes` into `store` under `key` as a completed record, as an older build would
/// have left it.
async fn plant(store: &dyn Store, key: &Key, bytes: Vec<u8>) {
    let token = match store
        .claim(
            key,
            &Fingerprint::NONE,
            Token::random(),
            Duration::from_secs(30),
        )
        .await
        .unwrap()
    {
        Claim::Acquired { token, .. } => token,
        other => panic!("expected a fresh key, got {other:?}"),
    };
    store
        .complete(key, token, Bytes::from(bytes), Duration::from_secs(600))
        .await
        .unwrap();
}

/// The golden record files, with the codec and version that wrote them.
fn record_files() -> Vec<(&'static str, BuiltinCodec, u64)> {
    // Pushed to only with the postcard or bincode feature.
    #[allow(unused_mut)]
    let mut files = vec![
        ("record-json.hex", BuiltinCodec::Json, 0),
        ("record-json-version-3.hex", BuiltinCodec::Json, 3),
    ];
    #[cfg(feature = "postcard")]
    files.push(("record-postcard.hex", BuiltinCodec::Postcard, 0));
    #[cfg(feature = "bincode")]
    files.push(("record-bincode.hex", BuiltinCodec::Bincode, 0));
    files
}

#[tokio::test]
async fn records_are_written_byte_for_byte_as_the_golden_files() {
    let mut mismatches = Vec::new();
    for (file, codec, version) in record_files() {
        let idem = Idem::new(MemoryStore::new());
        let k = key(file);
        let _: Receipt = idem
            .call(k.clone(), Fingerprint::NONE)
            .codec(codec)
            .version(version)
            .run(|| async { receipt() })
            .await
            .unwrap();
        let written = hex(&stored_bytes(&**idem.store(), &k).await);
        if written != golden(file).trim() {
            mismatches.push(format!("{file}: this build writes {written}"));
        }
    }
    // A cached error.
    let idem = Idem::new(MemoryStore::new());
    let k = key("error");
    let _: Result<Receipt, PaymentError> = idem
        .call(k.clone(), Fingerprint::NONE)
        .run_caching_errors(
            |_| true,
            || async {
                Err(PaymentError::Declined {
                    reason: "insufficient funds".into(),
                })
            },
        )
        .await;
    let written = hex(&stored_bytes(&**idem.store(), &k).await);
    if written != golden("record-json-error.hex").trim() {
        mismatches.push(format!(
            "record-json-error.hex: this build writes {written}"
        ));
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[tokio::test]
async fn golden_records_replay_into_the_type_and_its_refactored_successor() {
    for (file, codec, version) in record_files() {
        let idem = Idem::new(MemoryStore::new());
        let k = key(file);
        plant(&**idem.store(), &k, unhex(&golden(file))).await;
        let got: Receipt = idem
            .call(k.clone(), Fingerprint::NONE)
            .codec(codec)
            .version(version)
            .run(|| async { unreachable!("{file}: replayed, never run") })
            .await
            .unwrap_or_else(|e| panic!("{file}: {e:?}"));
        assert_eq!(got, receipt(), "{file}");
        // Another version is refused, not decoded.
        let err = idem
            .call(k.clone(), Fingerprint::NONE)
            .codec(codec)
            .version(version + 1)
            .run(|| async { receipt() })
            .await
            .unwrap_err();
        assert!(matches!(err, idem::Error::Decode { .. }), "{file}: {err:?}");
    }
    // JSON: the type renamed, its fields reordered, a defaulted field added.
    let idem = Idem::new(MemoryStore::new());
    plant(
        &**idem.store(),
        &key("json"),
        unhex(&golden("record-json.hex")),
    )
    .await;
    let evolved: ChargeReceipt = idem
        .call(key("json"), Fingerprint::NONE)
        .run(|| async { unreachable!("replayed, never run") })
        .await
        .unwrap();
    assert_eq!(
        evolved,
        ChargeReceipt {
            currency: "EUR".into(),
            captured: true,
            amount_cents: 1250,
            charge_id: "ch_1".into(),
            refunded_cents: 0,
        }
    );
    // A cached error replays as that error.
    plant(
        &**idem.store(),
        &key("error"),
        unhex(&golden("record-json-error.hex")),
    )
    .await;
    let err = idem
        .call(key("error"), Fingerprint::NONE)
        .run_caching_errors(
            |_| true,
            || async { Ok::<Receipt, PaymentError>(receipt()) },
        )
        .await
        .unwrap_err();
    assert_eq!(
        err,
        PaymentError::Declined {
            reason: "insufficient funds".into()
        }
    );
}

#[tokio::test]
async fn records_of_the_first_format_still_replay() {
    // Written by idem before the golden files (envelope format 1, whose header held a hash
    // of the type's compiler name); read as result version 0.
    let idem = Idem::new(MemoryStore::new());
    plant(
        &**idem.store(),
        &key("v1"),
        unhex(&golden("record-v1-json.hex")),
    )
    .await;
    let got: Receipt = idem
        .call(key("v1"), Fingerprint::NONE)
        .run(|| async { unreachable!("replayed, never run") })
        .await
        .unwrap();
    assert_eq!(got, receipt());
}

// --- scopes ---------------------------------------------------------------------------------

mod shop {
    use idem::{idempotent, store::async_trait, Idem};

    #[idempotent(key = order_id, store = idem, skip(idem))]
    pub async fn place_order(idem: &Idem, order_id: u64) -> u64 {
        order_id
    }

    pub struct Cart {
        pub idem: Idem,
    }

    #[idem::scoped]
    impl Cart {
        #[idempotent(key = order_id, store = self.idem)]
        pub async fn checkout(&self, order_id: u64) -> u64 {
            order_id
        }

        #[idempotent(key = order_id, store = self.idem, scope = "shop::Cart::add")]
        pub async fn add<T: serde::Serialize + Send + Sync>(&self, order_id: u64, item: T) -> u64 {
            let _ = item;
            order_id
        }
    }

    #[async_trait]
    pub trait Checkout {
        async fn pay(&self, order_id: u64) -> Result<u64, idem::Error>;
    }

    #[async_trait]
    #[idem::scoped]
    impl Checkout for Cart {
        #[idempotent(key = order_id, store = self.idem)]
        async fn pay(&self, order_id: u64) -> Result<u64, idem::Error> {
            Ok(order_id)
        }
    }
}

#[tokio::test]
async fn default_scopes_are_the_golden_ones() {
    use shop::Checkout;
    let idem = Idem::new(MemoryStore::new());
    let cart = shop::Cart { idem: idem.clone() };
    shop::place_order(&idem, 1).await.unwrap();
    cart.checkout(2).await.unwrap();
    cart.add(3, "socks").await.unwrap();
    cart.add(4, 42u8).await.unwrap();
    cart.pay(5).await.unwrap();
    let cases = [
        ("free fn", "1"),
        ("method", "2"),
        ("generic method", "3"),
        ("async_trait method", "5"),
    ];
    let text = golden("scopes.txt");
    let mut golden_scopes = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| l.split_once(" = ").expect("`name = scope` lines"));
    for (name, id) in cases {
        let (file_name, scope) = golden_scopes.next().expect("a line per case");
        assert_eq!(file_name, name, "scopes.txt lists the cases in order");
        let k = Key::new(scope, id).unwrap();
        assert!(
            idem.store().get(&k).await.unwrap().is_some(),
            "{name}: nothing stored under the golden scope `{scope}`"
        );
    }
    // Instantiations of the generic method share its explicit scope.
    let k = Key::new("shop::Cart::add", "4").unwrap();
    assert!(idem.store().get(&k).await.unwrap().is_some());
}

// --- key ids and fingerprints ---------------------------------------------------------------

#[derive(Serialize)]
struct ChargeRequest {
    order_id: String,
    amount_cents: u64,
    currency: String,
    metadata: std::collections::BTreeMap<String, String>,
    coupon: Option<String>,
}

fn request() -> ChargeRequest {
    ChargeRequest {
        order_id: "o-1".into(),
        amount_cents: 1250,
        currency: "EUR".into(),
        metadata: [("channel".to_string(), "web".to_string())].into(),
        coupon: None,
    }
}

#[idempotent(store = idem, skip(idem))]
async fn charge(idem: &Idem, req: ChargeRequest) -> u64 {
    req.amount_cents
}

#[tokio::test]
async fn key_ids_and_fingerprints_are_the_golden_ones() {
    let idem = Idem::new(MemoryStore::new());
    charge(&idem, request()).await.unwrap();
    let fp = Fingerprint::of(&(&request(),));
    let actual = format!(
        "key id of the request = {}\nkey id of the argument tuple = {}\nfingerprint of the argument tuple = {}\n",
        idem_core::digest_hex(&request()),
        idem_core::digest_hex(&(&request(),)),
        hex(fp.as_bytes()),
    );
    assert_eq!(actual, golden("keys.txt"), "this build computes:\n{actual}");
    // The macro's key-less fn is keyed by the digest of its argument tuple, and stored
    // with that fingerprint.
    let k = Key::new("golden::charge", idem_core::digest_hex(&(&request(),))).unwrap();
    match idem.store().get(&k).await.unwrap() {
        Some(Record::Completed { fingerprint, .. }) => assert_eq!(fingerprint, fp),
        other => panic!("expected the charge under its digest key, got {other:?}"),
    }
}

/// The id a `key = <expr>` gets, by the key's type: a value that serializes as a string or
/// an integer is its own id, any other its digest. Stored keys outlive the build, so the
/// table is golden; the types of the first format (str, String, Cow, Box, Arc, integers,
/// and an Option of one) kept their ids when the macro moved to this rule.
#[test]
fn key_ids_by_key_type_are_the_golden_ones() {
    use std::borrow::Cow;
    use std::num::NonZeroU64;
    use std::sync::Arc;

    #[derive(Serialize)]
    struct Plain(String);
    #[derive(Serialize)]
    #[serde(transparent)]
    struct Transparent(String);
    #[derive(Serialize)]
    struct Pair {
        a: u32,
        b: &'static str,
    }

    fn id<T: Serialize + ?Sized>(value: &T) -> String {
        match idem::__private::key("golden::key", value) {
            Ok(key) => key.id().to_owned(),
            Err(idem::Error::MissingKey { .. }) => "(no key)".to_owned(),
            Err(err) => format!("error: {err}"),
        }
    }
    let rows = [
        ("&str", id("o-1")),
        ("String", id(&String::from("o-1"))),
        ("Cow<str>", id(&Cow::<str>::Borrowed("o-1"))),
        ("Box<str>", id(&Box::<str>::from("o-1"))),
        ("Arc<str>", id(&Arc::<str>::from("o-1"))),
        ("u64", id(&42u64)),
        ("i32", id(&-7i32)),
        ("u128", id(&u128::MAX)),
        ("Option<String> Some", id(&Some(String::from("o-1")))),
        ("Option<u64> None", id(&None::<u64>)),
        ("Option<Pair> Some", id(&Some(Pair { a: 1, b: "x" }))),
        ("NonZeroU64", id(&NonZeroU64::new(42).unwrap())),
        (
            "transparent newtype of String",
            id(&Transparent("o-1".into())),
        ),
        ("newtype of String", id(&Plain("o-1".into()))),
        ("struct", id(&Pair { a: 1, b: "x" })),
        ("tuple", id(&(1u32, "x"))),
    ];
    let actual: String = rows
        .iter()
        .map(|(ty, id)| format!("{ty} = {id}\n"))
        .collect();
    assert_eq!(
        actual,
        golden("key-ids.txt"),
        "this build computes:\n{actual}"
    );
    // The first format's rule, checked apart from the file: readable types are their
    // text, the others the digest of the whole value.
    assert_eq!(rows[0].1, "o-1");
    assert_eq!(rows[5].1, "42");
    assert_eq!(rows[13].1, idem_core::digest_hex(&Plain("o-1".into())));
    assert_eq!(rows[14].1, idem_core::digest_hex(&Pair { a: 1, b: "x" }));
    assert_eq!(rows[10].1, rows[14].1, "Some(v) is keyed as v");
}

/// The stored format of steps (`idem::step`): the key of a step's record, the key a step
/// hands on (`idem::steps::step_key`), a step's value record (the JSON codec at result version 0:
/// the bytes of `record-json.hex`), and the hold a step whose outcome is unknown leaves on
/// its record and on the call's key (`step-held.hex`).
#[tokio::test]
async fn step_records_are_the_golden_ones_and_golden_ones_are_read() {
    let lines = golden("steps.txt");
    let expected: Vec<&str> = lines.lines().filter(|l| !l.starts_with('#')).collect();
    let parent = Key::new("golden::checkout", "o-1").unwrap();
    let record_key = parent.step("charge").unwrap();
    let idem = Idem::new(MemoryStore::new());
    let handed_on = idem
        .call(parent.clone(), Fingerprint::NONE)
        .run_fallible(|| async { idem::steps::step_key("charge") })
        .await
        .unwrap();
    let produced = [record_key.as_str().to_owned(), handed_on];
    assert_eq!(
        expected,
        produced.iter().map(String::as_str).collect::<Vec<_>>(),
        "the step keys changed: stored step records and provider keys would be lost"
    );

    // Written: a step's value, left by an attempt that failed after it...
    let store = MemoryStore::new();
    let idem = Idem::new(store.clone());
    let failed: Result<(), idem::Error> = idem
        .call(parent.clone(), Fingerprint::NONE)
        .run_fallible(|| async {
            idem::step("charge", || async { Ok::<_, idem::Error>(receipt()) }).await?;
            Err(idem::Error::Config {
                message: "stock service down".into(),
                source: None,
            })
        })
        .await;
    assert!(failed.is_err());
    let value = stored_bytes(&store, &record_key).await;
    assert_eq!(
        hex(&value),
        golden("record-json.hex").trim(),
        "a step's value record"
    );
    // ...and the hold of a step whose outcome is unknown, on the step and on the call.
    let held = Key::new("golden::checkout", "o-2").unwrap();
    let answer: Result<(), idem::Error> = idem
        .call(held.clone(), Fingerprint::NONE)
        .run_fallible(|| async {
            idem::steps::Step::new("charge")
                .unknown_if(|_: &idem::Error| true)
                .run(|| async {
                    Err::<(), _>(idem::Error::Config {
                        message: "gateway timed out".into(),
                        source: None,
                    })
                })
                .await
        })
        .await;
    assert!(
        matches!(answer, Err(idem::Error::OutcomeUnknown { .. })),
        "{answer:?}"
    );
    // A hold carries the id of the attempt that wrote it (16 hex digits, the same on the
    // step and on the call): the golden bytes with that id in place of the golden one.
    let golden_hold = golden("step-held.hex");
    let golden_hold_id = golden("step-held-id.hex");
    let golden_id = "0123456789abcdef";
    let mut ids = Vec::new();
    for k in [held.clone(), held.step("charge").unwrap()] {
        let bytes = stored_bytes(&store, &k).await;
        let text = String::from_utf8_lossy(&bytes[15..]).into_owned();
        let id = text
            .strip_prefix(r#"{"step":"charge","hold":""#)
            .and_then(|rest| rest.strip_suffix(r#""}"#))
            .unwrap_or_else(|| panic!("the hold under {k}: {text}"))
            .to_owned();
        let expected = golden_hold_id
            .trim()
            .replace(&hex(golden_id.as_bytes()), &hex(id.as_bytes()));
        assert_eq!(hex(&bytes), expected, "the hold under {k}");
        ids.push(id);
    }
    assert_eq!(ids[0], ids[1], "one attempt's holds share their id");

    // Read: golden bytes planted as an older build left them.
    let store = MemoryStore::new();
    let idem = Idem::new(store.clone());
    let resumed = Key::new("golden::checkout", "o-3").unwrap();
    plant(
        &store,
        &resumed.step("charge").unwrap(),
        unhex(&golden("record-json.hex")),
    )
    .await;
    let got: Receipt = idem
        .call(resumed.clone(), Fingerprint::NONE)
        .run_fallible(|| async {
            idem::step("charge", || async {
                Err::<Receipt, _>(idem::Error::Config {
                    message: "charged again: the golden step record was not read".into(),
                    source: None,
                })
            })
            .await
        })
        .await
        .unwrap();
    assert_eq!(got, receipt());
    for (id, bytes) in [("o-4", &golden_hold), ("o-5", &golden_hold_id)] {
        let on_hold = Key::new("golden::checkout", id).unwrap();
        plant(&store, &on_hold, unhex(bytes)).await;
        let answer = idem
            .call(on_hold.clone(), Fingerprint::NONE)
            .run(|| async { panic!("a held key ran its body") as u8 })
            .await;
        match answer {
            Err(idem::Error::OutcomeUnknown { step, .. }) => assert_eq!(step, "charge"),
            other => panic!("expected the golden hold to hold the key, got {other:?}"),
        }
    }
}
