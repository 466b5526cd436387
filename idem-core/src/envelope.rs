//! The record envelope: what the engine wraps around an encoded result before a store
//! keeps it as opaque bytes.
//!
//! ```text
//! offset 0  4 bytes  magic "idem"
//!        4  1 byte   format version (2; format 1 is still read)
//!        5  1 byte   codec id
//!        6  1 byte   kind: 0 = the function's value, 1 = a cached error, 2 = a hold (a
//!                    step whose outcome is unknown: `{"step":"<name>","hold":"<id>"}`
//!                    as JSON, with `"step_record":false` on a call's key whose step
//!                    record could not be held, and without `hold` as older holds were
//!                    written; read whatever the reading call's codec and version)
//!        7  8 bytes  result version: the `version` the writing call declared (default 0),
//!                    little endian
//!       15  ...      the codec's payload
//! ```
//!
//! Nothing in a record depends on the toolchain: no type name, no layout. A result type may
//! change as its codec allows (with JSON: a field added with `#[serde(default)]`, the type
//! renamed or moved) and its old records still replay; a change that old records must not
//! survive is a new `version`, and a record of another version is refused with
//! [`DecodeError::ResultVersion`] until it expires.
//!
//! Format 1 (idem before the golden files) kept a hash of `std::any::type_name` where the
//! version is now. Such records are still read, as version 0, without that check: the key's
//! scope already ties a record to one function, and so to one result type.

use serde::{de::DeserializeOwned, Serialize};

use crate::codec::Codec;
use crate::error::{BoxError, DecodeError};

const MAGIC: &[u8; 4] = b"idem";
/// The envelope format this build writes. It also reads format 1.
pub const FORMAT_VERSION: u8 = 2;
/// The first format, whose header carried a type-name hash instead of the result version.
const FORMAT_V1: u8 = 1;
const HEADER: usize = 15;

/// What a record holds: the function's value or an error it chose to cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Value = 0,
    Error = 1,
    /// A key held because the outcome of one of its steps is unknown: the payload is the
    /// step's name as JSON (`{"step":"charge"}`), whatever the call's codec.
    Held = 2,
}

pub(crate) fn seal<C: Codec, T: Serialize + ?Sized>(
    codec: &C,
    kind: Kind,
    version: u64,
    value: &T,
) -> Result<Vec<u8>, BoxError> {
    let payload = codec.encode(value)?;
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.push(FORMAT_VERSION);
    out.push(codec.id());
    out.push(kind as u8);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Reads the header, checks it against the reading call's codec and result version, and
/// returns the kind and the payload.
pub(crate) fn open<'a, C: Codec>(
    codec: &C,
    version: u64,
    bytes: &'a [u8],
) -> Result<(Kind, &'a [u8]), DecodeError> {
    if bytes.len() < HEADER || &bytes[..4] != MAGIC {
        return Err(DecodeError::NotAnEnvelope);
    }
    if bytes[4] != FORMAT_VERSION && bytes[4] != FORMAT_V1 {
        return Err(DecodeError::Version {
            found: bytes[4],
            expected: FORMAT_VERSION,
        });
    }
    if bytes[6] == Kind::Held as u8 {
        // A hold is the same record whatever the call's codec and version: every call of
        // the key must see it. Only the exact bytes `seal_held` writes are one: anything
        // else of kind 2 is no record of this build's, never read as a hold.
        if held_step(bytes).is_none() {
            return Err(DecodeError::NotAnEnvelope);
        }
        return Ok((Kind::Held, &bytes[HEADER..]));
    }
    if bytes[5] != codec.id() {
        return Err(DecodeError::Codec {
            found: bytes[5],
            expected: codec.id(),
        });
    }
    let kind = match bytes[6] {
        0 => Kind::Value,
        1 => Kind::Error,
        2 => Kind::Held,
        _ => return Err(DecodeError::NotAnEnvelope),
    };
    let found = if bytes[4] == FORMAT_V1 {
        0
    } else {
        let mut v = [0u8; 8];
        v.copy_from_slice(&bytes[7..15]);
        u64::from_le_bytes(v)
    };
    if found != version {
        return Err(DecodeError::ResultVersion {
            found,
            expected: version,
        });
    }
    Ok((kind, &bytes[HEADER..]))
}

pub(crate) fn decode_payload<C: Codec, T: DeserializeOwned>(
    codec: &C,
    payload: &[u8],
) -> Result<T, DecodeError> {
    codec
        .decode(payload)
        .map_err(|source| DecodeError::Payload {
            codec: codec.name(),
            source,
        })
}

/// Seals `value` as the engine stores a call's successful result: the envelope of
/// `codec`, kind value, result `version`. For a store written outside the engine (a
/// dedup record written in the user's own SQL transaction) whose record the engine must
/// then replay as if a call had stored it.
pub fn seal_value<C: Codec, T: Serialize + ?Sized>(
    codec: &C,
    version: u64,
    value: &T,
) -> Result<Vec<u8>, BoxError> {
    seal(codec, Kind::Value, version, value)
}

