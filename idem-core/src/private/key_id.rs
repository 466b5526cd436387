//! The key of `key = <expr>`, from the value's one `Serialize` bound.
//!
//! A serializer that looks only at the top of the value decides how its id is shown: a
//! string (`serialize_str`) or an integer (`serialize_u64`, `serialize_i32`, ...) is the id
//! itself, readable; `None` (`serialize_none`) is no key at all, so that requests without
//! an id never share one key; `Some(v)` is the id of `v`, one level deep; anything else
//! (a struct, a tuple, a newtype, a `bool`, a `char`, a float, bytes) stops the serializer
//! at once, and the id is the 128-bit digest of the whole value, as [`Key::digest`] makes it.
//!
//! The serializer says it is not human-readable, so a type with a compact form besides its
//! text (a `Uuid`: 16 bytes, or its hyphenated string) shows its compact form here, which is
//! not a string, and keeps the digest it always had.

use std::fmt;

use serde::ser::{self, Impossible, Serialize};

use crate::key::{self, Key};
use crate::Error;

/// A value usable as a key: strings, integers, or any `Serialize` value.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be an idempotency key",
    label = "this key is not a string, an integer or a `Serialize` value",
    note = "a key is a string or an integer (kept readable) or any `serde::Serialize` value (digested): derive `Serialize` for `{Self}`, or key on one of its fields"
)]
pub trait KeyValue: Serialize {}
impl<T: Serialize + ?Sized> KeyValue for T {}

/// The key `key = <expr>` expands to: the readable or digested id of `value` in `scope`,
/// or `Error::MissingKey` for `None`.
pub fn key<T: KeyValue + ?Sized>(scope: &str, value: &T) -> Result<Key, Error> {
    match value.serialize(TopLevel {
        scope,
        in_option: false,
    }) {
        Ok(Seen::Id(key)) => key,
        Ok(Seen::None) => Err(Error::MissingKey {
            scope: key::shown(scope).to_string(),
        }),
        Err(NotReadable) => Key::digest(scope, value),
    }
}

/// What the top of a key value is.
enum Seen {
    /// A string or an integer (inside `Some` or not): its key, or why the id is invalid.
    Id(Result<Key, Error>),
    /// `None`: there is no key.
    None,
}

/// The top of the value is neither a string, an integer nor an `Option`: it is digested.
/// Also what a failing `Serialize` implementation returns; digesting the value then
/// reports that failure as `Error::InvalidKey`.
#[derive(Debug)]
struct NotReadable;

impl fmt::Display for NotReadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a readable key id")
    }
}

impl std::error::Error for NotReadable {}

impl ser::Error for NotReadable {
    fn custom<T: fmt::Display>(_: T) -> Self {
        NotReadable
    }
}

/// Sees the first call a `Serialize` implementation makes, and no other.
struct TopLevel<'a> {
    scope: &'a str,
    /// Inside the `Some` of a key: another `Option` there is digested, not unwrapped.
    in_option: bool,
}

impl TopLevel<'_> {
    fn id(self, id: &str) -> Result<Seen, NotReadable> {
        Ok(Seen::Id(Key::new(self.scope, id)))
    }
}

type Seeing = Result<Seen, NotReadable>;
type Stop = Impossible<Seen, NotReadable>;

/// Each named method stops: its value is digested.
macro_rules! digested {
    ($($method:ident($($ty:ty),*) -> $ret:ty;)*) => {$(
        fn $method(self, $(_: $ty),*) -> Result<$ret, NotReadable> {
            Err(NotReadable)
        }
    )*};
}

/// Each named method shows its integer in decimal, as `to_string` does.
macro_rules! readable {
    ($($method:ident($ty:ty);)*) => {$(
        fn $method(self, v: $ty) -> Seeing {
            self.id(&v.to_string())
        }
    )*};
}

impl<'a> ser::Serializer for TopLevel<'a> {
    type Ok = Seen;
    type Error = NotReadable;
    type SerializeSeq = Stop;
    type SerializeTuple = Stop;
    type SerializeTupleStruct = Stop;
    type SerializeTupleVariant = Stop;
    type SerializeMap = Stop;
    type SerializeStruct = Stop;
    type SerializeStructVariant = Stop;

    fn is_human_readable(&self) -> bool {
        false
    }

    fn serialize_str(self, v: &str) -> Seeing {
        self.id(v)
    }

    readable! {
        serialize_u8(u8); serialize_u16(u16); serialize_u32(u32); serialize_u64(u64);
        serialize_u128(u128); serialize_i8(i8); serialize_i16(i16); serialize_i32(i32);
        serialize_i64(i64); serialize_i128(i128);
    }

