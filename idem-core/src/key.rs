//! Idempotency keys: a scope plus an id.

use std::fmt;
use std::sync::Arc;

use crate::digest;
use crate::error::Error;

/// The longest key id accepted, in bytes.
pub const MAX_ID_LEN: usize = 1024;
/// The longest scope accepted, in bytes.
pub const MAX_SCOPE_LEN: usize = 256;

/// The longest step name, in bytes.
pub const MAX_STEP_NAME_LEN: usize = 64;

/// What joins a call's scope and a step's name in the scope of the step's record.
const STEP_SCOPE: &str = "#step:";

/// An idempotency key: a scope (by default the function's module path and name) and an id.
///
/// The store sees one string, `scope/id` ([`Key::as_str`]). A scope never contains `/`, so
/// two different (scope, id) pairs never share a stored key. Any UTF-8 id is accepted,
/// control characters included, and every store keeps it apart from every other; where a
/// key is printed (its `Display` in errors and tracing events) it is escaped, so an id
/// cannot forge a log line.
///
/// ```
/// use idem::Key;
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
            scope: scope.to_owned(),
            id: Some(id.to_owned()),
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
        Ok(Key {
            full: joined(scope, id),
            scope_len: scope.len(),
        })
    }

    /// A key whose id is the 128-bit digest of `value` (see [`digest_hex`](crate::digest_hex), the format).
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

    /// The scope.
    pub fn scope(&self) -> &str {
        &self.full[..self.scope_len]
    }

    /// The id.
    pub fn id(&self) -> &str {
        &self.full[self.scope_len + 1..]
    }

    /// The key of the record of step `name` of the call keyed `self`
    /// ([`step`](crate::step)): the scope `<scope>#step:<name>` and the same id. A name
    /// that is not valid (1 to 64 bytes of ASCII letters, digits, `_`, `-` and `.`), or a
    /// scope too long to take it, is an [`Error::Step`].
    ///
    /// ```
    /// let key = idem::Key::new("shop::checkout", "o-1").unwrap();
    /// assert_eq!(key.step("charge").unwrap().as_str(), "shop::checkout#step:charge/o-1");
    /// assert!(key.step("no spaces").is_err());
    /// ```
    pub fn step(&self, name: &str) -> Result<Key, Error> {
        step_record_key(self, name).map_err(|reason| Error::Step {
            key: Some(self.clone()),
            step: name.to_owned(),
            reason,
        })
    }

    /// `scope/id`: the string a store keeps the record under.
    pub fn as_str(&self) -> &str {
        &self.full
    }
}

/// `scope/id` in one allocation: composed in a buffer this thread reuses, then copied into
/// the `Arc` (a `String` would be a second allocation, as `Arc<str>` needs its own).
fn joined(scope: &str, id: &str) -> Arc<str> {
    thread_local! {
        static BUF: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    let compose = |buf: &mut String| {
        buf.clear();
        buf.push_str(scope);
        buf.push('/');
        buf.push_str(id);
        Arc::<str>::from(buf.as_str())
    };
    BUF.try_with(|b| b.try_borrow_mut().ok().map(|mut b| compose(&mut b)))
        .ok()
        .flatten()
        .unwrap_or_else(|| compose(&mut String::new()))
}

fn invalid_value(scope: &str, msg: &str) -> Error {
    Error::InvalidKey {
        scope: scope.to_owned(),
        id: None,
        reason: format!("the key value could not be serialized, so it has no stable digest: {msg}"),
    }
}

/// How an invalid key prints in its error: `scope/id`, escaped, `<value>` for an id that
/// could not be made. A part within its length limit prints whole, as in a valid key; one
/// over it (it may be megabytes) prints its first 128 and last 32 bytes and its length, so
/// that it can still be told apart and found.
pub(crate) fn shown_invalid(scope: &str, id: Option<&str>) -> String {
    let scope = Cut(scope, MAX_SCOPE_LEN);
    match id {
        Some(id) => format!("{scope}/{}", Cut(id, MAX_ID_LEN)),
        None => format!("{scope}/<value>"),
    }
}

/// Prints text that is safe in a log line or an error message: control characters (a
/// newline, a carriage return, an escape sequence), backslashes and the Unicode line,
/// paragraph and direction marks are escaped as Rust escapes them (`\n`, `\u{1b}`), so a
/// client-chosen id can neither split a log line nor forge one. Never shortened: a key is
/// at most `MAX_SCOPE_LEN + 1 + MAX_ID_LEN` bytes, and a cut one could lose the very id
/// an operator looks for.
///
/// One part is left out: an id that begins with a client digest, `@` and 32 lowercase hex
/// digits then `:` (the HTTP layer's id of a client known by its credentials), is shown as
/// `@[client]:` and the rest, so that no log line, span or error message carries a value
/// derived from a client's credentials. The store keeps the whole id.
struct Shown<'a>(&'a str);

