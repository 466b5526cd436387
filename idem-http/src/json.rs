//! A JSON body as the fingerprint reads it: every value as a typical handler tells it
//! apart, members in any order.
//!
//! Two bodies share this reading only when a serde-derive handler cannot tell them apart:
//! member order and whitespace do not count, string escapes are decoded (`"\u0041"` is
//! `"A"`), and a number counts by its text (`100`, `1e2`, `100.0` and `-0` are four numbers,
//! since a handler with a `u64` field accepts one of them only, and a decimal type reads
//! each differently). A body with a member twice has no reading (serde-derive refuses it
//! while a `Value` keeps the last one), and counts by its bytes.

use std::collections::BTreeMap;

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};

/// A parsed JSON value, numbers kept as their text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    Number(String),
    String(String),
    Array(Vec<Json>),
    Object(BTreeMap<String, Json>),
}

/// Why a body has no reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NotRead {
    /// It is not JSON (or deeper than serde_json reads).
    Invalid,
    /// An object has this member twice.
    Duplicate(String),
}

impl Json {
    /// Reads `bytes`: `serde_json` judges what is valid JSON (and how deep it may nest), so
    /// the reading below only walks a document already known to be well formed.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Json, NotRead> {
        if serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_err() {
            return Err(NotRead::Invalid);
        }
        let mut reader = Reader {
            bytes,
            at: 0,
            depth: 0,
        };
        reader.space();
        let value = reader.value()?;
        reader.space();
        if reader.at != bytes.len() {
            return Err(NotRead::Invalid);
        }
        Ok(value)
    }
}

/// How deep arrays and objects may nest: serde_json's own limit for a `Value`, so that a
/// body this reading refuses is one a handler's `Json` extractor refuses too, and a hostile
/// body cannot exhaust the stack.
const MAX_DEPTH: usize = 127;

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    depth: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Result<(), NotRead> {
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(NotRead::Invalid)
        }
    }

    fn literal(&mut self, text: &[u8], value: Json) -> Result<Json, NotRead> {
        if self.bytes[self.at..].starts_with(text) {
            self.at += text.len();
            Ok(value)
        } else {
            Err(NotRead::Invalid)
        }
    }

    fn value(&mut self) -> Result<Json, NotRead> {
        match self.peek().ok_or(NotRead::Invalid)? {
            b'{' | b'[' => {
                self.depth += 1;
                if self.depth > MAX_DEPTH {
                    return Err(NotRead::Invalid);
                }
                let nested = if self.peek() == Some(b'{') {
                    self.object()
                } else {
                    self.array()
                };
                self.depth -= 1;
                nested
            }
            b'"' => Ok(Json::String(self.string()?)),
            b't' => self.literal(b"true", Json::Bool(true)),
            b'f' => self.literal(b"false", Json::Bool(false)),
            b'n' => self.literal(b"null", Json::Null),
            _ => self.number(),
        }
    }

    fn number(&mut self) -> Result<Json, NotRead> {
        let start = self.at;
        while matches!(
            self.peek(),
            Some(b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
        ) {
            self.at += 1;
        }
        match std::str::from_utf8(&self.bytes[start..self.at]) {
            Ok(text) if !text.is_empty() => Ok(Json::Number(text.to_owned())),
            _ => Err(NotRead::Invalid),
        }
    }

    /// A string, its escapes decoded by serde_json.
    fn string(&mut self) -> Result<String, NotRead> {
        let start = self.at;
        self.expect(b'"')?;
        loop {
            match self.peek().ok_or(NotRead::Invalid)? {
                b'\\' => self.at += 2,
                b'"' => {
                    self.at += 1;
                    break;
                }
                _ => self.at += 1,
            }
        }
        let raw = self.bytes.get(start..self.at).ok_or(NotRead::Invalid)?;
        serde_json::from_slice(raw).map_err(|_| NotRead::Invalid)
    }

    fn array(&mut self) -> Result<Json, NotRead> {
        self.expect(b'[')?;
        let mut items = Vec::new();
        self.space();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(Json::Array(items));
        }
        loop {
            self.space();
            items.push(self.value()?);
            self.space();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(Json::Array(items));
                }
                _ => return Err(NotRead::Invalid),
            }
        }
    }

    fn object(&mut self) -> Result<Json, NotRead> {
        self.expect(b'{')?;
        let mut members = BTreeMap::new();
        self.space();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(Json::Object(members));
        }
        loop {
            self.space();
            let name = self.string()?;
            self.space();
            self.expect(b':')?;
            self.space();
            let value = self.value()?;
            if members.contains_key(&name) {
                return Err(NotRead::Duplicate(name));
            }
            members.insert(name, value);
            self.space();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(Json::Object(members));
                }
                _ => return Err(NotRead::Invalid),
            }
        }
    }
}

