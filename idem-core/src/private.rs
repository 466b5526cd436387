//! Items that `#[idempotent]` expands to. Not a public API: names and signatures change
//! without notice.
//!
//! Two kinds of items live here. Probes pick, at compile time and without specialization,
//! how a value becomes part of a key (autoref specialization: method resolution tries the
//! receiver by value, then by reference, then dereferenced, and takes the first impl whose
//! bounds hold). Assertions are empty functions whose bounds carry a
//! `#[diagnostic::on_unimplemented]` message, so that a type that cannot be stored or
//! digested is reported once, in words about idem, at the user's own token.

use std::borrow::Cow;
use std::future::Future;
use std::time::Duration;

use serde::{de::DeserializeOwned, Serialize};

pub use crate::engine::{RequestPrint, Share, ValueEq, ValueOps};
pub use crate::{Call, Error, Fingerprint, Idem, InProgress, Key, MissingKey};

use crate::codec::Codec;
use crate::key::ReadableKeyId;
use crate::outcome::Answer;

// ---------------------------------------------------------------------------------------
// Key ids.

/// Holds a reference to a key expression; method resolution on `(&&&&KeyIdProbe(&expr))`
/// then picks, first match wins:
/// 1. an `Option` of a string or integer ([`ViaOptionalReadable`]): its id, or no key;
/// 2. an `Option` of any other `Serialize` value ([`ViaOptionalDigest`]): its digest, or no key;
/// 3. a string or integer ([`ViaReadable`]): the readable id;
/// 4. any other `Serialize` value ([`ViaDigest`]): a 128-bit digest;
/// 5. anything else ([`ViaNothing`]), which only exists so that the one error about the key
///    comes from [`assert_key`].
///
/// A key that is `None` is a missing key (`Ok(None)`), never the digest of `None`: requests
/// without an id must not share one key.
pub struct KeyIdProbe<'a, T: ?Sized>(pub &'a T);

/// An `Option` used as a key, seen through any number of references.
pub trait OptionalKey {
    /// What the option holds.
    type Inner: ?Sized;
    /// The value, if there is one.
    fn inner(&self) -> Option<&Self::Inner>;
}

impl<U> OptionalKey for Option<U> {
    type Inner = U;
    fn inner(&self) -> Option<&U> {
        self.as_ref()
    }
}

impl<O: OptionalKey + ?Sized> OptionalKey for &O {
    type Inner = O::Inner;
    fn inner(&self) -> Option<&O::Inner> {
        (**self).inner()
    }
}

/// Chosen first: an optional string or integer.
pub trait ViaOptionalReadable {
    /// The key id, none, or why the value could not be digested.
    fn __idem_key_id(&self) -> Result<Option<Cow<'_, str>>, String>;
}

impl<O> ViaOptionalReadable for &&&KeyIdProbe<'_, O>
where
    O: OptionalKey + ?Sized,
    O::Inner: ReadableKeyId,
{
    fn __idem_key_id(&self) -> Result<Option<Cow<'_, str>>, String> {
        Ok(self.0.inner().map(|id| id.key_id()))
    }
}

/// Chosen second: an optional value of another `Serialize` type.
pub trait ViaOptionalDigest {
    /// The key id, none, or why the value could not be digested.
    fn __idem_key_id(&self) -> Result<Option<Cow<'_, str>>, String>;
}

impl<O> ViaOptionalDigest for &&&&KeyIdProbe<'_, O>
where
    O: OptionalKey + ?Sized,
    O::Inner: Serialize,
{
    fn __idem_key_id(&self) -> Result<Option<Cow<'_, str>>, String> {
        self.0
            .inner()
            .map(|v| crate::digest::try_digest_hex(v).map(Cow::Owned))
            .transpose()
    }
}

/// Chosen for strings and integers: they stay readable.
pub trait ViaReadable {
    /// The key id.
    fn __idem_key_id(&self) -> Result<Option<Cow<'_, str>>, String>;
}

impl<T: ReadableKeyId + ?Sized> ViaReadable for &&KeyIdProbe<'_, T> {
    fn __idem_key_id(&self) -> Result<Option<Cow<'_, str>>, String> {
        Ok(Some(self.0.key_id()))
    }
}

/// Chosen when the value is not a string, an integer or an `Option`: a 128-bit digest.
pub trait ViaDigest {
    /// The key id, or why the value could not be digested.
    fn __idem_key_id(&self) -> Result<Option<Cow<'_, str>>, String>;
}

