//! Stable digests of `Serialize` values: key ids and fingerprints.
//!
//! The value is fed to blake3 through a serde `Serializer` that writes a fixed, tagged
//! encoding: every item starts with a tag byte, strings and bytes carry their length,
//! sequences and structs are closed by an end tag, and enum variants are named, not
//! numbered. The encoding does not depend on the platform, the process or the release,
//! so a key computed on one machine today is the key computed on another tomorrow
//! (golden vectors in the tests guard this). Map entries are hashed one by one and
//! combined in sorted order, so a `HashMap` digests the same whatever its iteration order;
//! a struct's fields are encoded in the order of their names, so reordering the fields of a
//! type keeps its digests. Type names are not part of the encoding: renaming a struct keeps
//! its digests too.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::thread::LocalKey;

use serde::ser::{self, Serialize};
use smallvec::SmallVec;

/// Context strings for blake3's key derivation: a key digest and a fingerprint of the same
/// value differ, so one can never be mistaken for the other.
const KEY_CONTEXT: &str = "idem 2026-11-29 key id v1";
const FINGERPRINT_CONTEXT: &str = "idem 2026-11-29 fingerprint v1";

/// The 128-bit digest of `value`, as 32 lowercase hex characters: the key id of a
/// value that is not a string or an integer.
///
/// A value whose `Serialize` implementation fails (a `PathBuf` that is not UTF-8, say) has
/// no stable digest. Then this returns a digest unique to the call, so that two such values
/// never share a key; [`Key::digest`](crate::Key::digest) refuses them with
/// `Error::InvalidKey` instead.
///
/// ```
/// let a = idem::digest_hex(&("order", 42));
/// assert_eq!(a.len(), 32);
/// assert_eq!(a, idem::digest_hex(&("order", 42)));
/// assert_ne!(a, idem::digest_hex(&("order", 43)));
/// ```
pub fn digest_hex<T: Serialize + ?Sized>(value: &T) -> String {
    hex(&try_digest(&KEY, value).unwrap_or_else(|msg| unique_digest(&msg)))
}

/// The digest of `value`, or the error its `Serialize` implementation returned.
pub(crate) fn try_digest_hex<T: Serialize + ?Sized>(value: &T) -> Result<String, String> {
    try_digest(&KEY, value).map(|d| hex(&d))
}

/// The 128-bit fingerprint digest of `value`; unique to the call when `Serialize` fails, so
/// that such a request is refused as another payload rather than answered with one.
pub(crate) fn fingerprint_bytes<T: Serialize + ?Sized>(value: &T) -> [u8; 16] {
    first_half(try_digest(&FINGERPRINT, value).unwrap_or_else(|msg| unique_digest(&msg)))
}

/// The canonical encoding of `value`, owned; `None` when it cannot be encoded or is longer
/// than `max` bytes.
pub(crate) fn encoding<T: Serialize + ?Sized>(value: &T, max: usize) -> Option<Box<[u8]>> {
    with_canonical(value, |bytes| {
        (bytes.len() <= max).then(|| Box::<[u8]>::from(bytes))
    })
    .ok()
    .flatten()
}

/// [`fingerprint_bytes`] of a value whose canonical encoding is `encoding`.
pub(crate) fn fingerprint_of_encoding(encoding: &[u8]) -> [u8; 16] {
    first_half(FINGERPRINT.hash(encoding))
}

