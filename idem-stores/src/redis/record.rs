//! The record as Redis holds it: the key it lives under, and the script replies turned back
//! into [`Claim`] and [`Record`]. The layout is documented in the module docs of
//! [`crate::redis`]; `scripts.rs` writes it.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use idem_core::{Claim, Fence, Fingerprint, Key, Record, StoreError, Token};
use redis::Value;

use super::BACKEND;

/// Magic and format version: every record starts with these five bytes.
pub(crate) const MAGIC: &[u8] = b"idem1";
/// Magic, state, token and fingerprint: where a completed record's payload starts.
pub(crate) const HEADER_LEN: usize = 30;
/// A header, the 15-digit lease deadline and the 16-digit fence.
pub(crate) const IN_PROGRESS_LEN: usize = 61;
/// An in-progress record written before fences: a header and the lease deadline. It still
/// reads, as fence 0.
pub(crate) const IN_PROGRESS_V1_LEN: usize = 45;

/// Whether `len` is the length of an in-progress record, of either layout.
pub(crate) fn is_in_progress_len(len: usize) -> bool {
    len == IN_PROGRESS_LEN || len == IN_PROGRESS_V1_LEN
}
pub(crate) const COMPLETED: u8 = b'C';
pub(crate) const IN_PROGRESS: u8 = b'P';

/// The Redis key of a record: the prefix, then the idem key with `%`, `{` and `}`
/// percent-encoded.
///
/// Escaping those three keeps the mapping one-to-one (so distinct keys stay distinct) and
/// means a caller-chosen id can never form a Redis Cluster hash tag: only the prefix can
/// pin records to one slot. Every other byte (spaces, `*`, `:`, newlines, unicode) is kept
/// as is; Redis keys are binary-safe and scripts never treat a key as a pattern.
pub(crate) fn record_key(prefix: &str, key: &Key) -> String {
    let key = key.as_str();
    let mut out = String::with_capacity(prefix.len() + key.len() + 8);
    out.push_str(prefix);
    if !key.bytes().any(|b| matches!(b, b'%' | b'{' | b'}')) {
        out.push_str(key);
        return out;
    }
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    out
}

/// The token as the scripts store and compare it: 8 bytes, big-endian.
pub(crate) fn token_bytes(token: Token) -> [u8; 8] {
    token.get().to_be_bytes()
}

/// The longest duration handed to Redis, in ms (about 3,170 years): keeps `now + lease`
/// within the 15 digits of a lease deadline and every `PX` within what Redis accepts.
const MAX_MS: u64 = 100_000_000_000_000;

/// The claim script's one argument: token, fingerprint, then the lease and the recovery
/// window in ms as 15 ASCII digits each (54 bytes), then the epoch to compare the epoch
/// key with, if any.
pub(crate) fn claim_request(
    token: Token,
    fingerprint: &Fingerprint,
    lease: Duration,
    recovery: Duration,
    epoch: Option<&str>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(54 + epoch.map_or(0, str::len));
    out.extend_from_slice(&token_bytes(token));
    out.extend_from_slice(fingerprint.as_bytes());
    let recovery = u64::try_from(recovery.as_millis())
        .unwrap_or(MAX_MS)
        .min(MAX_MS);
    for ms in [millis(lease), recovery] {
        out.extend_from_slice(&digits15(ms));
    }
    if let Some(epoch) = epoch {
        out.extend_from_slice(epoch.as_bytes());
    }
    out
}

/// `ms` (below 10^15; [`MAX_MS`] is) as 15 ASCII digits, zero-padded: what
/// `format!("{ms:015}")` writes, without the formatter and a `String` for each of the
/// claim's two durations on every claim.
fn digits15(mut ms: u64) -> [u8; 15] {
    debug_assert!(ms < 1_000_000_000_000_000, "{ms} has more than 15 digits");
    let mut out = [b'0'; 15];
    for digit in out.iter_mut().rev() {
        *digit = b'0' + (ms % 10) as u8;
        ms /= 10;
    }
    out
}

/// A Redis duration argument in whole milliseconds, at least 1 (a zero `PX` is an error)
/// and at most [`MAX_MS`].
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis())
        .unwrap_or(MAX_MS)
        .clamp(1, MAX_MS)
}

