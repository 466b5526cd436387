//! What a request's payload is, to the store: a [`Fingerprint`] kept with its record.

use std::fmt;

use serde::Serialize;

use crate::digest;

/// A 128-bit digest of a request's payload. The same key with a different fingerprint is
/// refused ([`Error::KeyReuse`](crate::Error::KeyReuse)). [`Fingerprint::NONE`] turns the
/// check off: it matches every fingerprint.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub(crate) [u8; 16]);

impl Fingerprint {
    /// No fingerprint: matches any other.
    pub const NONE: Fingerprint = Fingerprint([0; 16]);

    /// The fingerprint of a value, through the same fixed encoding as key digests (but a
    /// different blake3 context, so the two never coincide).
    pub fn of<T: Serialize + ?Sized>(value: &T) -> Fingerprint {
        Fingerprint::reserved(digest::fingerprint_bytes(value))
    }

    /// The fingerprint of the value whose canonical encoding is `encoding`: the same as
    /// [`of`](Fingerprint::of) that value.
    pub(crate) fn of_encoding(encoding: &[u8]) -> Fingerprint {
        Fingerprint::reserved(digest::fingerprint_of_encoding(encoding))
    }

    fn reserved(mut bytes: [u8; 16]) -> Fingerprint {
        if bytes == [0; 16] {
            // Keep NONE reserved; a real digest of zero has odds of 2^-128.
            bytes[15] = 1;
        }
        Fingerprint(bytes)
    }

    /// Whether a request with this fingerprint may use a record with `other`.
    pub fn matches(&self, other: &Fingerprint) -> bool {
        *self == Fingerprint::NONE || *other == Fingerprint::NONE || self == other
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The fingerprint a store kept as `bytes` (what [`as_bytes`](Fingerprint::as_bytes)
    /// gave it; sixteen zeros are [`Fingerprint::NONE`]).
    pub const fn from_bytes(bytes: [u8; 16]) -> Fingerprint {
        Fingerprint(bytes)
    }

    /// Builds a fingerprint from 16 bytes read back from a store.
    pub fn from_slice(bytes: &[u8]) -> Option<Fingerprint> {
        <[u8; 16]>::try_from(bytes).ok().map(Fingerprint)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Fingerprint(")?;
        for b in &self.0[..6] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_of_an_encoding_is_the_fingerprint_of_its_value() {
        #[derive(serde::Serialize)]
        struct Charge<'a> {
            order_id: &'a str,
            amount_cents: u64,
            tags: Vec<&'a str>,
        }
        let charge = Charge {
            order_id: "o-1",
            amount_cents: 1250,
            tags: vec!["a", "b"],
        };
        let values: [&dyn erased::Value; 4] = [&("order", 42u32), &charge, &(), &Some(-0.0f64)];
        for value in values {
            let encoding = value.encoding();
            assert_eq!(Fingerprint::of_encoding(&encoding), value.fingerprint());
        }
        // An encoding longer than asked for is not kept.
        assert!(crate::digest::encoding(&charge, 8).is_none());
    }

    /// Values of several types behind one trait, for the test above.
    mod erased {
        use super::Fingerprint;
        pub trait Value {
            fn encoding(&self) -> Box<[u8]>;
            fn fingerprint(&self) -> Fingerprint;
        }
        impl<T: serde::Serialize> Value for T {
            fn encoding(&self) -> Box<[u8]> {
                crate::digest::encoding(self, usize::MAX).expect("encodes")
            }
            fn fingerprint(&self) -> Fingerprint {
                Fingerprint::of(self)
            }
        }
    }
}