/// A fingerprint is the first 128 bits of its digest.
fn first_half(full: [u8; 32]) -> [u8; 16] {
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// A blake3 hasher keyed by a context string: derived once per process (deriving the key
/// costs more than hashing a request), then copied once per thread into `local` and reset
/// before each digest (a reset writes a few hundred bytes; a fresh copy of the hasher,
/// about two thousand).
struct Keyed {
    context: &'static str,
    base: OnceLock<blake3::Hasher>,
    local: &'static LocalKey<RefCell<Option<blake3::Hasher>>>,
}

thread_local! {
    static KEY_HASHER: RefCell<Option<blake3::Hasher>> = const { RefCell::new(None) };
    static FINGERPRINT_HASHER: RefCell<Option<blake3::Hasher>> = const { RefCell::new(None) };
}

static KEY: Keyed = Keyed::new(KEY_CONTEXT, &KEY_HASHER);
static FINGERPRINT: Keyed = Keyed::new(FINGERPRINT_CONTEXT, &FINGERPRINT_HASHER);

impl Keyed {
    const fn new(
        context: &'static str,
        local: &'static LocalKey<RefCell<Option<blake3::Hasher>>>,
    ) -> Self {
        Keyed {
            context,
            base: OnceLock::new(),
            local,
        }
    }

    fn base(&self) -> &blake3::Hasher {
        self.base
            .get_or_init(|| blake3::Hasher::new_derive_key(self.context))
    }

    /// The blake3 hash of `bytes` under this context.
    fn hash(&self, bytes: &[u8]) -> [u8; 32] {
        let kept = self.local.try_with(|cell| {
            let mut hasher = cell.try_borrow_mut().ok()?;
            let hasher = hasher.get_or_insert_with(|| self.base().clone());
            hasher.reset();
            hasher.update(bytes);
            Some(*hasher.finalize().as_bytes())
        });
        kept.ok().flatten().unwrap_or_else(|| {
            let mut hasher = self.base().clone();
            hasher.update(bytes);
            *hasher.finalize().as_bytes()
        })
    }
}

fn hex(bytes: &[u8; 32]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(32);
    for b in &bytes[..16] {
        out.push(HEX[(b >> 4) as usize] as char);
        out.push(HEX[(b & 0xf) as usize] as char);
    }
    out
}

/// Encodes `value` into this thread's scratch buffer, then hashes it in one update under
/// the context of `keyed`.
fn try_digest<T: Serialize + ?Sized>(keyed: &Keyed, value: &T) -> Result<[u8; 32], String> {
    with_canonical(value, |buf| keyed.hash(buf))
}

/// The fixed encoding of `value` that digests hash, unhashed: two values with the same
/// encoding are the same value as far as serde can tell (the same variants, the same
/// `Some`/`None`, the same numbers bit for bit, maps and struct fields in any order). The
/// tests read it; the engine compares encodings in place (`same_canonical`).
#[cfg(test)]
pub(crate) fn canonical<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, String> {
    with_canonical(value, <[u8]>::to_vec)
}

/// Whether `a` and `b` have the same canonical encoding (the fixed encoding digests hash,
/// unhashed: the same variants, the same `Some`/`None`, the same numbers bit for bit, maps
/// and struct fields in any order); `false` when either cannot be encoded. Each is written
/// into a buffer this thread keeps, so a comparison allocates nothing once they have grown.
pub(crate) fn same_canonical<A: Serialize + ?Sized, B: Serialize + ?Sized>(a: &A, b: &B) -> bool {
    let same = in_scratch(&SCRATCH, a, |a| {
        in_scratch(&OTHER_SCRATCH, b, |b| a == b).unwrap_or(false)
    });
    same.unwrap_or(false)
}

/// Runs `f` on the canonical encoding of `value`, written into a buffer this thread keeps
/// and reuses (a digest then allocates nothing for a value that fits the buffer already
/// grown). A `Serialize` impl that digests another value while it is being digested gets a
/// buffer of its own.
fn with_canonical<T: Serialize + ?Sized, O, F: FnOnce(&[u8]) -> O>(
    value: &T,
    f: F,
) -> Result<O, String> {
    in_scratch(&SCRATCH, value, f)
}

thread_local! {
    /// The buffers digests are written into.
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch { out: Vec::new(), moved: Spare::new() })
    };
    /// The second value's buffers of a comparison.
    static OTHER_SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch { out: Vec::new(), moved: Spare::new() })
    };
}

/// [`with_canonical`] in the given buffers of this thread (fresh ones if they are in use).
fn in_scratch<T: Serialize + ?Sized, O, F: FnOnce(&[u8]) -> O>(
    scratch: &'static LocalKey<RefCell<Scratch>>,
    value: &T,
    f: F,
) -> Result<O, String> {
    /// Buffers that grew past this are not kept, so one huge value does not pin its memory.
    const KEEP: usize = 64 * 1024;
    let encode = |scratch: &mut Scratch, f: &mut Option<F>| {
        scratch.out.clear();
        scratch.moved.fields.clear();
        scratch.moved.bytes.clear();
        let res = value
            .serialize(Digester {
                out: &mut scratch.out,
                moved: &mut scratch.moved,
            })
            .map_err(|DigestError(msg)| msg)
            .map(|()| (f.take().expect("called once"))(&scratch.out));
        let moved = &scratch.moved;
        let fields = moved.fields.capacity() * std::mem::size_of::<(&str, usize)>();
        if scratch.out.capacity() > KEEP || moved.bytes.capacity() > KEEP || fields > KEEP {
            *scratch = Scratch::default();
        }
        res
    };
    let mut f = Some(f);
    let shared = scratch.try_with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => Some(encode(&mut scratch, &mut f)),
        Err(_) => None,
    });
    match shared {
        Ok(Some(res)) => res,
        _ => encode(&mut Scratch::default(), &mut f),
    }
}