/// The length of a client digest's `@` and hex digits.
const CLIENT_DIGEST_LEN: usize = 33;

/// Whether `s` has a client digest at byte `at`: `@`, 32 lowercase hex digits, then `:`.
fn client_digest_at(s: &str, at: usize) -> bool {
    let Some(rest) = s.as_bytes().get(at..) else {
        return false;
    };
    rest.len() > CLIENT_DIGEST_LEN
        && rest[0] == b'@'
        && rest[1..CLIENT_DIGEST_LEN]
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
        && rest[CLIENT_DIGEST_LEN] == b':'
}

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        // An id on its own, or a whole key's id after its scope (which holds no `/`).
        let digest = if client_digest_at(s, 0) {
            Some(0)
        } else {
            s.find('/')
                .map(|slash| slash + 1)
                .filter(|&at| client_digest_at(s, at))
        };
        let escaped = |f: &mut fmt::Formatter<'_>, part: &str| -> fmt::Result {
            for c in part.chars() {
                if needs_escape(c) {
                    write!(f, "{}", c.escape_debug())?;
                } else {
                    fmt::Write::write_char(f, c)?;
                }
            }
            Ok(())
        };
        match digest {
            Some(at) => {
                escaped(f, &s[..at])?;
                f.write_str("@[client]")?;
                escaped(f, &s[at + CLIENT_DIGEST_LEN..])
            }
            None => escaped(f, s),
        }
    }
}

/// A part of an invalid key, escaped; over `limit` bytes, its head, its tail and its length.
struct Cut<'a>(&'a str, usize);

impl fmt::Display for Cut<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const HEAD: usize = 128;
        const TAIL: usize = 32;
        let (s, limit) = (self.0, self.1);
        if s.len() <= limit {
            return Shown(s).fmt(f);
        }
        let mut head = HEAD;
        while !s.is_char_boundary(head) {
            head -= 1;
        }
        let mut tail = s.len() - TAIL;
        while !s.is_char_boundary(tail) {
            tail += 1;
        }
        write!(
            f,
            "{}...{} ({} bytes)",
            Shown(&s[..head]),
            Shown(&s[tail..]),
            s.len()
        )
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

/// `s` as a key prints it (escaped, never shortened): for a key's parts printed apart, as
/// the `idem.call` span's `scope` and `key` fields are.
pub(crate) fn shown(s: &str) -> impl fmt::Display + '_ {
    Shown(s)
}

/// Whether `name` can name a step: 1 to [`MAX_STEP_NAME_LEN`] bytes of ASCII letters,
/// digits, `_`, `-` and `.`.
pub(crate) fn check_step_name(name: &str) -> Result<(), String> {
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if name.is_empty() || name.len() > MAX_STEP_NAME_LEN || !name.chars().all(valid) {
        return Err(format!(
            "a step name is 1 to {MAX_STEP_NAME_LEN} bytes of ASCII letters, digits, `_`, `-` and `.`"
        ));
    }
    Ok(())
}

/// Whether `name` can name a step (see [`check_step_name`]).
pub(crate) fn step_name_is_valid(name: &str) -> bool {
    check_step_name(name).is_ok()
}

