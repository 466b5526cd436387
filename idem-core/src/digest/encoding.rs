//! The canonical encoding: the bytes a key id or a fingerprint is the digest of. This file
//! is the format. Each rule below makes one of the digest rules of `idem::guide::keys` exact
//! ("integers by value whatever their width, strings with their length, enum variants by
//! name, map entries in any order and struct fields in the order of their names"); the
//! golden vectors (`digest/tests.rs`, `tests/golden/keys.txt`) hold it fixed, and Python's
//! `blake3` over these bytes reproduces them. Changing a byte here changes every stored key.
//!
//! A value is written as serde's data model sees it. Every item starts with a tag byte;
//! `len` is a count as a `u64`, and every number is little endian:
//!
//! ```text
//! bool                  01, 00 or 01
//! i8 ... i128           02, the value as an i128 (16 bytes)        width does not count,
//! u8 ... u128           03, the value as a u128 (16 bytes)         sign does
//! f32, f64              04, the bits of the value as an f64 (8 bytes); every NaN is written
//!                       as f64::NAN and -0.0 as 0.0
//! char                  05, the code point as a u32 (4 bytes)
//! str                   06, len (bytes), the UTF-8 bytes
//! bytes                 07, len, the bytes
//! None                  08
//! Some(v)               09, v
//! (), unit struct       0a
//! newtype struct        its value alone
//! seq                   0c, each item, 10
//! tuple, tuple struct   0d, each item, 10
//! map                   0e, len (entries), the entries' hashes in ascending byte order, 10;
//!                       an entry's hash is blake3 (unkeyed, 32 bytes) of its key's
//!                       encoding followed by its value's
//! struct                0f, its fields in the order of their names (by bytes; a name
//!                       repeated keeps its place among its equals), 10; a field is its name
//!                       as a str, then its value
//! enum variant          0b, the variant's name as a str, then as the variant's shape:
//!                       unit 0a; newtype its value; tuple as a tuple; struct as a struct
//! ```
//!
//! So `("a", 1u8)` is `0d 06 0100000000000000 61 03 01000000000000000000000000000000 10`.
//! No type name, struct name or variant index is written: renaming a type, reordering its
//! fields or its variants keeps its digests. A `Serialize` impl that fails has no encoding.
//!
//! A digest is blake3 in key derivation mode over the encoding, with [`KEY_CONTEXT`] for a
//! key id and [`FINGERPRINT_CONTEXT`] for a fingerprint, cut to its first 16 bytes (a key
//! id prints them as 32 lowercase hex digits).
//!
//! How the bytes are produced without allocating (buffers kept per thread, fields moved
//! into name order in place) is `scratch.rs`'s business, not the format's.

use serde::ser::{self, Serialize};

use super::name_order::Spare;

/// The derive_key context of a key id: a key id and a fingerprint of the same value differ,
/// so one can never be mistaken for the other.
pub(super) const KEY_CONTEXT: &str = "idem 2026-11-29 key id v1";
/// The derive_key context of a fingerprint.
pub(super) const FINGERPRINT_CONTEXT: &str = "idem 2026-11-29 fingerprint v1";

/// The tag bytes, one per kind of item.
mod tag {
    pub const BOOL: u8 = 0x01;
    pub const INT: u8 = 0x02;
    pub const UINT: u8 = 0x03;
    pub const FLOAT: u8 = 0x04;
    pub const CHAR: u8 = 0x05;
    pub const STR: u8 = 0x06;
    pub const BYTES: u8 = 0x07;
    pub const NONE: u8 = 0x08;
    pub const SOME: u8 = 0x09;
    pub const UNIT: u8 = 0x0a;
    pub const VARIANT: u8 = 0x0b;
    pub const SEQ: u8 = 0x0c;
    pub const TUPLE: u8 = 0x0d;
    pub const MAP: u8 = 0x0e;
    pub const STRUCT: u8 = 0x0f;
    pub const END: u8 = 0x10;
}

/// Appends the canonical encoding of `value` to `out`; `spare` is room for putting struct
/// fields in order. The error is the message of the `Serialize` impl that failed.
pub(super) fn encode<T: Serialize + ?Sized>(
    value: &T,
    out: &mut Vec<u8>,
    spare: &mut Spare,
) -> Result<(), String> {
    value
        .serialize(Encoder { out, spare })
        .map_err(|EncodeError(msg)| msg)
}

#[derive(Debug)]
struct EncodeError(String);

impl std::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for EncodeError {}
impl ser::Error for EncodeError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        EncodeError(msg.to_string())
    }
}

type R = Result<(), EncodeError>;

