//! Stable digests of `Serialize` values: key ids and fingerprints.
//!
//! A digest is blake3 over the value's canonical encoding, a fixed tagged encoding that
//! does not depend on the platform, the process or the release, so that a key computed on
//! one machine today is the key computed on another tomorrow. The format is `encoding.rs`,
//! one file to check against the rules of `idem::guide::keys`; `scratch.rs` keeps the
//! buffers and hashers a thread reuses so that a digest allocates nothing; `tests.rs` holds
//! the golden vectors that guard both.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::ser::Serialize;

mod encoding;
mod name_order;
mod scratch;
#[cfg(test)]
mod tests;

use scratch::{in_scratch, Keyed, FINGERPRINT, KEY, OTHER_SCRATCH, SCRATCH};

/// The 128-bit digest of `value`, as 32 lowercase hex characters: the key id of a
/// value that is not a string or an integer.
///
/// A value whose `Serialize` implementation fails (a `PathBuf` that is not UTF-8, say) has
/// no stable digest. Then this returns a digest unique to the call, so that two such values
/// never share a key; [`Key::digest`](crate::Key::digest) refuses them with
/// `Error::InvalidKey` instead.
///
/// ```
/// let a = idem_core::digest_hex(&("order", 42));
/// assert_eq!(a.len(), 32);
/// assert_eq!(a, idem_core::digest_hex(&("order", 42)));
/// assert_ne!(a, idem_core::digest_hex(&("order", 43)));
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

/// Encodes `value` into this thread's scratch buffer, then hashes it in one update under
/// the context of `keyed`.
fn try_digest<T: Serialize + ?Sized>(keyed: &Keyed, value: &T) -> Result<[u8; 32], String> {
    with_canonical(value, |buf| keyed.hash(buf))
}

/// Runs `f` on the canonical encoding of `value`, written into a buffer this thread keeps.
fn with_canonical<T: Serialize + ?Sized, O, F: FnOnce(&[u8]) -> O>(
    value: &T,
    f: F,
) -> Result<O, String> {
    in_scratch(&SCRATCH, value, f)
}

/// A fingerprint is the first 128 bits of its digest.
fn first_half(full: [u8; 32]) -> [u8; 16] {
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// A key id is the first 128 bits of its digest, in lowercase hex.
fn hex(bytes: &[u8; 32]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(32);
    for b in &bytes[..16] {
        out.push(HEX[(b >> 4) as usize] as char);
        out.push(HEX[(b & 0xf) as usize] as char);
    }
    out
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