/// Opens a record the engine (or [`seal_value`]) stored and decodes its value. A record
/// holding a cached error is [`DecodeError::UnexpectedError`].
pub fn open_value<C: Codec, T: DeserializeOwned>(
    codec: &C,
    version: u64,
    bytes: &[u8],
) -> Result<T, DecodeError> {
    match open(codec, version, bytes)? {
        (Kind::Value, payload) => decode_payload(codec, payload),
        (Kind::Error | Kind::Held, _) => Err(DecodeError::UnexpectedError),
    }
}

/// An envelope's header, as [`header`] reads it without decoding the payload: what an
/// operator's tool shows of a stored result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Header {
    /// The envelope format (2, or 1 for records of idem before the golden files).
    pub format: u8,
    /// The codec id ([`Codec::id`]): 1 JSON, 2 postcard, 3 bincode, others custom.
    pub codec: u8,
    /// Whether the record holds an error the call chose to cache, not its value.
    pub cached_error: bool,
    /// Whether the record holds a key whose step's outcome is unknown (the payload is
    /// `{"step":"<name>"}` in JSON), not a result. See [`step`](crate::step).
    pub held: bool,
    /// The result `version` the writing call declared (0 for format 1).
    pub version: u64,
}

/// The record that holds a key whose step `step` has an unknown outcome: a format 2
/// envelope of kind 2, the JSON codec's id, result version 0, and
/// `{"step":"<name>","hold":"<id>"}`, where `<id>` (16 lowercase hex digits, the writing
/// attempt's token) tells this hold from every other hold of the same step, so that a
/// resolution can replace exactly the hold it read. `step_record: false` is added on the
/// call's key when the step's own record could not be given its hold.
pub(crate) fn seal_held(step: &str, id: u64, step_record: bool) -> Vec<u8> {
    // A step name is ASCII letters, digits, `_`, `-` and `.`: nothing to escape.
    let payload = match step_record {
        true => format!(r#"{{"step":"{step}","hold":"{id:016x}"}}"#),
        false => format!(r#"{{"step":"{step}","hold":"{id:016x}","step_record":false}}"#),
    };
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.push(FORMAT_VERSION);
    out.push(crate::codec::Json.id());
    out.push(Kind::Held as u8);
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(payload.as_bytes());
    out
}

/// A hold, as read: the step whose outcome is unknown, and whether that step's own record
/// was given the hold too (`false` only when its write failed; a hold written before holds
/// carried ids says nothing and reads `true`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hold {
    pub(crate) step: String,
    pub(crate) step_record: bool,
}

/// The hold this record is, if it is one: exactly what the engine writes (format 2, the
/// JSON codec's id, result version 0, `{"step":"<name>"}` with a valid step name, and since
/// holds carry ids, `"hold"` with 16 lowercase hex digits and an optional
/// `"step_record":false`); anything else is not a hold.
pub(crate) fn read_hold(bytes: &[u8]) -> Option<Hold> {
    let (header, payload) = header(bytes).ok()?;
    if !header.held
        || header.format != FORMAT_VERSION
        || header.codec != crate::codec::Json.id()
        || header.version != 0
    {
        return None;
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Stored {
        step: String,
        #[serde(default)]
        hold: Option<String>,
        #[serde(default)]
        step_record: Option<bool>,
    }
    let hold = serde_json::from_slice::<Stored>(payload).ok()?;
    let id_ok =
        |id: &str| id.len() == 16 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let valid = crate::key::step_name_is_valid(&hold.step)
        && hold.hold.as_deref().is_none_or(id_ok)
        && (hold.step_record != Some(true))
        && (hold.step_record.is_none() || hold.hold.is_some());
    valid.then_some(Hold {
        step: hold.step,
        step_record: hold.step_record.unwrap_or(true),
    })
}

/// The name of the step whose unknown outcome holds this record, if it is a hold: exactly
/// what the engine writes (format 2, the JSON codec's id, result version 0,
/// `{"step":"<name>"}` with a valid step name, and, since holds carry ids, `"hold"` with 16
/// lowercase hex digits and an optional `"step_record":false`); anything else is not a hold.
pub fn held_step(bytes: &[u8]) -> Option<String> {
    read_hold(bytes).map(|hold| hold.step)
}

/// Reads the header of a stored record and returns it with the codec's payload, checking
/// only that the bytes are an envelope of a format this build reads (not the codec or the
/// result version, which belong to the reading call).
pub fn header(bytes: &[u8]) -> Result<(Header, &[u8]), DecodeError> {
    if bytes.len() < HEADER || &bytes[..4] != MAGIC {
        return Err(DecodeError::NotAnEnvelope);
    }
    if bytes[4] != FORMAT_VERSION && bytes[4] != FORMAT_V1 {
        return Err(DecodeError::Version {
            found: bytes[4],
            expected: FORMAT_VERSION,
        });
    }
    let (cached_error, held) = match bytes[6] {
        0 => (false, false),
        1 => (true, false),
        2 => (false, true),
        _ => return Err(DecodeError::NotAnEnvelope),
    };
    let version = if bytes[4] == FORMAT_V1 {
        0
    } else {
        let mut v = [0u8; 8];
        v.copy_from_slice(&bytes[7..15]);
        u64::from_le_bytes(v)
    };
    let header = Header {
        format: bytes[4],
        codec: bytes[5],
        cached_error,
        held,
        version,
    };
    Ok((header, &bytes[HEADER..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Json;

    #[test]
    fn only_the_exact_bytes_of_a_hold_are_one() {
        let hold = seal_held("charge", 0x1234_5678_9abc_def0, true);
        assert_eq!(held_step(&hold).as_deref(), Some("charge"));
        let old = [&hold[..HEADER], br#"{"step":"charge"}"#].concat();
        assert_eq!(
            held_step(&old).as_deref(),
            Some("charge"),
            "a hold without an id"
        );
        let unrecorded = seal_held("charge", 7, false);
        let read = read_hold(&unrecorded).unwrap();
        assert_eq!((read.step.as_str(), read.step_record), ("charge", false));
        assert_ne!(seal_held("charge", 1, true), seal_held("charge", 2, true));
        assert!(
            matches!(open(&Json, 7, &hold), Ok((Kind::Held, _))),
            "any version reads it"
        );
        let mut format_1 = hold.clone();
        format_1[4] = FORMAT_V1;
        let mut postcard = hold.clone();
        postcard[5] = 2;
        let mut versioned = hold.clone();
        versioned[7] = 1;
        let mut not_json = hold[..HEADER].to_vec();
        not_json.extend_from_slice(b"charge");
        let mut other_field = hold[..HEADER].to_vec();
        other_field.extend_from_slice(br#"{"step":"charge","ran":true}"#);
        let mut bad_name = hold[..HEADER].to_vec();
        bad_name.extend_from_slice(br#"{"step":""}"#);
        let mut bad_id = hold[..HEADER].to_vec();
        bad_id.extend_from_slice(br#"{"step":"charge","hold":"XYZ"}"#);
        let mut flag_without_id = hold[..HEADER].to_vec();
        flag_without_id.extend_from_slice(br#"{"step":"charge","step_record":false}"#);
        for bytes in [
            format_1,
            postcard,
            versioned,
            not_json,
            other_field,
            bad_name,
            bad_id,
            flag_without_id,
        ] {
            assert_eq!(held_step(&bytes), None, "{bytes:?}");
            assert!(
                matches!(open(&Json, 0, &bytes), Err(DecodeError::NotAnEnvelope)),
                "{bytes:?}"
            );
        }
    }

    #[test]
    fn round_trip_and_refusals() {
        let sealed = seal(&Json, Kind::Value, 3, &vec![1u32, 2]).unwrap();
        let (kind, payload) = open(&Json, 3, &sealed).unwrap();
        assert_eq!(kind, Kind::Value);
        let back: Vec<u32> = decode_payload(&Json, payload).unwrap();
        assert_eq!(back, vec![1, 2]);
        // Another result version is refused, both ways.
        for other in [0, 2, 4] {
            let err = open(&Json, other, &sealed).unwrap_err();
            assert!(
                matches!(err, DecodeError::ResultVersion { found: 3, expected } if expected == other),
                "{err:?}"
            );
        }
        // Garbage and truncation.
        assert!(matches!(
            open(&Json, 0, b"{\"a\":1}"),
            Err(DecodeError::NotAnEnvelope)
        ));
        assert!(matches!(
            open(&Json, 3, &sealed[..10]),
            Err(DecodeError::NotAnEnvelope)
        ));
        let mut newer = sealed.clone();
        newer[4] = 9;
        assert!(matches!(
            open(&Json, 3, &newer),
            Err(DecodeError::Version { found: 9, .. })
        ));
        let mut other_codec = sealed;
        other_codec[5] = 77;
        assert!(matches!(
            open(&Json, 3, &other_codec),
            Err(DecodeError::Codec { found: 77, .. })
        ));
    }

    #[test]
    fn header_reads_what_seal_wrote() {
        let sealed = seal(&Json, Kind::Error, 7, &"boom").unwrap();
        let (h, payload) = header(&sealed).unwrap();
        assert_eq!(
            (h.format, h.codec, h.cached_error, h.version),
            (FORMAT_VERSION, 1, true, 7)
        );
        assert_eq!(payload, b"\"boom\"");
        assert!(matches!(header(b"idem"), Err(DecodeError::NotAnEnvelope)));
        let mut newer = sealed;
        newer[4] = 9;
        assert!(matches!(
            header(&newer),
            Err(DecodeError::Version { found: 9, .. })
        ));
    }
}
