//! The digests' tests: the golden vectors that hold the format fixed, and the rules of
//! `encoding.rs` one by one.

use super::*;
use std::collections::{BTreeMap, HashMap};

#[derive(serde::Serialize)]
struct Charge<'a> {
    order_id: &'a str,
    amount_cents: u64,
    currency: &'a str,
}

/// Golden vectors: these strings must never change, or every stored key changes with them.
/// They were also reproduced outside Rust, with Python's `blake3` package over the byte
/// encoding `encoding.rs` describes (derive_key context, tag bytes, u64 LE lengths,
/// struct fields in the order of their names).
#[test]
fn golden_vectors() {
    let cases: Vec<(String, &str)> = vec![
        (digest_hex(&()), "5ce2e491ca807753ec528cc5f58ab7a6"),
        (digest_hex("order-42"), "62b44b7924757e941f3f0afdeda9bc0e"),
        (digest_hex(&42u64), "b60f32f0bd1f3ee72395bd403b69f715"),
        (
            digest_hex(&(1i32, "a", true)),
            "d1de5f4a56a2b9720516625ef80c97da",
        ),
        (
            digest_hex(&Charge {
                order_id: "o-1",
                amount_cents: 1250,
                currency: "EUR",
            }),
            "ff1ebdcfeb2e79d1f08f02983b1fdd91",
        ),
        (
            digest_hex(&vec![Some(1u8), None]),
            "918b92b2689ddf9a274e872c4095a518",
        ),
    ];
    for (got, want) in cases {
        assert_eq!(got, want);
    }
}

/// The example of `encoding.rs`'s table, byte for byte.
#[test]
fn the_example_in_the_format_is_its_encoding() {
    let hex: String = canonical(&("a", 1u8))
        .unwrap()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        hex,
        "0d 06 0100000000000000 61 03 01000000000000000000000000000000 10".replace(' ', "")
    );
}

#[derive(serde::Serialize)]
struct ChargeReordered<'a> {
    currency: &'a str,
    order_id: &'a str,
    amount_cents: u64,
}

#[derive(serde::Serialize)]
enum Event<'a> {
    Charge {
        order_id: &'a str,
        amount_cents: u64,
    },
    Refund {
        amount_cents: u64,
        order_id: &'a str,
    },
}

#[test]
fn struct_fields_digest_alike_whatever_their_declared_order() {
    let a = Charge {
        order_id: "o-1",
        amount_cents: 1250,
        currency: "EUR",
    };
    let b = ChargeReordered {
        currency: "EUR",
        order_id: "o-1",
        amount_cents: 1250,
    };
    assert_eq!(digest_hex(&a), digest_hex(&b));
    assert_eq!(fingerprint_bytes(&a), fingerprint_bytes(&b));
    // Values still belong to their names: the same values under swapped names differ.
    let swapped = ChargeReordered {
        currency: "o-1",
        order_id: "EUR",
        amount_cents: 1250,
    };
    assert_ne!(digest_hex(&a), digest_hex(&swapped));
    // Struct variants too, nested inside other values.
    let charge = Event::Charge {
        order_id: "o-1",
        amount_cents: 5,
    };
    let charge_again = vec![Some(Event::Charge {
        amount_cents: 5,
        order_id: "o-1",
    })];
    assert_eq!(digest_hex(&vec![Some(charge)]), digest_hex(&charge_again));
    assert_ne!(
        digest_hex(&Event::Charge {
            order_id: "o-1",
            amount_cents: 5
        }),
        digest_hex(&Event::Refund {
            amount_cents: 5,
            order_id: "o-1"
        })
    );
}

#[test]
fn structs_nested_in_structs_are_ordered_at_every_level() {
    #[derive(serde::Serialize)]
    struct Inner {
        z: u8,
        a: &'static str,
    }
    #[derive(serde::Serialize)]
    struct InnerSorted {
        a: &'static str,
        z: u8,
    }
    #[derive(serde::Serialize)]
    struct Outer {
        y: Inner,
        b: u8,
        m: Vec<Inner>,
    }
    #[derive(serde::Serialize)]
    struct OuterSorted {
        b: u8,
        m: Vec<InnerSorted>,
        y: InnerSorted,
    }
    let outer = Outer {
        y: Inner { z: 1, a: "x" },
        b: 2,
        m: vec![Inner { z: 3, a: "y" }, Inner { z: 4, a: "w" }],
    };
    let sorted = OuterSorted {
        b: 2,
        m: vec![InnerSorted { a: "y", z: 3 }, InnerSorted { a: "w", z: 4 }],
        y: InnerSorted { a: "x", z: 1 },
    };
    assert_eq!(canonical(&outer).unwrap(), canonical(&sorted).unwrap());
    assert!(same_canonical(&outer, &sorted));
    assert!(!same_canonical(&outer, &(2u8,)));
}