/// The encoding being written, and room to move struct fields into name order.
#[derive(Default)]
struct Scratch {
    out: Vec<u8>,
    moved: Spare,
}

/// What ordering struct fields needs, kept with the scratch buffer so that it allocates
/// nothing once grown, and so that the serializer's types stay a few pointers wide (they
/// are moved by value at every level of a value).
#[derive(Default)]
struct Spare {
    /// Where a struct's fields are moved while they are put in name order.
    bytes: Vec<u8>,
    /// The fields of the structs being written, innermost last: each one's name and where
    /// its encoding starts in the output.
    fields: Vec<(&'static str, usize)>,
}

impl Spare {
    const fn new() -> Self {
        Spare {
            bytes: Vec::new(),
            fields: Vec::new(),
        }
    }
}

/// A digest no other call gets: for values that cannot be encoded.
fn unique_digest(msg: &str) -> [u8; 32] {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut h = blake3::Hasher::new_derive_key("idem 2026-11-29 value without a digest");
    h.update(msg.as_bytes());
    h.update(&nanos.to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    h.update(&CALLS.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    *h.finalize().as_bytes()
}

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

#[derive(Debug)]
struct DigestError(String);

impl std::fmt::Display for DigestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for DigestError {}
impl ser::Error for DigestError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        DigestError(msg.to_string())
    }
}

struct Digester<'a> {
    out: &'a mut Vec<u8>,
    /// Where a struct's fields are moved while they are put in name order.
    moved: &'a mut Spare,
}

impl Digester<'_> {
    fn tag(&mut self, t: u8) {
        self.out.push(t);
    }
    fn len(&mut self, n: usize) {
        self.out.extend_from_slice(&(n as u64).to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        self.tag(tag::STR);
        self.len(s.len());
        self.out.extend_from_slice(s.as_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.out.extend_from_slice(b);
    }
}

type R = Result<(), DigestError>;

impl<'a> ser::Serializer for Digester<'a> {
    type Ok = ();
    type Error = DigestError;
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
        self.tag(tag::VARIANT);
        self.str(variant);
        self.tag(tag::UNIT);
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
    fn serialize_seq(mut self, _len: Option<usize>) -> Result<Seq<'a>, DigestError> {
        self.tag(tag::SEQ);
        Ok(Seq {
            out: self.out,
            moved: self.moved,
        })
    }
    fn serialize_tuple(mut self, _len: usize) -> Result<Seq<'a>, DigestError> {
        self.tag(tag::TUPLE);
        Ok(Seq {
            out: self.out,
            moved: self.moved,
        })
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> Result<Seq<'a>, DigestError> {
        self.serialize_tuple(len)
    }
    fn serialize_tuple_variant(
        mut self,
        _name: &'static str,
        _i: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Seq<'a>, DigestError> {
        self.tag(tag::VARIANT);
        self.str(variant);
        self.tag(tag::TUPLE);
        Ok(Seq {
            out: self.out,
            moved: self.moved,
        })
    }
    fn serialize_map(self, len: Option<usize>) -> Result<Map<'a>, DigestError> {
        Ok(Map {
            out: self.out,
            moved: self.moved,
            entries: Vec::with_capacity(len.unwrap_or(0)),
            pending: None,
        })
    }
    fn serialize_struct(
        mut self,
        _name: &'static str,
        len: usize,
    ) -> Result<Fields<'a>, DigestError> {
        self.tag(tag::STRUCT);
        Ok(Fields::new(self.out, self.moved, len))
    }
    fn serialize_struct_variant(
        mut self,
        _name: &'static str,
        _i: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Fields<'a>, DigestError> {
        self.tag(tag::VARIANT);
        self.str(variant);
        self.tag(tag::STRUCT);
        Ok(Fields::new(self.out, self.moved, len))
    }
}

/// Sequences, tuples and structs: items in order, closed by an end tag.
struct Seq<'a> {
    out: &'a mut Vec<u8>,
    moved: &'a mut Spare,
}

impl Seq<'_> {
    fn item<T: Serialize + ?Sized>(&mut self, v: &T) -> R {
        v.serialize(Digester {
            out: self.out,
            moved: self.moved,
        })
    }
    fn end(self) -> R {
        self.out.push(tag::END);
        Ok(())
    }
}