/// In idem's digest encoding. A number that reads the same whatever its type is encoded as
/// before numbers counted by their text, so that bodies that were never ambiguous keep the
/// fingerprint they were stored with: an integer written plainly (`-12`, within 64 bits, not
/// `-0`) as that integer, a non-zero float written as Rust writes it (`0.25`, `1.5e300`) as
/// that float. Any other number (`1e2`, `1.0`, `-0`, `10.0000000000000001`, an integer
/// past 64 bits) is its text, tagged so that it is never a string, an integer or a float.
impl Serialize for Json {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Json::Null => s.serialize_unit(),
            Json::Bool(b) => s.serialize_bool(*b),
            Json::String(text) => s.serialize_str(text),
            Json::Number(text) => {
                let plain_integer = {
                    let digits = text.strip_prefix('-').unwrap_or(text);
                    !digits.is_empty()
                        && digits.bytes().all(|b| b.is_ascii_digit())
                        && (digits == "0" || !digits.starts_with('0'))
                        && text != "-0"
                };
                if plain_integer {
                    if let Ok(u) = text.parse::<u64>() {
                        return s.serialize_u64(u);
                    }
                    if let Ok(i) = text.parse::<i64>() {
                        return s.serialize_i64(i);
                    }
                } else if let Ok(f) = text.parse::<f64>() {
                    if f.is_finite() && f != 0.0 && format!("{f:?}") == *text {
                        return s.serialize_f64(f);
                    }
                }
                s.serialize_newtype_variant("Json", 0, "number-text", text.as_str())
            }
            Json::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Json::Object(members) => {
                let mut map = s.serialize_map(Some(members.len()))?;
                for (name, item) in members {
                    map.serialize_entry(name, item)?;
                }
                map.end()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_and_invalid_bodies_have_no_reading() {
        assert_eq!(
            Json::parse(br#"{"a":1,"b":{"c":1,"c":2}}"#),
            Err(NotRead::Duplicate("c".into()))
        );
        assert_eq!(
            Json::parse(br#"{"a":1,"\u0061":2}"#),
            Err(NotRead::Duplicate("a".into()))
        );
        assert_eq!(Json::parse(b"{oops"), Err(NotRead::Invalid));
        assert_eq!(Json::parse(b"[1] [2]"), Err(NotRead::Invalid));
        // Deeper than serde_json reads a `Value`: refused, without exhausting the stack.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(Json::parse(deep.as_bytes()), Err(NotRead::Invalid));
        let deep = format!("{}1{}", r#"{"a":"#.repeat(128), "}".repeat(128));
        assert_eq!(Json::parse(deep.as_bytes()), Err(NotRead::Invalid));
        assert!(serde_json::from_str::<serde_json::Value>(&deep).is_err());
        let fine = format!("{}1{}", r#"{"a":"#.repeat(127), "}".repeat(127));
        assert!(Json::parse(fine.as_bytes()).is_ok());
        assert!(serde_json::from_str::<serde_json::Value>(&fine).is_ok());
    }

    #[test]
    fn values_are_read_as_written() {
        assert_eq!(
            Json::parse(br#" { "b" : [ 1e2 , -0, "\u00e9\n" ] , "a" : null } "#).unwrap(),
            Json::Object(BTreeMap::from([
                ("a".to_owned(), Json::Null),
                (
                    "b".to_owned(),
                    Json::Array(vec![
                        Json::Number("1e2".into()),
                        Json::Number("-0".into()),
                        Json::String("é\n".into()),
                    ])
                ),
            ]))
        );
    }
}