/// The reply of the claim script.
pub(crate) fn claim_reply(reply: Value, token: Token) -> Result<Claim, StoreError> {
    match reply {
        // `{recovered, fence}`: told from `{record, ms_left}` by its first element's type.
        Value::Array(parts) if matches!(parts.first(), Some(Value::Int(_))) => {
            match <[Value; 2]>::try_from(parts) {
                Ok([Value::Int(recovered), Value::Int(fence)]) if fence >= 0 => {
                    Ok(Claim::Acquired {
                        token,
                        recovered: recovered == 1,
                        fence: Fence::from_u64(fence as u64),
                    })
                }
                Ok(parts) => Err(unexpected("claim", &Value::Array(parts.into()))),
                Err(parts) => Err(unexpected("claim", &Value::Array(parts))),
            }
        }
        Value::BulkString(value) => {
            let (fingerprint, payload) = completed(value)?;
            Ok(Claim::Completed {
                fingerprint,
                payload,
            })
        }
        Value::Array(parts) => {
            let (fingerprint, _, left) = in_progress(parts)?;
            Ok(Claim::InProgress {
                fingerprint,
                retry_after: left,
            })
        }
        other => Err(unexpected("claim", &other)),
    }
}

/// Whether the claim script answered that the epoch key is missing or another than the
/// epoch it was given (and wrote nothing).
pub(crate) fn epoch_changed(reply: &Value) -> bool {
    *reply == Value::Int(0)
}

/// The reply of the get script.
pub(crate) fn get_reply(reply: Value) -> Result<Option<Record>, StoreError> {
    match reply {
        Value::Nil => Ok(None),
        Value::BulkString(value) => {
            let (fingerprint, payload) = completed(value)?;
            Ok(Some(Record::Completed {
                fingerprint,
                payload,
            }))
        }
        Value::Array(parts) => {
            let (fingerprint, token, lease_remaining) = in_progress(parts)?;
            Ok(Some(Record::InProgress {
                fingerprint,
                token,
                lease_remaining,
            }))
        }
        other => Err(unexpected("get", &other)),
    }
}

/// The reply of complete, release and extend: `1` done, `0` fenced, `-1` not a record.
pub(crate) fn held_reply(step: &'static str, reply: Value) -> Result<(), StoreError> {
    match reply {
        Value::Int(1) => Ok(()),
        Value::Int(0) => Err(StoreError::Fenced),
        Value::Int(-1) => Err(StoreError::Corrupt {
            backend: BACKEND,
            reason: "the value under the key is not an idem record".into(),
        }),
        other => Err(unexpected(step, &other)),
    }
}

/// The reply of the replace script: `1` replaced (or deleted), `0` left as it was, `-1`
/// not an idem record.
pub(crate) fn replace_reply(reply: Value) -> Result<bool, StoreError> {
    match reply {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        Value::Int(-1) => Err(StoreError::Corrupt {
            backend: BACKEND,
            reason: "the value under the key is not an idem record".into(),
        }),
        other => Err(unexpected("replace", &other)),
    }
}

/// The reply of the delete script: `1` when something live was deleted.
pub(crate) fn delete_reply(reply: Value) -> Result<bool, StoreError> {
    match reply {
        Value::Int(n) => Ok(n == 1),
        other => Err(unexpected("delete", &other)),
    }
}

/// A completed record: its fingerprint and payload (a zero-copy slice of the value).
fn completed(value: Vec<u8>) -> Result<(Fingerprint, Bytes), StoreError> {
    if value.len() < HEADER_LEN || !value.starts_with(MAGIC) || value[5] != COMPLETED {
        return Err(not_a_record(&value));
    }
    let fingerprint = Fingerprint::from_slice(&value[14..30]).expect("16 bytes");
    Ok((fingerprint, Bytes::from(value).slice(HEADER_LEN..)))
}

