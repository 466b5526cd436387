//! The record envelope: what the engine wraps around an encoded result before a store
//! keeps it as opaque bytes.
//!
//! ```text
//! offset 0  4 bytes  magic "idem"
//!        4  1 byte   format version (1)
//!        5  1 byte   codec id
//!        6  1 byte   kind: 0 = the function's value, 1 = a cached error
//!        7  8 bytes  type tag: the first 8 bytes of blake3(type name), little endian
//!       15  ...      the codec's payload
//! ```

use serde::{de::DeserializeOwned, Serialize};

use crate::codec::Codec;
use crate::error::{BoxError, DecodeError};

const MAGIC: &[u8; 4] = b"idem";
/// The envelope format this build writes and reads.
pub const FORMAT_VERSION: u8 = 1;
const HEADER: usize = 15;

/// What a record holds: the function's value or an error it chose to cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Value = 0,
    Error = 1,
}

/// A short, stable tag of a type's name, so that a record of one type is not read as another.
pub(crate) fn type_tag<T: ?Sized>() -> u64 {
    let hash = blake3::hash(std::any::type_name::<T>().as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&hash.as_bytes()[..8]);
    u64::from_le_bytes(b)
}

pub(crate) fn seal<C: Codec, T: Serialize + ?Sized>(
    codec: &C,
    kind: Kind,
    value: &T,
) -> Result<Vec<u8>, BoxError> {
    let payload = codec.encode(value)?;
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.push(FORMAT_VERSION);
    out.push(codec.id());
    out.push(kind as u8);
    out.extend_from_slice(&type_tag::<T>().to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Reads the header and returns the kind and the payload.
pub(crate) fn open<'a, C: Codec>(
    codec: &C,
    bytes: &'a [u8],
) -> Result<(Kind, u64, &'a [u8]), DecodeError> {
    if bytes.len() < HEADER || &bytes[..4] != MAGIC {
        return Err(DecodeError::NotAnEnvelope);
    }
    if bytes[4] != FORMAT_VERSION {
        return Err(DecodeError::Version {
            found: bytes[4],
            expected: FORMAT_VERSION,
        });
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
        _ => return Err(DecodeError::NotAnEnvelope),
    };
    let mut tag = [0u8; 8];
    tag.copy_from_slice(&bytes[7..15]);
    Ok((kind, u64::from_le_bytes(tag), &bytes[HEADER..]))
}

pub(crate) fn decode_payload<C: Codec, T: DeserializeOwned>(
    codec: &C,
    tag: u64,
    payload: &[u8],
) -> Result<T, DecodeError> {
    if tag != type_tag::<T>() {
        return Err(DecodeError::Type {
            expected: std::any::type_name::<T>(),
        });
    }
    codec
        .decode(payload)
        .map_err(|source| DecodeError::Payload {
            codec: codec.name(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Json;

    #[test]
    fn round_trip_and_refusals() {
        let sealed = seal(&Json, Kind::Value, &vec![1u32, 2]).unwrap();
        let (kind, tag, payload) = open(&Json, &sealed).unwrap();
        assert_eq!(kind, Kind::Value);
        let back: Vec<u32> = decode_payload(&Json, tag, payload).unwrap();
        assert_eq!(back, vec![1, 2]);
        // Another type with the same JSON shape is refused by the type tag.
        let err = decode_payload::<_, Vec<u64>>(&Json, tag, payload).unwrap_err();
        assert!(matches!(err, DecodeError::Type { .. }), "{err:?}");
        // Garbage and truncation.
        assert!(matches!(
            open(&Json, b"{\"a\":1}"),
            Err(DecodeError::NotAnEnvelope)
        ));
        assert!(matches!(
            open(&Json, &sealed[..10]),
            Err(DecodeError::NotAnEnvelope)
        ));
        let mut newer = sealed.clone();
        newer[4] = 9;
        assert!(matches!(
            open(&Json, &newer),
            Err(DecodeError::Version { found: 9, .. })
        ));
        let mut other_codec = sealed;
        other_codec[5] = 77;
        assert!(matches!(
            open(&Json, &other_codec),
            Err(DecodeError::Codec { found: 77, .. })
        ));
    }
}