impl<T: Serialize + ?Sized> ViaDigest for &KeyIdProbe<'_, T> {
    fn __idem_key_id(&self) -> Result<Option<Cow<'_, str>>, String> {
        crate::digest::try_digest_hex(self.0).map(|id| Some(Cow::Owned(id)))
    }
}

/// Chosen when the value is not `Serialize`. The expansion also calls [`assert_key`] on the
/// same value, which fails to compile in that case, so this never runs.
pub trait ViaNothing {
    /// The key id.
    fn __idem_key_id(&self) -> Result<Option<Cow<'_, str>>, String>;
}

impl<T: ?Sized> ViaNothing for KeyIdProbe<'_, T> {
    fn __idem_key_id(&self) -> Result<Option<Cow<'_, str>>, String> {
        Ok(None)
    }
}

/// A key with a readable or digested id: what `key = <expr>` expands to.
pub fn key(scope: &str, id: Result<Option<Cow<'_, str>>, String>) -> Result<Key, Error> {
    Key::from_id_result(scope, id)
}

/// A key whose id is the digest of the arguments: what a function without `key` uses.
pub fn digest_key<T: Serialize + ?Sized>(scope: &str, args: &T) -> Result<Key, Error> {
    Key::digest(scope, args)
}

// ---------------------------------------------------------------------------------------
// Arguments.

/// Holds a reference to an argument; `(&ArgProbe(&arg)).__idem_arg()` is the argument
/// itself when it is `Serialize` ([`ArgSerialize`]), and a placeholder otherwise
/// ([`ArgPlaceholder`]), so that the tuple of arguments always compiles and the one error
/// about the argument comes from [`assert_arg`].
pub struct ArgProbe<'a, T: ?Sized>(pub &'a T);

/// Chosen when the argument is `Serialize`.
pub trait ArgSerialize<'a> {
    /// What is digested.
    type Digested: ?Sized + Serialize;
    /// The argument.
    fn __idem_arg(&self) -> &'a Self::Digested;
}

impl<'a, T: Serialize + ?Sized> ArgSerialize<'a> for ArgProbe<'a, T> {
    type Digested = T;
    fn __idem_arg(&self) -> &'a T {
        self.0
    }
}

/// Stands for an argument that is not `Serialize`; never digested, since the crate does
/// not compile in that case.
#[derive(Serialize)]
pub struct NotSerialize;

/// Chosen when the argument is not `Serialize`.
pub trait ArgPlaceholder<'a> {
    /// What is digested.
    type Digested: ?Sized + Serialize;
    /// The placeholder.
    fn __idem_arg(&self) -> &'a Self::Digested;
}

impl<'a, T: ?Sized> ArgPlaceholder<'a> for &ArgProbe<'a, T> {
    type Digested = NotSerialize;
    fn __idem_arg(&self) -> &'a NotSerialize {
        &NotSerialize
    }
}

/// What `fingerprint = <expr>` accepts: a `Fingerprint` as is, or any `Serialize` value,
/// which is digested.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a fingerprint",
    label = "a fingerprint is an `idem::Fingerprint` or a `Serialize` value to digest",
    note = "derive `serde::Serialize` for `{Self}`, or fingerprint the fields that tell one request from another"
)]
pub trait FingerprintValue {
    /// The fingerprint.
    fn fingerprint(&self) -> Fingerprint;
}

impl<T: Serialize + ?Sized> FingerprintValue for T {
    fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of(self)
    }
}

impl FingerprintValue for Fingerprint {
    fn fingerprint(&self) -> Fingerprint {
        *self
    }
}

/// What a call with the default fingerprint holds of its arguments: their encoding when
/// the engine has a local cache and the encoding is at most [`MAX_KEPT_ENCODING`] bytes (a
/// hit then compares encodings, unhashed), their fingerprint otherwise.
pub fn request_print<T: Serialize + ?Sized>(engine: &Idem, args: &T) -> RequestPrint {
    if engine.has_local_cache() {
        if let Some(encoding) = crate::digest::encoding(args, MAX_KEPT_ENCODING) {
            return RequestPrint::Encoded(encoding);
        }
    }
    RequestPrint::Fingerprint(Fingerprint::of(args))
}

/// The largest argument encoding a local-cache entry keeps beside its fingerprint: the
/// cache's capacity counts entries, not bytes, so larger payloads are kept as their 16-byte
/// fingerprint and a hit hashes them.
pub const MAX_KEPT_ENCODING: usize = 1024;

