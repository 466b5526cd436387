//! Idempotency keys: a scope plus an id.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use crate::digest;
use crate::error::Error;

/// The longest key id accepted, in bytes.
pub const MAX_ID_LEN: usize = 1024;
/// The longest scope accepted, in bytes.
pub const MAX_SCOPE_LEN: usize = 256;

/// An idempotency key: a scope (by default the function's module path and name) and an id.
///
/// The store sees one string, `scope/id` ([`Key::as_str`]). A scope never contains `/`, so
/// two different (scope, id) pairs never share a stored key. Any UTF-8 id is accepted,
/// control characters included, and every store keeps it apart from every other; where a
/// key is printed (its `Display` in errors and tracing events) it is escaped, so an id
/// cannot forge a log line.
///
/// ```
/// use idem_core::Key;
/// let key = Key::new("billing::charge", "order-42").unwrap();
/// assert_eq!(key.as_str(), "billing::charge/order-42");
/// assert_eq!(key.id(), "order-42");
/// assert!(Key::new("billing::charge", "").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    full: Arc<str>,
    scope_len: usize,
}

impl Key {
    /// Builds a key, checking that the scope and id are non-empty and short enough, and that
    /// the scope holds no `/`.
    pub fn new(scope: impl AsRef<str>, id: impl AsRef<str>) -> Result<Key, Error> {
        let (scope, id) = (scope.as_ref(), id.as_ref());
        let invalid = |reason: String| Error::InvalidKey {
            key: shown(&format!("{scope}/{id}")),
            reason,
        };
        if scope.is_empty() {
            return Err(invalid("the scope is empty".into()));
        }
        if scope.len() > MAX_SCOPE_LEN {
            return Err(invalid(format!(
                "the scope is {} bytes long; the limit is {MAX_SCOPE_LEN}",
                scope.len()
            )));
        }
        if scope.contains('/') {
            return Err(invalid(
                "the scope contains `/`, which separates scope and id".into(),
            ));
        }
        if id.is_empty() {
            return Err(invalid("the key id is empty".into()));
        }
        if id.len() > MAX_ID_LEN {
            return Err(invalid(format!(
                "the key id is {} bytes long; the limit is {MAX_ID_LEN}",
                id.len()
            )));
        }
        let mut full = String::with_capacity(scope.len() + 1 + id.len());
        full.push_str(scope);
        full.push('/');
        full.push_str(id);
        Ok(Key {
            full: full.into(),
            scope_len: scope.len(),
        })
    }

    /// A key whose id is the 128-bit digest of `value` (see [`digest_hex`](crate::digest_hex)).
    ///
    /// A value whose `Serialize` implementation fails has no stable digest and is refused
    /// with `Error::InvalidKey`.
    pub fn digest<T: serde::Serialize + ?Sized>(
        scope: impl AsRef<str>,
        value: &T,
    ) -> Result<Key, Error> {
        let id =
            digest::try_digest_hex(value).map_err(|msg| invalid_value(scope.as_ref(), &msg))?;
        Key::new(scope, id)
    }

    /// A key id from a probe that may have failed to serialize the key value, or found
    /// none (`Ok(None)`: the key expression was `None`).
    #[doc(hidden)]
    pub fn from_id_result(scope: &str, id: Result<Option<String>, String>) -> Result<Key, Error> {
        match id {
            Ok(Some(id)) => Key::new(scope, id),
            Ok(None) => Err(Error::MissingKey {
                scope: shown(scope),
            }),
            Err(msg) => Err(invalid_value(scope, &msg)),
        }
    }

    /// The scope.
    pub fn scope(&self) -> &str {
        &self.full[..self.scope_len]
    }

    /// The id.
    pub fn id(&self) -> &str {
        &self.full[self.scope_len + 1..]
    }

    /// `scope/id`: the string a store keeps the record under.
    pub fn as_str(&self) -> &str {
        &self.full
    }
}

fn invalid_value(scope: &str, msg: &str) -> Error {
    Error::InvalidKey {
        key: shown(&format!("{scope}/<value>")),
        reason: format!("the key value could not be serialized, so it has no stable digest: {msg}"),
    }
}

