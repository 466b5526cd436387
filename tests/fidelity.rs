//! A caller never gets a value other than the one the body returned: a value that does not
//! come back unchanged through its codec is refused with `Error::Encode`, for every codec,
//! and nothing is stored for it. Also: a key expression that yields `None` is a missing
//! key, never one key shared by every request without an id.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU32, Ordering};

use idem::codec::BuiltinCodec;
use idem::{idempotent, store::Record, Error, Idem, Key, MemoryStore};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// An untagged enum whose variants share a shape: JSON writes `Units(5)` as `5`, which
/// decodes as the first variant that fits, `Cents(5)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
enum Amount {
    Cents(u64),
    Units(u64),
}

/// What one call did with a value: gave it back unchanged, or refused it.
#[derive(Debug, PartialEq)]
enum Outcome {
    Same,
    Refused,
}

/// The body under test, through the macro as users write it: it counts its runs and
/// returns its argument.
#[idempotent(key = id, scope = "fidelity", store = idem, codec = codec, fingerprint = none, skip(idem, codec, runs))]
async fn echo<T>(idem: &Idem, codec: BuiltinCodec, runs: &AtomicU32, id: String, value: T) -> T
where
    T: Serialize + DeserializeOwned + PartialEq + Debug + Send + Sync,
{
    runs.fetch_add(1, Ordering::SeqCst);
    value
}

/// Runs `value` through a fresh key with `codec` and checks the promise: either the caller
/// gets exactly the value (compared by its debug form, which tells a NaN and every variant
/// apart) and it is stored, or `Error::Encode` and nothing completed is stored; and a second
/// call never gets another value.
async fn outcome<T>(idem: &Idem, codec: BuiltinCodec, id: &str, value: T) -> Outcome
where
    T: Serialize + DeserializeOwned + PartialEq + Debug + Clone + Send + Sync + 'static,
{
    let id = format!("{codec:?}/{id}");
    let key = Key::new("fidelity", &id).unwrap();
    let runs = AtomicU32::new(0);
    let expected = format!("{value:?}");
    let out = echo(idem, codec, &runs, id.clone(), value.clone()).await;
    let stored = matches!(
        idem.store().get(&key).await.unwrap(),
        Some(Record::Completed { .. })
    );
    let outcome = match out {
        Ok(got) => {
            assert_eq!(format!("{got:?}"), expected, "{id}: another value");
            assert!(stored, "{id}: returned but not stored");
            // The replay gives the same value again.
            let again: T = echo(idem, codec, &runs, id.clone(), value).await.unwrap();
            assert_eq!(format!("{again:?}"), expected, "{id}: replay");
            Outcome::Same
        }
        Err(Error::Encode { key: k, source }) => {
            assert_eq!(k, key);
            assert!(!stored, "{id}: refused, yet stored");
            let why = source.to_string();
            assert!(
                why.contains("codec"),
                "{id}: the error says what happened: {why}"
            );
            Outcome::Refused
        }
        Err(other) => panic!("{id}: unexpected {other:?}"),
    };
    assert_eq!(runs.load(Ordering::SeqCst), 1, "{id}: body runs");
    outcome
}

/// Each case through one codec, with the outcome expected of that codec.
async fn check_codec(codec: BuiltinCodec, expect: [Outcome; 7]) {
    let idem = Idem::new(MemoryStore::new());
    let got = [
        outcome(&idem, codec, "some-unit", Some(())).await,
        outcome(&idem, codec, "some-none", Some(None::<u8>)).await,
        outcome(&idem, codec, "some-nan", Some(f64::NAN)).await,
        outcome(&idem, codec, "some-inf", Some(f64::INFINITY)).await,
        outcome(&idem, codec, "untagged", Amount::Units(5)).await,
        // Values every codec keeps: refused by none.
        outcome(
            &idem,
            codec,
            "plain",
            (Some(1u8), None::<u8>, "x".to_string()),
        )
        .await,
        outcome(&idem, codec, "first-variant", Amount::Cents(5)).await,
    ];
    assert_eq!(got, expect, "{codec:?}");
}

#[tokio::test]
async fn json_refuses_what_it_cannot_give_back() {
    use Outcome::*;
    check_codec(
        BuiltinCodec::Json,
        [Refused, Refused, Refused, Refused, Refused, Same, Same],
    )
    .await;
}

#[cfg(feature = "postcard")]
#[tokio::test]
async fn postcard_keeps_options_and_floats_and_refuses_untagged_enums() {
    use Outcome::*;
    // postcard tags options and writes floats' bits; it cannot read untagged enums back.
    check_codec(
        BuiltinCodec::Postcard,
        [Same, Same, Same, Same, Refused, Same, Refused],
    )
    .await;
}

