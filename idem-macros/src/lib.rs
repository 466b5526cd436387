//! The `#[idempotent]` attribute of idem. Use it through the `idem` crate.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use proc_macro::TokenStream;

/// Placeholder until the attribute lands: returns the item unchanged.
#[proc_macro_attribute]
pub fn idempotent(_attr: TokenStream, item: TokenStream) -> TokenStream {
    item
}