/// A live in-progress record `{record, ms_left}`: fingerprint, token and lease left.
fn in_progress(parts: Vec<Value>) -> Result<(Fingerprint, Token, Duration), StoreError> {
    let (value, left) = match <[Value; 2]>::try_from(parts) {
        Ok([Value::BulkString(value), Value::Int(left)]) => (value, left),
        Ok(parts) => return Err(unexpected("in-progress", &Value::Array(parts.into()))),
        Err(parts) => return Err(unexpected("in-progress", &Value::Array(parts))),
    };
    if !is_in_progress_len(value.len()) || !value.starts_with(MAGIC) || value[5] != IN_PROGRESS {
        return Err(not_a_record(&value));
    }
    let token = Token::from_u64(u64::from_be_bytes(
        value[6..14].try_into().expect("8 bytes"),
    ));
    let fingerprint = Fingerprint::from_slice(&value[14..30]).expect("16 bytes");
    let left = Duration::from_millis(u64::try_from(left).unwrap_or(0));
    Ok((fingerprint, token, left))
}

pub(crate) fn not_a_record(value: &[u8]) -> StoreError {
    const SHOWN: usize = 24;
    let shown = &value[..value.len().min(SHOWN)];
    let more = if value.len() > SHOWN { "..." } else { "" };
    StoreError::Corrupt {
        backend: BACKEND,
        reason: format!(
            "found a {}-byte string \"{}{more}\", which does not have the idem record header",
            value.len(),
            shown.escape_ascii()
        ),
    }
}

fn unexpected(step: &str, reply: &Value) -> StoreError {
    StoreError::Backend {
        backend: BACKEND,
        source: Box::new(UnexpectedReply(format!(
            "the {step} script answered {reply:?}"
        ))),
    }
}

/// A script answered something it never sends: a server that runs other scripts under our
/// scripts' SHA1, or a proxy in between that rewrites replies.
#[derive(Debug)]
pub(crate) struct UnexpectedReply(String);

impl fmt::Display for UnexpectedReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unexpected reply from Redis: {}", self.0)
    }
}

