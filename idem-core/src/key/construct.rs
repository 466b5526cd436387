//! Building a key: the checks a scope and an id pass, a key whose id is a value's digest,
//! and the key of a step's record. Apart from the type (`key.rs`), which the crate's error
//! carries, so that the two import each other neither way round.

use std::sync::Arc;

use super::{check_step_name, Key, MAX_ID_LEN, MAX_SCOPE_LEN, STEP_SCOPE};
use crate::digest;
use crate::error::Error;

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
    use crate::key::{check_step_name, shown, MAX_STEP_NAME_LEN};

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