/// The call of an `#[idempotent]` function.
pub fn call(engine: &Idem, key: Result<Key, Error>, print: impl Into<RequestPrint>) -> Call<'_> {
    engine.call_print(key, print.into())
}

/// The fingerprint of a `fingerprint = <expr>` value.
pub fn fingerprint_of<T: FingerprintValue + ?Sized>(value: &T) -> Fingerprint {
    value.fingerprint()
}

// ---------------------------------------------------------------------------------------
// Engines, options.

/// What `store = <expr>` accepts: an `Idem`, or a reference or pointer to one (`&`,
/// `&mut`, `Arc`, `Rc`, `Box`, through any number of them). Listed rather than any `Deref`,
/// so that a bare store, even behind an `Arc<dyn Store>`, is reported with the message
/// below rather than as a missing `Deref`; another smart pointer is passed as `&*ptr`.
#[diagnostic::on_unimplemented(
    message = "`store = ...` takes an `idem::Idem` (the engine), not `{Self}`",
    label = "not an `idem::Idem`, nor a reference or pointer to one",
    note = "build the engine on the store once, `idem::Idem::new(store)` or `idem::Idem::builder().store(store)...build()`, keep it (in the struct, say) and name it: `store = self.idem`"
)]
pub trait EngineRef {
    /// The engine.
    fn engine_ref(&self) -> &Idem;
}

impl EngineRef for Idem {
    fn engine_ref(&self) -> &Idem {
        self
    }
}

macro_rules! engine_through {
    ($($ptr:ty),*) => {$(
        impl<T: EngineRef + ?Sized> EngineRef for $ptr {
            fn engine_ref(&self) -> &Idem {
                (**self).engine_ref()
            }
        }
    )*};
}
engine_through!(&T, &mut T, std::sync::Arc<T>, std::rc::Rc<T>, Box<T>);

/// The backend of the first engine this process built on a store other than memory, if
/// any: `#[idempotent]` fns on the implicit in-process engine are refused once there is one.
pub fn shared_backend_in_use() -> Option<&'static str> {
    crate::engine::SHARED_BACKEND.get().copied()
}

/// The engine of `store = <expr>`. Cloned (one `Arc` increment) so that the expression may
/// borrow `self` while the body takes `self` by value.
pub fn engine<E: EngineRef + ?Sized>(idem: &E) -> Idem {
    idem.engine_ref().clone()
}

/// A duration literal (`"250ms"`, `"30s"`, `"5m"`, `"24h"`, `"7d"`), already checked and
/// converted to milliseconds by the macro.
pub const fn duration_ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// A duration option given as an expression: a `Duration`, or anything that converts.
pub fn into_duration(d: impl Into<Duration>) -> Duration {
    d.into()
}

/// `cache_errors` without a predicate: every `Err` is stored and replayed.
pub fn cache_every_error<E>(_: &E) -> bool {
    true
}

/// The parts of a `Result`, for return types spelled through an alias (`io::Result<T>`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is named like a `Result` but is not one",
    label = "#[idempotent] treats a return type whose name ends in `Result` as a `Result<T, E>`",
    note = "return `Result<{Self}, idem::Error>` and unwrap it, or rename the type"
)]
pub trait Fallible {
    /// The success type.
    type Ok;
    /// The error type.
    type Err;
}

impl<T, E> Fallible for Result<T, E> {
    type Ok = T;
    type Err = E;
}

// ---------------------------------------------------------------------------------------
// Bounds with messages. Each trait is a blanket impl over the real bounds; rustc reports the
// message of the trait named in the bound, at the token that names the type.

/// A value usable as a key: strings, integers, or any `Serialize` value.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be an idempotency key",
    label = "this key is not a string, an integer or a `Serialize` value",
    note = "a key is a string or an integer (kept readable) or any `serde::Serialize` value (digested): derive `Serialize` for `{Self}`, or key on one of its fields"
)]
pub trait KeyValue: Serialize {}
impl<T: Serialize + ?Sized> KeyValue for T {}

/// Fails to compile, at the key expression, unless the key can be a key.
pub fn assert_key<T: KeyValue + ?Sized>(_: &T) {}

/// An argument that is digested into the key and fingerprint.
#[diagnostic::on_unimplemented(
    message = "argument of type `{Self}` is not `Serialize`, so it cannot be part of the idempotency key and fingerprint",
    label = "not `Serialize`",
    note = "if this argument is not part of the request (a client, a connection, a context), leave it out with `#[idempotent(skip(<name>))]`",
    note = "otherwise derive `serde::Serialize` for `{Self}`"
)]
pub trait ArgValue: Serialize {}
impl<T: Serialize + ?Sized> ArgValue for T {}