/// Writes one item. A few pointers wide, since serde moves it by value at every level.
struct Encoder<'a> {
    out: &'a mut Vec<u8>,
    spare: &'a mut Spare,
}

impl<'a> Encoder<'a> {
    fn tag(&mut self, t: u8) {
        self.out.push(t);
    }
    fn len(&mut self, n: usize) {
        self.out.extend_from_slice(&(n as u64).to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.out.extend_from_slice(b);
    }
    fn str(&mut self, s: &str) {
        self.tag(tag::STR);
        self.len(s.len());
        self.bytes(s.as_bytes());
    }
    /// A variant: its name, then `shape` (the tag of its content).
    fn variant(&mut self, name: &str, shape: u8) {
        self.tag(tag::VARIANT);
        self.str(name);
        self.tag(shape);
    }
    fn seq(self) -> Seq<'a> {
        Seq {
            out: self.out,
            spare: self.spare,
        }
    }
}

impl<'a> ser::Serializer for Encoder<'a> {
    type Ok = ();
    type Error = EncodeError;
    type SerializeSeq = Seq<'a>;
    type SerializeTuple = Seq<'a>;
    type SerializeTupleStruct = Seq<'a>;
    type SerializeTupleVariant = Seq<'a>;
    type SerializeMap = Map<'a>;
    type SerializeStruct = Fields<'a>;
    type SerializeStructVariant = Fields<'a>;

    fn serialize_bool(mut self, v: bool) -> R {
        self.tag(tag::BOOL);
        self.bytes(&[v as u8]);
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> R {
        self.serialize_i128(v.into())
    }
    fn serialize_i16(self, v: i16) -> R {
        self.serialize_i128(v.into())
    }
    fn serialize_i32(self, v: i32) -> R {
        self.serialize_i128(v.into())
    }
    fn serialize_i64(self, v: i64) -> R {
        self.serialize_i128(v.into())
    }
    fn serialize_i128(mut self, v: i128) -> R {
        self.tag(tag::INT);
        self.bytes(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> R {
        self.serialize_u128(v.into())
    }
    fn serialize_u16(self, v: u16) -> R {
        self.serialize_u128(v.into())
    }
    fn serialize_u32(self, v: u32) -> R {
        self.serialize_u128(v.into())
    }
    fn serialize_u64(self, v: u64) -> R {
        self.serialize_u128(v.into())
    }
    fn serialize_u128(mut self, v: u128) -> R {
        self.tag(tag::UINT);
        self.bytes(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> R {
        self.serialize_f64(v.into())
    }
    fn serialize_f64(mut self, v: f64) -> R {
        self.tag(tag::FLOAT);
        // One NaN and one zero, so that equal-looking requests digest alike.
        let v = if v.is_nan() {
            f64::NAN
        } else if v == 0.0 {
            0.0
        } else {
            v
        };
        self.bytes(&v.to_bits().to_le_bytes());
        Ok(())
    }
    fn serialize_char(mut self, v: char) -> R {
        self.tag(tag::CHAR);
        self.bytes(&(v as u32).to_le_bytes());
        Ok(())
    }
    fn serialize_str(mut self, v: &str) -> R {
        self.str(v);
        Ok(())
    }
    fn serialize_bytes(mut self, v: &[u8]) -> R {
        self.tag(tag::BYTES);
        self.len(v.len());
        self.bytes(v);
        Ok(())
    }
    fn serialize_none(mut self) -> R {
        self.tag(tag::NONE);
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(mut self, value: &T) -> R {
        self.tag(tag::SOME);
        value.serialize(self)
    }
    fn serialize_unit(mut self) -> R {
        self.tag(tag::UNIT);
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> R {
        self.serialize_unit()
    }
    fn serialize_unit_variant(mut self, _name: &'static str, _i: u32, variant: &'static str) -> R {
        self.variant(variant, tag::UNIT);
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _name: &'static str, value: &T) -> R {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        mut self,
        _name: &'static str,
        _i: u32,
        variant: &'static str,
        value: &T,
    ) -> R {
        self.tag(tag::VARIANT);
        self.str(variant);
        value.serialize(self)
    }
    fn serialize_seq(mut self, _len: Option<usize>) -> Result<Seq<'a>, EncodeError> {
        self.tag(tag::SEQ);
        Ok(self.seq())
    }
    fn serialize_tuple(mut self, _len: usize) -> Result<Seq<'a>, EncodeError> {
        self.tag(tag::TUPLE);
        Ok(self.seq())
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> Result<Seq<'a>, EncodeError> {
        self.serialize_tuple(len)
    }
    fn serialize_tuple_variant(
        mut self,
        _name: &'static str,
        _i: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Seq<'a>, EncodeError> {
        self.variant(variant, tag::TUPLE);
        Ok(self.seq())
    }
    fn serialize_map(self, len: Option<usize>) -> Result<Map<'a>, EncodeError> {
        Ok(Map {
            out: self.out,
            spare: self.spare,
            entries: Vec::with_capacity(len.unwrap_or(0)),
            pending: None,
        })
    }
    fn serialize_struct(
        mut self,
        _name: &'static str,
        len: usize,
    ) -> Result<Fields<'a>, EncodeError> {
        self.tag(tag::STRUCT);
        Ok(Fields::new(self.out, self.spare, len))
    }
    fn serialize_struct_variant(
        mut self,
        _name: &'static str,
        _i: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Fields<'a>, EncodeError> {
        self.variant(variant, tag::STRUCT);
        Ok(Fields::new(self.out, self.spare, len))
    }
}

/// Sequences and tuples: the items in order, closed by an end tag.
struct Seq<'a> {
    out: &'a mut Vec<u8>,
    spare: &'a mut Spare,
}

impl Seq<'_> {
    fn item<T: Serialize + ?Sized>(&mut self, v: &T) -> R {
        v.serialize(Encoder {
            out: self.out,
            spare: self.spare,
        })
    }
    fn end(self) -> R {
        self.out.push(tag::END);
        Ok(())
    }
}

/// serde's four sequence-like traits, all written as [`Seq`].
macro_rules! seq_like {
    ($($trait:ident :: $item:ident),*) => {$(
        impl ser::$trait for Seq<'_> {
            type Ok = ();
            type Error = EncodeError;
            fn $item<T: Serialize + ?Sized>(&mut self, v: &T) -> R {
                self.item(v)
            }
            fn end(self) -> R {
                Seq::end(self)
            }
        }
    )*};
}
seq_like!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