impl std::error::Error for UnexpectedReply {}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> Key {
        Key::new("s", id).unwrap()
    }

    #[test]
    fn record_keys_are_one_to_one_and_never_hash_tags() {
        let ids = [
            "{a}", "%7Ba}", "%7Ba%7D", "a%", "a%25", "{", "}", "%", "a b", "a\nb",
        ];
        let keys: Vec<String> = ids.iter().map(|id| record_key("idem:", &key(id))).collect();
        for (i, a) in keys.iter().enumerate() {
            assert!(!a.contains('{') && !a.contains('}'), "{a:?} holds a brace");
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(record_key("idem:", &key("{a}")), "idem:s/%7Ba%7D");
        assert_eq!(record_key("p:", &key("a b*:")), "p:s/a b*:");
    }

    #[test]
    fn completed_value_decodes_and_garbage_is_corrupt() {
        let mut v = b"idem1C".to_vec();
        v.extend_from_slice(&7u64.to_be_bytes());
        v.extend_from_slice(&[9; 16]);
        v.extend_from_slice(b"payload");
        match claim_reply(Value::BulkString(v), Token::from_u64(1)).unwrap() {
            Claim::Completed {
                fingerprint,
                payload,
            } => {
                assert_eq!(fingerprint, Fingerprint::from_bytes([9; 16]));
                assert_eq!(&payload[..], b"payload");
            }
            other => panic!("{other:?}"),
        }
        for garbage in [
            &b"hello"[..],
            b"idem1C-too-short",
            b"idem2C0123456789012345678901234567",
        ] {
            let err =
                claim_reply(Value::BulkString(garbage.to_vec()), Token::from_u64(1)).unwrap_err();
            assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
        }
    }

    /// An in-progress record as builds before fences wrote it (45 bytes): it still reads.
    #[test]
    fn in_progress_value_decodes() {
        let mut v = b"idem1P".to_vec();
        v.extend_from_slice(&0xdead_beef_u64.to_be_bytes());
        v.extend_from_slice(&[3; 16]);
        v.extend_from_slice(b"001795944320318");
        let reply = Value::Array(vec![Value::BulkString(v), Value::Int(1500)]);
        match get_reply(reply).unwrap() {
            Some(Record::InProgress {
                fingerprint,
                token,
                lease_remaining,
            }) => {
                assert_eq!(fingerprint, Fingerprint::from_bytes([3; 16]));
                assert_eq!(token, Token::from_u64(0xdead_beef));
                assert_eq!(lease_remaining, Duration::from_millis(1500));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn in_progress_value_with_a_fence_decodes() {
        let mut v = b"idem1P".to_vec();
        v.extend_from_slice(&0xdead_beef_u64.to_be_bytes());
        v.extend_from_slice(&[3; 16]);
        v.extend_from_slice(b"001795944320318");
        v.extend_from_slice(b"1795944320318123");
        assert_eq!(v.len(), IN_PROGRESS_LEN);
        let reply = Value::Array(vec![Value::BulkString(v), Value::Int(1500)]);
        match get_reply(reply).unwrap() {
            Some(Record::InProgress { token, .. }) => {
                assert_eq!(token, Token::from_u64(0xdead_beef))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_acquired_claim_answers_its_fence() {
        let reply = Value::Array(vec![Value::Int(1), Value::Int(1_795_944_320_318_123)]);
        match claim_reply(reply, Token::from_u64(5)).unwrap() {
            Claim::Acquired {
                token,
                recovered,
                fence,
            } => {
                assert_eq!(token, Token::from_u64(5));
                assert!(recovered);
                assert_eq!(fence, Fence::from_u64(1_795_944_320_318_123));
            }
            other => panic!("{other:?}"),
        }
        for bad in [
            vec![Value::Int(0)],
            vec![Value::Int(0), Value::Int(-1)],
            vec![Value::Int(0), Value::Nil],
        ] {
            let err = claim_reply(Value::Array(bad), Token::from_u64(5)).unwrap_err();
            assert!(matches!(err, StoreError::Backend { .. }), "{err:?}");
        }
    }

    #[test]
    fn held_statuses() {
        assert!(held_reply("complete", Value::Int(1)).is_ok());
        assert!(matches!(
            held_reply("complete", Value::Int(0)),
            Err(StoreError::Fenced)
        ));
        assert!(matches!(
            held_reply("complete", Value::Int(-1)),
            Err(StoreError::Corrupt { .. })
        ));
        assert!(matches!(
            held_reply("complete", Value::Okay),
            Err(StoreError::Backend { .. })
        ));
    }

    #[test]
    fn millis_never_zero_nor_past_the_deadline_digits() {
        assert_eq!(millis(Duration::from_micros(10)), 1);
        assert_eq!(millis(Duration::from_secs(2)), 2000);
        assert_eq!(millis(Duration::MAX), MAX_MS);
    }

    #[test]
    fn fifteen_digits_are_what_the_formatter_writes() {
        for ms in [
            0,
            1,
            9,
            10,
            30_000,
            999_999_999_999_999,
            MAX_MS - 1,
            123_456_789_012_345,
        ] {
            assert_eq!(
                digits15(ms).as_slice(),
                format!("{ms:015}").as_bytes(),
                "{ms}"
            );
        }
    }

    #[test]
    fn claim_request_is_54_bytes_then_the_epoch() {
        let r = claim_request(
            Token::from_u64(0x0102),
            &Fingerprint::from_bytes([7; 16]),
            Duration::from_secs(30),
            Duration::ZERO,
            None,
        );
        assert_eq!(r.len(), 54);
        assert_eq!(&r[..8], &[0, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(&r[8..24], &[7; 16]);
        assert_eq!(&r[24..], b"000000000030000000000000000000");
        assert_eq!(
            claim_request(
                Token::from_u64(1),
                &Fingerprint::NONE,
                Duration::MAX,
                Duration::MAX,
                None,
            )
            .len(),
            54
        );
        let with_epoch = claim_request(
            Token::from_u64(0x0102),
            &Fingerprint::from_bytes([7; 16]),
            Duration::from_secs(30),
            Duration::ZERO,
            Some("0123456789abcdef0123456789abcdef"),
        );
        assert_eq!(&with_epoch[..54], &r[..]);
        assert_eq!(&with_epoch[54..], b"0123456789abcdef0123456789abcdef");
    }
}
