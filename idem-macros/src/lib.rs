//! The `#[idempotent]` attribute of idem. Use it through the `idem` crate, which
//! re-exports it and documents every option.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod attr;
mod expand;
mod valid;

use proc_macro::TokenStream;

/// Makes an `async fn` idempotent: its key is claimed in a store, its body runs once per
/// key, and its result is stored and replayed to every later call with the same key.
///
/// Documented, with every option and the code it expands to, at `idem::idempotent`.
#[proc_macro_attribute]
pub fn idempotent(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::idempotent(attr.into(), item.into()).into()
}