    fn serialize_none(self) -> Seeing {
        if self.in_option {
            return Err(NotReadable);
        }
        Ok(Seen::None)
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Seeing {
        if self.in_option {
            return Err(NotReadable);
        }
        let scope = self.scope;
        let inner = TopLevel {
            scope,
            in_option: true,
        };
        match value.serialize(inner) {
            Ok(seen) => Ok(seen),
            Err(NotReadable) => Ok(Seen::Id(Key::digest(scope, value))),
        }
    }

    digested! {
        serialize_bool(bool) -> Seen;
        serialize_f32(f32) -> Seen;
        serialize_f64(f64) -> Seen;
        serialize_char(char) -> Seen;
        serialize_bytes(&[u8]) -> Seen;
        serialize_unit() -> Seen;
        serialize_unit_struct(&'static str) -> Seen;
        serialize_unit_variant(&'static str, u32, &'static str) -> Seen;
        serialize_seq(Option<usize>) -> Stop;
        serialize_tuple(usize) -> Stop;
        serialize_tuple_struct(&'static str, usize) -> Stop;
        serialize_tuple_variant(&'static str, u32, &'static str, usize) -> Stop;
        serialize_map(Option<usize>) -> Stop;
        serialize_struct(&'static str, usize) -> Stop;
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> Stop;
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, _: &T) -> Seeing {
        Err(NotReadable)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Seeing {
        Err(NotReadable)
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::collections::BTreeMap;

    use super::*;

    fn id<T: Serialize + ?Sized>(value: &T) -> Option<String> {
        match key("s", value) {
            Ok(key) => Some(key.id().to_owned()),
            Err(Error::MissingKey { scope }) => {
                assert_eq!(scope, "s");
                None
            }
            Err(e) => panic!("unexpected {e:?}"),
        }
    }

    fn some(s: &str) -> Option<String> {
        Some(s.to_owned())
    }

    fn digest<T: Serialize + ?Sized>(value: &T) -> Option<String> {
        Some(crate::digest_hex(value))
    }

    #[test]
    fn strings_and_integers_stay_readable() {
        assert_eq!(id("order-42"), some("order-42"));
        assert_eq!(id(&String::from("a b")), some("a b"));
        assert_eq!(id(&Cow::<str>::Borrowed("c")), some("c"));
        assert_eq!(id(&Box::<str>::from("d")), some("d"));
        assert_eq!(id(&&&"f"), some("f"));
        assert_eq!(id(&42u64), some("42"));
        assert_eq!(id(&-7i32), some("-7"));
        assert_eq!(id(&7u8), some("7"));
        assert_eq!(id(&u128::MAX), Some(u128::MAX.to_string()));
        assert_eq!(id(&i128::MIN), Some(i128::MIN.to_string()));
        assert_eq!(id(&usize::MAX), Some(usize::MAX.to_string()));
        assert_eq!(id(&isize::MIN), Some(isize::MIN.to_string()));
        // What serializes as a string is one, whatever its type.
        #[derive(serde::Serialize)]
        #[serde(transparent)]
        struct OrderId(String);
        assert_eq!(id(&OrderId("o-9".into())), some("o-9"));
    }

    #[test]
    fn other_values_are_digested_whole() {
        #[derive(serde::Serialize)]
        struct OrderId(String);
        #[derive(serde::Serialize)]
        enum Kind {
            Refund,
        }
        let pair = ("order", 42);
        assert_eq!(id(&pair), digest(&pair));
        assert_eq!(id(&pair).map(|d| d.len()), Some(32));
        assert_eq!(id(&OrderId("o-1".into())), digest(&OrderId("o-1".into())));
        assert_eq!(id(&Kind::Refund), digest(&Kind::Refund));
        assert_eq!(id(&true), digest(&true));
        assert_eq!(id(&'x'), digest(&'x'));
        assert_eq!(id(&1.5f64), digest(&1.5f64));
        assert_eq!(id(&()), digest(&()));
        assert_eq!(id(&vec![1u8, 2]), digest(&vec![1u8, 2]));
        let map: BTreeMap<&str, u32> = [("a", 1)].into();
        assert_eq!(id(&map), digest(&map));
    }

    /// A type with a compact form keeps the digest of its human-readable form, as when
    /// ids were chosen by type: the probe is not human-readable, the digest is.
    #[test]
    fn a_value_with_a_compact_form_is_digested_as_text() {
        struct Uuid;
        impl Serialize for Uuid {
            fn serialize<S: ser::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                if s.is_human_readable() {
                    s.serialize_str("67e55044-10b1-426f-9247-bb680e5fe0c8")
                } else {
                    s.serialize_bytes(&[0x67; 16])
                }
            }
        }
        assert_eq!(id(&Uuid), digest("67e55044-10b1-426f-9247-bb680e5fe0c8"));
    }

    #[test]
    fn an_option_is_its_value_and_none_is_no_key() {
        let present: Option<String> = Some("o-1".into());
        assert_eq!(id(&present), some("o-1"));
        assert_eq!(id(&&present), some("o-1"));
        assert_eq!(id(&present.as_deref()), some("o-1"));
        assert_eq!(id(&Some(7u32)), some("7"));
        assert_eq!(id(&Some(("order", 42))), digest(&("order", 42)));
        assert_eq!(id(&None::<String>), None);
        assert_eq!(id(&&None::<u64>), None);
        assert_eq!(id(&None::<(u8, u8)>), None);
        // One level only: an option inside is a value, digested.
        assert_eq!(id(&Some(Some(3u8))), digest(&Some(3u8)));
        assert_eq!(id(&Some(None::<u8>)), digest(&None::<u8>));
    }

    #[test]
    fn an_invalid_id_or_a_failing_value_is_an_invalid_key() {
        assert!(matches!(
            key("s", ""),
            Err(Error::InvalidKey { id: Some(id), .. }) if id.is_empty()
        ));
        struct Failing;
        impl Serialize for Failing {
            fn serialize<S: ser::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
                Err(ser::Error::custom("no stable form"))
            }
        }
        for err in [key("s", &Failing), key("s", &Some(Failing))] {
            assert!(
                matches!(&err, Err(Error::InvalidKey { id: None, reason, .. }) if reason.contains("no stable form")),
                "{err:?}"
            );
        }
    }

    #[test]
    fn a_missing_key_names_the_scope_escaped() {
        let err = key("billing::charge", &None::<u64>).unwrap_err();
        assert!(matches!(&err, Error::MissingKey { scope } if scope == "billing::charge"));
        assert!(err.to_string().contains("`billing::charge`"), "{err}");
        let err = key("a\nb", &None::<u64>).unwrap_err();
        assert!(matches!(&err, Error::MissingKey { scope } if scope == "a\\nb"));
    }
}
