//! Idempotency keys: a scope plus an id. The type and how it prints are here; building one
//! (the checks a scope and an id pass, a digested id, a step record's key) is in
//! `key/construct.rs`.

use std::fmt;
use std::sync::Arc;

pub(crate) mod construct;

/// The longest key id accepted, in bytes.
pub const MAX_ID_LEN: usize = 1024;
/// The longest scope accepted, in bytes.
pub const MAX_SCOPE_LEN: usize = 256;

/// The longest step name, in bytes.
pub const MAX_STEP_NAME_LEN: usize = 64;

/// What joins a call's scope and a step's name in the scope of the step's record.
pub(crate) const STEP_SCOPE: &str = "#step:";

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