/// The key of the record of step `name` of the call keyed `parent`:
/// `<scope>#step:<name>/<id>`.
pub(crate) fn step_record_key(parent: &Key, name: &str) -> Result<Key, String> {
    check_step_name(name)?;
    Key::new(format!("{}{STEP_SCOPE}{name}", parent.scope()), parent.id()).map_err(|e| match e {
        Error::InvalidKey { reason, .. } => format!(
            "its record's key is not valid ({reason}): the call's scope and the step's name are at most {} bytes together",
            MAX_SCOPE_LEN - STEP_SCOPE.len()
        ),
        other => other.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_digest_is_never_shown() {
        let digest = "0123456789abcdef0123456789abcdef";
        let key = Key::new("payments", format!("@{digest}:order-1")).unwrap();
        assert_eq!(key.to_string(), "payments/@[client]:order-1");
        assert_eq!(shown(key.id()).to_string(), "@[client]:order-1");
        assert_eq!(key.as_str(), format!("payments/@{digest}:order-1"));
        // Not a digest: shown as it is.
        for id in [
            "@0123:k",
            "@0123456789ABCDEF0123456789ABCDEF:k",
            "x@0123456789abcdef0123456789abcdef:k",
        ] {
            assert_eq!(shown(id).to_string(), id);
        }
        assert_eq!(
            shown(&format!("@{digest}:a\nb")).to_string(),
            "@[client]:a\\nb"
        );
    }

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
    fn a_long_key_prints_whole_in_its_errors() {
        // The id an operator greps for is at the end of a long key: it must survive.
        let id = format!("{}-order-42", "é".repeat(500));
        let key = Key::new("billing::charge", &id).unwrap();
        assert_eq!(key.to_string(), format!("billing::charge/{id}"));
        let err = Error::KeyReuse { key: key.clone() }.to_string();
        assert!(err.contains(&id), "{err}");
        assert!(format!("{key:?}").contains(&id));
    }

    #[test]
    fn an_invalid_key_names_its_scope_and_id_and_cuts_only_an_oversized_part() {
        let Err(Error::InvalidKey { scope, id, reason }) = Key::new("a/b", "x\ny") else {
            panic!("a scope with `/` is refused");
        };
        assert_eq!((scope.as_str(), id.as_deref()), ("a/b", Some("x\ny")));
        assert!(reason.contains('/'), "{reason}");

        // 2000 bytes: over the limit, so the message shows its head, tail and length,
        // while the error itself keeps the id whole.
        let long = format!("{}{}", "h".repeat(1000), "t".repeat(1000));
        let err = Key::new("s", &long).unwrap_err();
        assert!(matches!(&err, Error::InvalidKey { id: Some(id), .. } if *id == long));
        let shown = err.to_string();
        let expected = format!("`s/{}...{} (2000 bytes)`", "h".repeat(128), "t".repeat(32));
        assert!(shown.contains(&expected), "{shown}");

        // Cut on a char boundary.
        let wide = "é".repeat(600);
        let shown = Key::new("s", &wide).unwrap_err().to_string();
        assert!(
            shown.contains(&format!("s/{}...", "é".repeat(64))),
            "{shown}"
        );
        assert!(shown.contains("(1200 bytes)"), "{shown}");
    }

    #[test]
    fn step_names_are_short_plain_and_unambiguous() {
        for good in ["charge", "email.0", "reserve-stock", "A_1"] {
            assert!(check_step_name(good).is_ok(), "{good}");
        }
        let long = "x".repeat(MAX_STEP_NAME_LEN + 1);
        for bad in ["", "a/b", "a b", "é", "#step:x", long.as_str()] {
            assert!(check_step_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_step_record_key_is_the_scope_the_name_and_the_call_id() {
        let parent = Key::new("shop::checkout", "o/1").unwrap();
        let key = step_record_key(&parent, "charge").unwrap();
        assert_eq!(key.as_str(), "shop::checkout#step:charge/o/1");
        let long = Key::new("s".repeat(250), "o").unwrap();
        let err = step_record_key(&long, "charge").unwrap_err();
        assert!(err.contains("at most 250 bytes together"), "{err}");
    }
}