/// Struct fields: each written as its name and its value, then put in the order of their
/// names, so that the order a type declares its fields in is not part of its digest.
struct Fields<'a> {
    out: &'a mut Vec<u8>,
    spare: &'a mut Spare,
    /// This struct's place among the structs being written (see [`Spare::open`]).
    first: usize,
}

impl<'a> Fields<'a> {
    fn new(out: &'a mut Vec<u8>, spare: &'a mut Spare, len: usize) -> Self {
        let first = spare.open(len);
        Fields { out, spare, first }
    }
    fn field<T: Serialize + ?Sized>(&mut self, name: &'static str, v: &T) -> R {
        self.spare.field_starts(name, self.out.len());
        let mut e = Encoder {
            out: self.out,
            spare: self.spare,
        };
        e.str(name);
        v.serialize(e)
    }
    fn end(self) -> R {
        self.spare.put_in_name_order(self.out, self.first);
        self.out.push(tag::END);
        Ok(())
    }
}

/// Closes the struct also when it is not ended (a `Serialize` impl that failed half-way),
/// so that its fields never mix with an enclosing struct's.
impl Drop for Fields<'_> {
    fn drop(&mut self) {
        self.spare.close(self.first);
    }
}

/// serde's two struct traits, both written as [`Fields`].
macro_rules! struct_like {
    ($($trait:ident),*) => {$(
        impl ser::$trait for Fields<'_> {
            type Ok = ();
            type Error = EncodeError;
            fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, v: &T) -> R {
                self.field(key, v)
            }
            fn end(self) -> R {
                Fields::end(self)
            }
        }
    )*};
}
struct_like!(SerializeStruct, SerializeStructVariant);

/// Maps: each entry is encoded on its own and hashed, and the hashes are written in sorted
/// order, so that a map's digest does not depend on its iteration order.
struct Map<'a> {
    out: &'a mut Vec<u8>,
    spare: &'a mut Spare,
    entries: Vec<[u8; 32]>,
    /// The entry whose key is written and whose value is not yet.
    pending: Option<Vec<u8>>,
}

impl ser::SerializeMap for Map<'_> {
    type Ok = ();
    type Error = EncodeError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> R {
        let mut entry = Vec::new();
        key.serialize(Encoder {
            out: &mut entry,
            spare: self.spare,
        })?;
        self.pending = Some(entry);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> R {
        let mut entry = self
            .pending
            .take()
            .ok_or_else(|| EncodeError("map value without a key".into()))?;
        value.serialize(Encoder {
            out: &mut entry,
            spare: self.spare,
        })?;
        self.entries.push(*blake3::hash(&entry).as_bytes());
        Ok(())
    }
    fn end(mut self) -> R {
        self.entries.sort_unstable();
        self.out.push(tag::MAP);
        self.out
            .extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for e in &self.entries {
            self.out.extend_from_slice(e);
        }
        self.out.push(tag::END);
        Ok(())
    }
}