/// Fails to compile, at the argument, unless it is `Serialize`.
pub fn assert_arg<T: ArgValue + ?Sized>(_: &T) {}

/// A value that is stored and replayed.
#[diagnostic::on_unimplemented(
    message = "the result type `{Self}` of an `#[idempotent]` fn must be `Serialize + DeserializeOwned`",
    label = "its value is stored, then decoded for every later call with the same key",
    note = "derive `serde::Serialize` and `serde::Deserialize` for `{Self}` (owned data only: no borrowed `&str` or `&[u8]` fields)"
)]
pub trait CachedValue: Serialize + DeserializeOwned {}
impl<T: Serialize + DeserializeOwned> CachedValue for T {}

/// The error type of a fallible `#[idempotent]` fn.
#[diagnostic::on_unimplemented(
    message = "the error type `{Self}` of an `#[idempotent]` fn must implement `From<idem::Error>`",
    label = "idem's own failures (store unreachable, key in progress, key reused) are returned as this type",
    note = "add a variant such as `#[error(transparent)] Idem(#[from] idem::Error)`, or return `idem::Error` itself"
)]
pub trait IdemErrorType: From<Error> {}
impl<E: From<Error>> IdemErrorType for E {}

/// The error type of a function with `cache_errors`.
#[diagnostic::on_unimplemented(
    message = "with `cache_errors`, the error type `{Self}` must be `Serialize + DeserializeOwned` and implement `From<idem::Error>`",
    label = "a cached error is stored, then decoded for every later call with the same key",
    note = "derive `serde::Serialize` and `serde::Deserialize` for `{Self}`, and convert `idem::Error` into it with a `From` impl"
)]
pub trait CachedErrorType: Serialize + DeserializeOwned + From<Error> {}
impl<E: Serialize + DeserializeOwned + From<Error>> CachedErrorType for E {}

// ---------------------------------------------------------------------------------------
// The engine call. The macro names the result and error types by the user's own tokens in
// the turbofish (`run::<Receipt, _, _, _>`), so a missing bound is reported at those
// tokens, once, with the messages above.

/// The `==` of a stored type, when it has one: `(&&EqProbe::<T>::NEW).__idem_eq()` picks
/// [`ViaPartialEq`] when `T: PartialEq`, and [`ViaNoEq`] otherwise. The engine then also
/// compares a result with its decoded copy by `==`, which sees what serde cannot (the
/// variant of an untagged enum).
pub struct EqProbe<T: ?Sized>(std::marker::PhantomData<fn(&T)>);

impl<T: ?Sized> EqProbe<T> {
    /// The probe.
    pub const NEW: EqProbe<T> = EqProbe(std::marker::PhantomData);
}

/// Chosen when the type has `==`.
pub trait ViaPartialEq<T> {
    /// `PartialEq::eq` of the type.
    fn __idem_eq(&self) -> ValueEq<T>;
}

impl<T: PartialEq> ViaPartialEq<T> for &EqProbe<T> {
    fn __idem_eq(&self) -> ValueEq<T> {
        Some(<T as PartialEq>::eq)
    }
}

/// Chosen when it has not.
pub trait ViaNoEq<T> {
    /// Nothing.
    fn __idem_eq(&self) -> ValueEq<T>;
}

impl<T> ViaNoEq<T> for EqProbe<T> {
    fn __idem_eq(&self) -> ValueEq<T> {
        None
    }
}

/// A result type kept decoded in the local cache (`clone_cached`).
#[diagnostic::on_unimplemented(
    message = "with `clone_cached`, the result type `{Self}` must be `Clone + Send + Sync + 'static`",
    label = "a local-cache hit answers a clone of the decoded value the cache keeps",
    note = "derive `Clone` for `{Self}`, or leave `clone_cached` out: a hit then decodes the cached bytes"
)]
pub trait SharedResult: Clone + Send + Sync + 'static {}
impl<T: Clone + Send + Sync + 'static> SharedResult for T {}

/// The sharing functions of a `clone_cached` result type.
pub fn share<T: SharedResult>() -> Option<Share<T>> {
    Some(Share::of())
}

/// [`Call::run`] for a function that returns a value `T` (or `Outcome<T>`, with
/// `R = WithOutcome`). A plain function that returns the engine's future, so that the call
/// adds no layer of its own.
pub fn run<'a, T, C, R, F, Fut>(
    call: Call<'a, C, R>,
    eq: ValueOps<T>,
    body: F,
) -> impl Future<Output = Result<R::Out<T>, Error>> + use<'a, T, C, R, F, Fut>
where
    T: CachedValue,
    C: Codec,
    R: Answer,
    F: FnOnce() -> Fut,
    Fut: Future<Output = T>,
{
    call.run_eq(eq, body)
}