/// A struct whose `Serialize` fails half-way, leaving its serializer unended.
struct HalfStruct;
impl Serialize for HalfStruct {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error as _, SerializeStruct as _};
        let mut st = s.serialize_struct("HalfStruct", 2)?;
        st.serialize_field("b", &1u8)?;
        st.serialize_field("a", &2u8)?;
        Err(S::Error::custom("gave up"))
    }
}

/// A map that swallows its entry's error and goes on, inside a struct.
struct Swallowing;
impl Serialize for Swallowing {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = s.serialize_map(Some(1))?;
        let _ = map.serialize_entry("k", &HalfStruct);
        map.end()
    }
}

#[derive(serde::Serialize)]
struct Holder {
    z: u8,
    m: Swallowing,
    a: u8,
}

#[test]
fn a_struct_left_unended_does_not_leak_its_fields_into_the_enclosing_one() {
    let holder = Holder {
        z: 1,
        m: Swallowing,
        a: 2,
    };
    // Without the unended struct's fields taken off the stack, the enclosing struct
    // would order fields that are not its own (and slice out of its range).
    let first = canonical(&holder).unwrap();
    assert_eq!(first, canonical(&holder).unwrap());
    assert_eq!(digest_hex(&holder), digest_hex(&holder));
}

#[test]
fn canonical_encodings_tell_apart_what_json_does_not() {
    assert_ne!(
        canonical(&Some(())).unwrap(),
        canonical(&None::<()>).unwrap()
    );
    assert_ne!(
        canonical(&Some(None::<u8>)).unwrap(),
        canonical(&None::<Option<u8>>).unwrap()
    );
    assert_ne!(
        canonical(&Some(f64::NAN)).unwrap(),
        canonical(&None::<f64>).unwrap()
    );
    assert_eq!(
        canonical(&f64::NAN).unwrap(),
        canonical(&-f64::NAN).unwrap()
    );
}

#[test]
fn integer_width_does_not_matter_but_sign_does() {
    assert_eq!(digest_hex(&7u8), digest_hex(&7u64));
    assert_eq!(digest_hex(&-7i8), digest_hex(&-7i64));
    assert_ne!(digest_hex(&7u8), digest_hex(&7i8));
}

#[test]
fn adjacent_strings_do_not_run_together() {
    assert_ne!(digest_hex(&("ab", "c")), digest_hex(&("a", "bc")));
    assert_ne!(
        digest_hex(&(vec![1u8], vec![2u8])),
        digest_hex(&(vec![1u8, 2], Vec::<u8>::new()))
    );
}

#[test]
fn maps_digest_alike_whatever_their_order() {
    let mut h = HashMap::new();
    let mut b = BTreeMap::new();
    for i in 0..100u32 {
        h.insert(format!("k{i}"), i);
        b.insert(format!("k{i}"), i);
    }
    assert_eq!(digest_hex(&h), digest_hex(&b));
    b.insert("k0".into(), 1);
    assert_ne!(digest_hex(&h), digest_hex(&b));
}

/// Serializes like a path that is not UTF-8: always an error.
struct Unencodable(u8);
impl serde::Serialize for Unencodable {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom(format!(
            "path {} contains invalid UTF-8 characters",
            self.0
        )))
    }
}

#[test]
fn values_that_fail_to_serialize_never_share_a_digest() {
    assert!(try_digest_hex(&Unencodable(1))
        .unwrap_err()
        .contains("invalid UTF-8"));
    assert_ne!(digest_hex(&Unencodable(1)), digest_hex(&Unencodable(2)));
    assert_ne!(digest_hex(&Unencodable(1)), digest_hex(&Unencodable(1)));
    assert_ne!(
        fingerprint_bytes(&Unencodable(1)),
        fingerprint_bytes(&Unencodable(1))
    );
    let err = crate::Key::digest("s", &Unencodable(1))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("could not be serialized") && err.contains("invalid UTF-8"),
        "{err}"
    );
}

#[test]
fn key_and_fingerprint_digests_differ() {
    let k = digest_hex("x");
    let fp = fingerprint_bytes("x");
    let fp_hex: String = fp.iter().map(|b| format!("{b:02x}")).collect();
    assert_ne!(k, fp_hex);
}

proptest::proptest! {
    #[test]
    fn distinct_string_pairs_have_distinct_digests(a in ".{0,12}", b in ".{0,12}", c in ".{0,12}", d in ".{0,12}") {
        proptest::prop_assume!((a.clone(), b.clone()) != (c.clone(), d.clone()));
        proptest::prop_assert_ne!(digest_hex(&(&a, &b)), digest_hex(&(&c, &d)));
    }
}
