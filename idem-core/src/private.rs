//! Items that `#[idempotent]` expands to. Not a public API: names and signatures change
//! without notice.
//!
//! Three kinds of items live here. [`key`] shows a key value's id by how the value
//! serializes (readable or digested; see `key_id.rs`). Two probes ([`ArgProbe`],
//! [`EqProbe`]) ask whether a type has a trait without requiring it: an inherent method
//! where the bound holds, [`Otherwise`] where it does not. Bounds with messages are
//! blanket traits carrying a `#[diagnostic::on_unimplemented]` message, so that a type that
//! cannot be stored or digested is reported once, in words about idem, at the user's token.

use std::future::Future;
use std::time::Duration;

use serde::{de::DeserializeOwned, Serialize};

pub use crate::engine::{Answers, RequestPrint, Share, ValueEq, ValueOps};
pub use crate::{Call, Error, Fingerprint, Idem, InProgress, Key, LeaseLoss, MissingKey};

// ---------------------------------------------------------------------------------------
// Keys.

mod key_id;

pub use key_id::{key, KeyValue};

/// A key whose id is the digest of the arguments: what a function without `key` uses.
pub fn digest_key<T: Serialize + ?Sized>(scope: &str, args: &T) -> Result<Key, Error> {
    Key::digest(scope, args)
}

// ---------------------------------------------------------------------------------------
// Arguments.

/// Holds a reference to an argument; `ArgProbe(&arg).__idem_probe()` is the argument
/// itself when it is `Serialize`, and a placeholder otherwise ([`Otherwise`]), so that the
/// tuple of arguments always compiles and the one error about the argument comes from
/// [`assert_arg`] (with `&arg` in the tuple, rustc would report the tuple as well).
pub struct ArgProbe<'a, T: ?Sized>(pub &'a T);

impl<'a, T: Serialize + ?Sized> ArgProbe<'a, T> {
    /// The argument.
    pub fn __idem_probe(&self) -> &'a T {
        self.0
    }
}

/// Stands for an argument that is not `Serialize`; never digested, since the crate does
/// not compile in that case.
#[derive(Serialize)]
pub struct NotSerialize;

/// What a probe answers when the bound of its inherent `__idem_probe` does not hold.
///
/// The expansion calls `probe.__idem_probe()` with this trait in scope. Method resolution
/// prefers an inherent method to a trait method of the same receiver, and leaves out an
/// inherent method whose impl's bounds do not hold (no specialization needed; a generic
/// type without the bound in scope takes this answer too). The two probes are
/// [`ArgProbe`] (is the argument `Serialize`?) and [`EqProbe`] (is the result `PartialEq`?).
pub trait Otherwise {
    /// The answer.
    type Answer;
    /// The answer when the bound does not hold.
    fn __idem_probe(&self) -> Self::Answer;
}

impl<'a, T: ?Sized> Otherwise for ArgProbe<'a, T> {
    type Answer = &'a NotSerialize;
    fn __idem_probe(&self) -> &'a NotSerialize {
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

/// The `==` of a stored type, when it has one: `EqProbe::<T>::NEW.__idem_probe()` is
/// `Some(T::eq)` when `T: PartialEq`, and `None` otherwise ([`Otherwise`]).
///
/// Before a result is stored, the engine decodes the bytes it is about to store and compares
/// the copy with the body's value, so that a value the codec cannot carry faithfully is an
/// `Error::Encode` on the first call, not a different value on every replay. The canonical
/// encodings are always compared; `==`, when the type has it, also sees what serde cannot
/// (the variant an untagged enum decodes into). This stays a probe: requiring `PartialEq`
/// would refuse result types that lack it, and stable Rust has no specialization.
pub struct EqProbe<T: ?Sized>(std::marker::PhantomData<fn(&T)>);

impl<T: ?Sized> EqProbe<T> {
    /// The probe.
    pub const NEW: EqProbe<T> = EqProbe(std::marker::PhantomData);
}

impl<T: PartialEq> EqProbe<T> {
    /// `PartialEq::eq` of the type.
    pub fn __idem_probe(&self) -> ValueEq<T> {
        Some(<T as PartialEq>::eq)
    }
}

impl<T> Otherwise for EqProbe<T> {
    type Answer = ValueEq<T>;
    fn __idem_probe(&self) -> ValueEq<T> {
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

/// [`Call::run`] for a function that returns a value `T` (or `Outcome<T>`, when `call` is
/// a `CallWithOutcome`). A plain function that returns the engine's future, so that the
/// call adds no layer of its own.
pub fn run<'a, T, C, R, F, Fut>(
    call: R,
    eq: ValueOps<T>,
    body: F,
) -> impl Future<Output = Result<R::Out<T>, Error>> + use<'a, T, C, R, F, Fut>
where
    T: CachedValue,
    R: Answers<Codec = C> + 'a,
    F: FnOnce() -> Fut,
    Fut: Future<Output = T>,
{
    crate::engine::run::run(call, eq, body)
}

/// [`Call::run_fallible`] for a function that returns `Result<T, E>`. The conversion of
/// idem's own errors into `E` is passed in (`error_from::<E>`, whose bound is checked at
/// the user's error type), so that this future's type carries no bound on `E`.
pub fn run_fallible<'a, T, E, C, R, F, Fut>(
    call: R,
    eq: ValueOps<T>,
    from_idem: fn(Error) -> E,
    body: F,
) -> impl Future<Output = Result<R::Out<T>, E>> + use<'a, T, E, C, R, F, Fut>
where
    T: CachedValue,
    R: Answers<Codec = C> + 'a,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    crate::engine::run::run_fallible(call, eq, from_idem, body)
}

/// `E::from` for idem's errors, with the bound that names what is missing.
pub fn error_from<E: IdemErrorType>(e: Error) -> E {
    E::from(e)
}

/// [`Call::run_caching_errors`] for a function with `cache_errors`.
pub fn run_caching_errors<'a, T, E, C, R, P, F, Fut>(
    call: R,
    eq: (ValueOps<T>, ValueEq<E>),
    cache_if: P,
    body: F,
) -> impl Future<Output = Result<R::Out<T>, E>> + use<'a, T, E, C, R, P, F, Fut>
where
    T: CachedValue,
    E: CachedErrorType,
    R: Answers<Codec = C> + 'a,
    P: Fn(&E) -> bool,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    crate::engine::run::run_caching_errors(call, eq, cache_if, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arg_probe_passes_serialize_values_through() {
        let v = vec![1u8, 2];
        let got: &Vec<u8> = ArgProbe(&v).__idem_probe();
        assert_eq!(got, &v);
        struct Opaque;
        let placeholder = ArgProbe(&Opaque).__idem_probe();
        assert_eq!(Fingerprint::of(placeholder), Fingerprint::of(&NotSerialize));
    }

    #[test]
    fn eq_probe_finds_partial_eq_where_there_is_one() {
        let eq = EqProbe::<u32>::NEW.__idem_probe().expect("u32: PartialEq");
        assert!(eq(&1, &1) && !eq(&1, &2));
        struct Opaque;
        assert!(EqProbe::<Opaque>::NEW.__idem_probe().is_none());
    }
}