/// [`Call::run_fallible`] for a function that returns `Result<T, E>`. The conversion of
/// idem's own errors into `E` is passed in (`error_from::<E>`, whose bound is checked at
/// the user's error type), so that this future's type carries no bound on `E`.
pub fn run_fallible<'a, T, E, C, R, F, Fut>(
    call: Call<'a, C, R>,
    eq: ValueOps<T>,
    from_idem: fn(Error) -> E,
    body: F,
) -> impl Future<Output = Result<R::Out<T>, E>> + use<'a, T, E, C, R, F, Fut>
where
    T: CachedValue,
    C: Codec,
    R: Answer,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    call.run_fallible_with(eq, from_idem, body)
}

/// `E::from` for idem's errors, with the bound that names what is missing.
pub fn error_from<E: IdemErrorType>(e: Error) -> E {
    E::from(e)
}

/// [`Call::run_caching_errors`] for a function with `cache_errors`.
pub fn run_caching_errors<'a, T, E, C, R, P, F, Fut>(
    call: Call<'a, C, R>,
    eq: (ValueOps<T>, ValueEq<E>),
    cache_if: P,
    body: F,
) -> impl Future<Output = Result<R::Out<T>, E>> + use<'a, T, E, C, R, P, F, Fut>
where
    T: CachedValue,
    E: CachedErrorType,
    C: Codec,
    R: Answer,
    P: Fn(&E) -> bool,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    call.run_caching_errors_eq(cache_if, eq, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    // The borrows are the point: they select the impl, as in the expansion.
    #[allow(clippy::needless_borrow)]
    #[test]
    fn probes_keep_strings_and_integers_readable_and_none_missing() {
        let id = |r: Result<Option<Cow<str>>, String>| r.unwrap().map(Cow::into_owned);
        let some = |s: &str| Some(s.to_string());
        assert_eq!(
            id((&&&&KeyIdProbe(&"order-42")).__idem_key_id()),
            some("order-42")
        );
        assert_eq!(
            id((&&&&KeyIdProbe(&String::from("a b"))).__idem_key_id()),
            some("a b")
        );
        assert_eq!(id((&&&&KeyIdProbe(&42u64)).__idem_key_id()), some("42"));
        assert_eq!(id((&&&&KeyIdProbe(&-7i32)).__idem_key_id()), some("-7"));
        let digest = id((&&&&KeyIdProbe(&("order", 42))).__idem_key_id()).unwrap();
        assert_eq!(digest, crate::digest_hex(&("order", 42)));
        assert_eq!(digest.len(), 32);
        // Options: the value inside, readable or digested; `None` is no key at all.
        let present: Option<String> = Some("o-1".into());
        assert_eq!(id((&&&&KeyIdProbe(&present)).__idem_key_id()), some("o-1"));
        assert_eq!(id((&&&&KeyIdProbe(&&present)).__idem_key_id()), some("o-1"));
        assert_eq!(
            id((&&&&KeyIdProbe(&present.as_deref())).__idem_key_id()),
            some("o-1")
        );
        assert_eq!(id((&&&&KeyIdProbe(&Some(7u32))).__idem_key_id()), some("7"));
        assert_eq!(
            id((&&&&KeyIdProbe(&Some(("order", 42)))).__idem_key_id()),
            Some(digest)
        );
        assert_eq!(id((&&&&KeyIdProbe(&None::<String>)).__idem_key_id()), None);
        assert_eq!(id((&&&&KeyIdProbe(&&None::<u64>)).__idem_key_id()), None);
        assert_eq!(
            id((&&&&KeyIdProbe(&None::<(u8, u8)>)).__idem_key_id()),
            None
        );
    }

    // The borrow is the point: it selects the impl, as in the expansion.
    #[allow(clippy::needless_borrow)]
    #[test]
    fn arg_probe_passes_serialize_values_through() {
        let v = vec![1u8, 2];
        let got: &Vec<u8> = (&ArgProbe(&v)).__idem_arg();
        assert_eq!(got, &v);
        struct Opaque;
        let placeholder = (&ArgProbe(&Opaque)).__idem_arg();
        assert_eq!(Fingerprint::of(placeholder), Fingerprint::of(&NotSerialize));
    }
}
