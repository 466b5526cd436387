//! Codecs turn results into bytes and back. JSON is the default.
//!
//! A stored result outlives deploys (24 hours by default). JSON is self-describing, so a
//! result written by yesterday's type decodes into today's when the change is compatible (a
//! new `#[serde(default)]` field) and is refused with [`Error::Decode`](crate::Error::Decode)
//! when it is not. `Postcard` (feature `postcard`) and `Bincode` (feature `bincode`) are compact but not self-describing: with
//! them, a changed result type must change its `version` (`Call::version`, or `version = N` in
//! `#[idempotent]`).

use serde::{de::DeserializeOwned, Serialize};

use crate::error::BoxError;

/// Encodes and decodes stored results.
///
/// The id is written into every record envelope, so a record written by one codec is never
/// read by another. Ids 0 to 127 are idem's; a codec of your own takes an id from 128 up.
///
/// ```
/// use idem::codec::Codec;
///
/// /// JSON with pretty printing, under an id of our own.
/// struct PrettyJson;
///
/// impl Codec for PrettyJson {
///     fn id(&self) -> u8 { 200 }
///     fn name(&self) -> &'static str { "pretty-json" }
///     fn encode<T: serde::Serialize + ?Sized>(&self, value: &T) -> Result<Vec<u8>, idem::BoxError> {
///         Ok(serde_json::to_vec_pretty(value)?)
///     }
///     fn decode<T: serde::de::DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, idem::BoxError> {
///         Ok(serde_json::from_slice(bytes)?)
///     }
/// }
/// # let bytes = PrettyJson.encode(&vec![1, 2]).unwrap();
/// # assert_eq!(PrettyJson.decode::<Vec<i32>>(&bytes).unwrap(), vec![1, 2]);
/// ```
pub trait Codec: Send + Sync + 'static {
    /// The id written into each record envelope.
    fn id(&self) -> u8;
    /// A short name for messages.
    fn name(&self) -> &'static str;
    /// Encodes a value.
    fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<Vec<u8>, BoxError>;
    /// Decodes a value.
    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, BoxError>;
}

/// JSON through `serde_json`: the default codec.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl Codec for Json {
    fn id(&self) -> u8 {
        1
    }
    fn name(&self) -> &'static str {
        "json"
    }
    fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<Vec<u8>, BoxError> {
        Ok(serde_json::to_vec(value)?)
    }
    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, BoxError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

/// `postcard`: compact, with a stable documented wire format (feature `postcard`).
#[cfg(feature = "postcard")]
#[derive(Debug, Clone, Copy, Default)]
pub struct Postcard;

#[cfg(feature = "postcard")]
impl Codec for Postcard {
    fn id(&self) -> u8 {
        2
    }
    fn name(&self) -> &'static str {
        "postcard"
    }
    fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<Vec<u8>, BoxError> {
        Ok(postcard::to_stdvec(value)?)
    }
    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, BoxError> {
        Ok(postcard::from_bytes(bytes)?)
    }
}

/// `bincode` 2.x with its standard configuration (feature `bincode`). bincode's own
/// development has stopped; prefer [`Json`] or `Postcard`.
#[cfg(feature = "bincode")]
#[derive(Debug, Clone, Copy, Default)]
pub struct Bincode;

#[cfg(feature = "bincode")]
impl Codec for Bincode {
    fn id(&self) -> u8 {
        3
    }
    fn name(&self) -> &'static str {
        "bincode"
    }
    fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<Vec<u8>, BoxError> {
        Ok(bincode::serde::encode_to_vec(
            value,
            bincode::config::standard(),
        )?)
    }
    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, BoxError> {
        let (value, read) = bincode::serde::decode_from_slice(bytes, bincode::config::standard())?;
        if read != bytes.len() {
            return Err(format!("{} trailing bytes after the value", bytes.len() - read).into());
        }
        Ok(value)
    }
}

/// The codecs built into idem, chosen at run time: what `Idem::builder().codec(...)` takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuiltinCodec {
    /// [`Json`].
    #[default]
    Json,
    /// `Postcard` (feature `postcard`).
    #[cfg(feature = "postcard")]
    Postcard,
    /// `Bincode` (feature `bincode`).
    #[cfg(feature = "bincode")]
    Bincode,
}

impl Codec for BuiltinCodec {
    fn id(&self) -> u8 {
        match self {
            BuiltinCodec::Json => Json.id(),
            #[cfg(feature = "postcard")]
            BuiltinCodec::Postcard => Postcard.id(),
            #[cfg(feature = "bincode")]
            BuiltinCodec::Bincode => Bincode.id(),
        }
    }
    fn name(&self) -> &'static str {
        match self {
            BuiltinCodec::Json => Json.name(),
            #[cfg(feature = "postcard")]
            BuiltinCodec::Postcard => Postcard.name(),
            #[cfg(feature = "bincode")]
            BuiltinCodec::Bincode => Bincode.name(),
        }
    }
    fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<Vec<u8>, BoxError> {
        match self {
            BuiltinCodec::Json => Json.encode(value),
            #[cfg(feature = "postcard")]
            BuiltinCodec::Postcard => Postcard.encode(value),
            #[cfg(feature = "bincode")]
            BuiltinCodec::Bincode => Bincode.encode(value),
        }
    }
    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, BoxError> {
        match self {
            BuiltinCodec::Json => Json.decode(bytes),
            #[cfg(feature = "postcard")]
            BuiltinCodec::Postcard => Postcard.decode(bytes),
            #[cfg(feature = "bincode")]
            BuiltinCodec::Bincode => Bincode.decode(bytes),
        }
    }
}
