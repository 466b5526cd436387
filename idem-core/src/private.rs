//! Items that `#[idempotent]` expands to. Not a public API: names and signatures change
//! without notice.

use serde::Serialize;

pub use crate::{Call, Error, Fingerprint, Idem, InProgress, Key};

/// Holds a reference to a key expression; method resolution then picks a readable id for
/// strings and integers and a digest for any other `Serialize` value.
pub struct KeyIdProbe<'a, T: ?Sized>(pub &'a T);

/// Chosen first: strings and integers stay readable.
pub trait ViaReadable {
    /// The key id.
    fn __idem_key_id(&self) -> String;
}

impl<T: crate::key::ReadableKeyId + ?Sized> ViaReadable for KeyIdProbe<'_, T> {
    fn __idem_key_id(&self) -> String {
        self.0.key_id().into_owned()
    }
}

/// Chosen when the value is not a string or integer: a 128-bit digest.
pub trait ViaDigest {
    /// The key id.
    fn __idem_key_id(&self) -> String;
}

impl<T: Serialize + ?Sized> ViaDigest for &KeyIdProbe<'_, T> {
    fn __idem_key_id(&self) -> String {
        crate::digest::digest_hex(self.0)
    }
}

/// Parses a duration literal such as `"250ms"`, `"30s"`, `"5m"`, `"24h"` or `"7d"`.
/// The macro checks literals at compile time with the same rules.
pub const fn duration_ms(ms: u64) -> std::time::Duration {
    std::time::Duration::from_millis(ms)
}

/// Anything that can be turned into a `Duration` option: a `Duration`, or a literal already
/// checked by the macro.
pub fn into_duration(d: impl Into<std::time::Duration>) -> std::time::Duration {
    d.into()
}
