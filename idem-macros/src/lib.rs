//! The `#[idempotent]` attribute of idem. Use it through the `idem` crate, which
//! re-exports it and documents every option.
#![deny(missing_docs)]

mod attr;
mod expand;
mod scoped;
mod valid;

use proc_macro::TokenStream;

/// Defined in `idem-macros` and re-exported by `idem`, whose `idem::idempotent` page
/// documents every option and the code the attribute expands to. Use it through `idem`:
/// the expansion names `::idem::__private` items.
#[proc_macro_attribute]
pub fn idempotent(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::idempotent(attr.into(), item.into()).into()
}

/// Defined in `idem-macros` and re-exported by `idem` as `idem::scoped`: on an impl block,
/// it gives each `#[idempotent]` method without a `scope` the default scope
/// `<module>::<Type>::<method>`, from the impl's type as the source spells it.
#[proc_macro_attribute]
pub fn scoped(attr: TokenStream, item: TokenStream) -> TokenStream {
    scoped::scoped(attr.into(), item.into()).into()
}