impl ser::SerializeSeq for Seq<'_> {
    type Ok = ();
    type Error = DigestError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> R {
        self.item(v)
    }
    fn end(self) -> R {
        Seq::end(self)
    }
}
impl ser::SerializeTuple for Seq<'_> {
    type Ok = ();
    type Error = DigestError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, v: &T) -> R {
        self.item(v)
    }
    fn end(self) -> R {
        Seq::end(self)
    }
}
impl ser::SerializeTupleStruct for Seq<'_> {
    type Ok = ();
    type Error = DigestError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, v: &T) -> R {
        self.item(v)
    }
    fn end(self) -> R {
        Seq::end(self)
    }
}
impl ser::SerializeTupleVariant for Seq<'_> {
    type Ok = ();
    type Error = DigestError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, v: &T) -> R {
        self.item(v)
    }
    fn end(self) -> R {
        Seq::end(self)
    }
}
/// Struct fields: each written as its name and value, then put in the order of their names,
/// so that the order a type declares its fields in is not part of its digest.
struct Fields<'a> {
    out: &'a mut Vec<u8>,
    moved: &'a mut Spare,
    /// Where this struct's fields start in `moved.fields` (an enclosing struct's are below).
    first: usize,
}

impl<'a> Fields<'a> {
    fn new(out: &'a mut Vec<u8>, moved: &'a mut Spare, len: usize) -> Self {
        let first = moved.fields.len();
        // A hand-written `Serialize` may announce any length: reserve for a usual struct.
        moved.fields.reserve(len.min(64));
        Fields { out, moved, first }
    }
    fn field<T: Serialize + ?Sized>(&mut self, name: &'static str, v: &T) -> R {
        self.moved.fields.push((name, self.out.len()));
        let mut d = Digester {
            out: self.out,
            moved: self.moved,
        };
        d.str(name);
        v.serialize(d)
    }
    fn end(self) -> R {
        let (out, moved) = (&mut *self.out, &mut *self.moved);
        let starts = &moved.fields[self.first..];
        if !starts.windows(2).all(|w| w[0].0 <= w[1].0) {
            // Move the fields out, then back in name order. Stable: should a hand-written
            // `Serialize` repeat a name, its order stays.
            let body = starts[0].1;
            let mut order: SmallVec<[usize; 16]> = (0..starts.len()).collect();
            order.sort_by(|&a, &b| starts[a].0.cmp(starts[b].0));
            // `moved` may hold an enclosing struct's fields, being moved: append after them.
            let base = moved.bytes.len();
            moved.bytes.extend_from_slice(&out[body..]);
            let end = out.len();
            out.truncate(body);
            for i in order {
                let from = starts[i].1 - body + base;
                let to = starts.get(i + 1).map_or(end, |next| next.1) - body + base;
                out.extend_from_slice(&moved.bytes[from..to]);
            }
            moved.bytes.truncate(base);
        }
        out.push(tag::END);
        Ok(())
    }
}

/// Takes the struct's fields off the stack, also when it is not ended (a `Serialize` impl
/// that failed half-way), so that they never mix with an enclosing struct's.
impl Drop for Fields<'_> {
    fn drop(&mut self) {
        self.moved.fields.truncate(self.first);
    }
}

impl ser::SerializeStruct for Fields<'_> {
    type Ok = ();
    type Error = DigestError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, v: &T) -> R {
        self.field(key, v)
    }
    fn end(self) -> R {
        Fields::end(self)
    }
}
impl ser::SerializeStructVariant for Fields<'_> {
    type Ok = ();
    type Error = DigestError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, v: &T) -> R {
        self.field(key, v)
    }
    fn end(self) -> R {
        Fields::end(self)
    }
}

/// Maps: each entry is digested on its own, and the entry digests are fed in sorted order.
struct Map<'a> {
    out: &'a mut Vec<u8>,
    moved: &'a mut Spare,
    entries: Vec<[u8; 32]>,
    pending: Option<Vec<u8>>,
}

impl ser::SerializeMap for Map<'_> {
    type Ok = ();
    type Error = DigestError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> R {
        let mut entry = Vec::new();
        key.serialize(Digester {
            out: &mut entry,
            moved: self.moved,
        })?;
        self.pending = Some(entry);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> R {
        let mut entry = self
            .pending
            .take()
            .ok_or_else(|| DigestError("map value without a key".into()))?;
        value.serialize(Digester {
            out: &mut entry,
            moved: self.moved,
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

#[cfg(test)]
mod tests {
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
    /// encoding the module docs describe (derive_key context, tag bytes, u64 LE lengths,
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
}