#[cfg(feature = "bincode")]
#[tokio::test]
async fn bincode_keeps_options_and_floats_and_refuses_untagged_enums() {
    use Outcome::*;
    check_codec(
        BuiltinCodec::Bincode,
        [Same, Same, Same, Same, Refused, Same, Refused],
    )
    .await;
}

#[tokio::test]
async fn a_cached_error_that_does_not_survive_its_codec_is_refused_too() {
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum Declined {
        Reason(Option<()>),
        Idem(String),
    }
    impl From<Error> for Declined {
        fn from(e: Error) -> Self {
            Declined::Idem(e.to_string())
        }
    }
    let idem = Idem::new(MemoryStore::new());
    let out: Result<u8, Declined> = idem
        .call(
            Key::new("fidelity", "cached-error").unwrap(),
            idem::Fingerprint::NONE,
        )
        .run_caching_errors(|_| true, || async { Err(Declined::Reason(Some(()))) })
        .await;
    match out {
        Err(Declined::Idem(msg)) => assert!(msg.contains("could not be encoded"), "{msg}"),
        other => panic!("expected the Encode error, got {other:?}"),
    }
}

// --- missing keys -------------------------------------------------------------------------

#[derive(Serialize)]
struct Signup {
    request_id: Option<String>,
    email: String,
}

static STRICT_RUNS: AtomicU32 = AtomicU32::new(0);
static LENIENT_RUNS: AtomicU32 = AtomicU32::new(0);

#[idempotent(key = req.request_id, scope = "fidelity::strict_signup")]
async fn strict_signup(req: Signup) -> String {
    STRICT_RUNS.fetch_add(1, Ordering::SeqCst);
    req.email
}

#[idempotent(key = req.request_id, missing_key = "run", scope = "fidelity::lenient_signup")]
async fn lenient_signup(req: Signup) -> String {
    LENIENT_RUNS.fetch_add(1, Ordering::SeqCst);
    req.email
}

fn signup(id: Option<&str>, email: &str) -> Signup {
    Signup {
        request_id: id.map(str::to_string),
        email: email.into(),
    }
}

/// This binary's global engine, for the functions without `store = ...`: set by whichever
/// test comes first.
fn global() -> &'static idem::Idem {
    let _ = idem::set_global(idem::Idem::new(idem::MemoryStore::new()));
    idem::global().expect("just set")
}

#[tokio::test]
async fn a_none_key_is_a_missing_key_not_a_shared_one() {
    global();
    // Two requests without an id: neither runs, neither gets the other's result or a
    // KeyReuse; the error names the scope.
    for email in ["ada@example.com", "bob@example.com"] {
        let err = strict_signup(signup(None, email)).await.unwrap_err();
        match &err {
            Error::MissingKey { scope } => assert_eq!(scope, "fidelity::strict_signup"),
            other => panic!("expected MissingKey, got {other:?}"),
        }
        assert!(err.to_string().contains("fidelity::strict_signup"), "{err}");
        assert!(!err.is_retryable());
    }
    assert_eq!(STRICT_RUNS.load(Ordering::SeqCst), 0);
    // An id that is present is the key, readable as with a plain string.
    for _ in 0..2 {
        let email = strict_signup(signup(Some("r-1"), "ada@example.com"))
            .await
            .unwrap();
        assert_eq!(email, "ada@example.com");
    }
    assert_eq!(STRICT_RUNS.load(Ordering::SeqCst), 1);
    let key = Key::new("fidelity::strict_signup", "r-1").unwrap();
    assert!(global().store().get(&key).await.unwrap().is_some());
}

#[tokio::test]
async fn missing_key_run_runs_every_call_without_idempotency() {
    global();
    let a = lenient_signup(signup(None, "ada@example.com"))
        .await
        .unwrap();
    let b = lenient_signup(signup(None, "bob@example.com"))
        .await
        .unwrap();
    assert_eq!(
        (a.as_str(), b.as_str()),
        ("ada@example.com", "bob@example.com")
    );
    assert_eq!(LENIENT_RUNS.load(Ordering::SeqCst), 2);
    // With an id, it is idempotent as usual.
    for _ in 0..2 {
        lenient_signup(signup(Some("r-9"), "cy@example.com"))
            .await
            .unwrap();
    }
    assert_eq!(LENIENT_RUNS.load(Ordering::SeqCst), 3);
}