/// How a key (or a part of one) is printed: escaped and shortened.
fn shown(s: &str) -> String {
    Shown(s).to_string()
}

/// Prints a key as text that is safe in a log line or an error message: control characters
/// (a newline, a carriage return, an escape sequence), backslashes and the Unicode line,
/// paragraph and direction marks are escaped as Rust escapes them (`\n`, `\u{1b}`), so a
/// client-chosen id can neither split a log line nor forge one. A key longer than 96 bytes
/// is cut there, with its length.
struct Shown<'a>(&'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 96;
        let s = self.0;
        let mut end = s.len().min(SHOWN);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        for c in s[..end].chars() {
            if needs_escape(c) {
                write!(f, "{}", c.escape_debug())?;
            } else {
                fmt::Write::write_char(f, c)?;
            }
        }
        if end < s.len() {
            write!(f, "... ({} bytes)", s.len())?;
        }
        Ok(())
    }
}

fn needs_escape(c: char) -> bool {
    c.is_control()
        || c == '\\'
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Shown(&self.full).fmt(f)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Key")
            .field("scope", &self.scope())
            .field("id", &self.id())
            .finish()
    }
}

/// Values that stay readable when used as a key id: strings and integers.
///
/// Any other `Serialize` value used as a key becomes a 128-bit hex digest.
pub trait ReadableKeyId {
    /// The id text.
    fn key_id(&self) -> Cow<'_, str>;
}

impl ReadableKeyId for str {
    fn key_id(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}
impl ReadableKeyId for String {
    fn key_id(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}
impl ReadableKeyId for Cow<'_, str> {
    fn key_id(&self) -> Cow<'_, str> {
        Cow::Borrowed(self)
    }
}
impl<T: ReadableKeyId + ?Sized> ReadableKeyId for &T {
    fn key_id(&self) -> Cow<'_, str> {
        (**self).key_id()
    }
}
impl<T: ReadableKeyId + ?Sized> ReadableKeyId for Box<T> {
    fn key_id(&self) -> Cow<'_, str> {
        (**self).key_id()
    }
}
impl<T: ReadableKeyId + ?Sized> ReadableKeyId for Arc<T> {
    fn key_id(&self) -> Cow<'_, str> {
        (**self).key_id()
    }
}
macro_rules! readable_int {
    ($($t:ty),*) => {$(
        impl ReadableKeyId for $t {
            fn key_id(&self) -> Cow<'_, str> {
                Cow::Owned(self.to_string())
            }
        }
    )*};
}
readable_int!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_keys_cannot_split_or_forge_a_log_line() {
        let key = Key::new(
            "billing",
            "o-1\n2026-11-29 INFO charged\r\u{1b}[2J\\\u{2028}",
        )
        .unwrap();
        let shown = key.to_string();
        assert_eq!(
            shown,
            "billing/o-1\\n2026-11-29 INFO charged\\r\\u{1b}[2J\\\\\\u{2028}"
        );
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        // The store still sees the id as given.
        assert!(key.as_str().contains('\n'));
        // Errors that carry a key as text escape it too.
        let err = Key::new("a/b", "x\ny").unwrap_err().to_string();
        assert!(err.contains("a/b/x\\ny"), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }

    #[test]
    fn long_keys_are_cut_on_a_char_boundary_with_their_length() {
        let id = "é".repeat(100);
        let shown = Key::new("s", &id).unwrap().to_string();
        assert!(shown.ends_with("... (202 bytes)"), "{shown}");
        // Debug keeps the whole id.
        assert!(format!("{:?}", Key::new("s", &id).unwrap()).contains(&id));
    }

    #[test]
    fn a_missing_id_names_the_scope() {
        let err = Key::from_id_result("billing::charge", Ok(None)).unwrap_err();
        assert!(matches!(&err, Error::MissingKey { scope } if scope == "billing::charge"));
        assert!(err.to_string().contains("`billing::charge`"), "{err}");
    }
}
