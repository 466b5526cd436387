//! `#[idem::scoped]` on an impl block: tells each `#[idempotent]` method in it the impl's
//! type as the source spells it (`Payments`, or `<Payments as Charge>` in a trait impl), so
//! that a method's default scope is `<module>::<Type>::<method>`.
//!
//! An attribute on a method cannot see the impl it is in, and the compiler's own name of a
//! type (`std::any::type_name`) may change between toolchains, which would change every
//! stored key of the method. The impl header is source text: it only changes when the
//! source does.

use proc_macro2::{Span, TokenStream};
use quote::{quote, ToTokens};
use syn::spanned::Spanned;
use syn::{ImplItem, ItemImpl, LitStr, Meta, Type};

use crate::attr::Args;

pub fn scoped(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut imp: ItemImpl = match syn::parse2(item.clone()) {
        Ok(imp) => imp,
        Err(_) => {
            let e = syn::Error::new(
                Span::call_site(),
                "#[idem::scoped] goes on an impl block whose methods carry #[idempotent]",
            );
            return with_errors(item, vec![e]);
        }
    };
    let mut errors = Vec::new();
    if !attr.is_empty() {
        errors.push(syn::Error::new(
            attr.span(),
            "#[idem::scoped] takes no options: each method's own #[idempotent(...)] does",
        ));
    }
    let spelled = type_path(&imp.self_ty).map(|ty| match &imp.trait_ {
        Some((_, path, _)) => format!("<{ty} as {}>", path_string(path)),
        None => ty,
    });
    let generic = imp.generics.params.iter().find_map(|p| match p {
        syn::GenericParam::Type(t) => Some(t.ident.span()),
        syn::GenericParam::Const(c) => Some(c.ident.span()),
        syn::GenericParam::Lifetime(_) => None,
    });

    let mut unscoped_generic = Vec::new();
    let mut unscoped_unnamed = Vec::new();
    for item in &mut imp.items {
        let ImplItem::Fn(method) = item else { continue };
        for attr in &mut method.attrs {
            if !is_idempotent(attr) || has_own_scope(&attr.meta) {
                continue;
            }
            // A generic impl is an error of its own, reported once at its parameters; the
            // method is still told its type so that it does not report a second error.
            if generic.is_some() {
                unscoped_generic.push(method.sig.ident.to_string());
            }
            match &spelled {
                Some(spelled) => tell_impl(&mut attr.meta, spelled),
                None => unscoped_unnamed.push(method.sig.ident.to_string()),
            }
        }
    }
    if let (Some(span), false) = (generic, unscoped_generic.is_empty()) {
        errors.push(syn::Error::new(
            span,
            format!(
                "this impl is generic, so every instantiation would share the default scope of {}: give each a `scope = \"...\"` (shared by the instantiations knowingly) and put what tells them apart (a type's name constant, say) into its `key`",
                listed(&unscoped_generic)
            ),
        ));
    }
    if !unscoped_unnamed.is_empty() {
        errors.push(syn::Error::new_spanned(
            &imp.self_ty,
            format!(
                "#[idem::scoped] names scopes after the impl's type, which must be a path like `Payments`; give {} a `scope = \"...\"` instead",
                listed(&unscoped_unnamed)
            ),
        ));
    }
    with_errors(imp.into_token_stream(), errors)
}

fn with_errors(item: TokenStream, errors: Vec<syn::Error>) -> TokenStream {
    let errors = errors.into_iter().map(|e| e.to_compile_error());
    quote!(#item #(#errors)*)
}

fn listed(names: &[String]) -> String {
    let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    names.join(", ")
}

/// `#[idempotent]`, `#[idem::idempotent]`, `#[::idem::idempotent(...)]`.
fn is_idempotent(attr: &syn::Attribute) -> bool {
    attr.path()
        .segments
        .last()
        .is_some_and(|s| s.ident == "idempotent")
}

/// Whether the attribute sets its own `scope`. Options that do not parse are left for
/// `#[idempotent]` itself to report; the method is still told its type, so that its
/// fallback expansion has the scope it would have.
fn has_own_scope(meta: &Meta) -> bool {
    match meta {
        Meta::List(list) => syn::parse2::<Args>(list.tokens.clone())
            .map(|args| args.scope.is_some())
            .unwrap_or(true),
        _ => false,
    }
}

/// Appends the hidden option `__impl = "<type>"` to the attribute.
fn tell_impl(meta: &mut Meta, spelled: &str) {
    let lit = LitStr::new(spelled, Span::call_site());
    match meta {
        Meta::Path(path) => {
            *meta = syn::parse_quote!(#path(__impl = #lit));
        }
        Meta::List(list) => {
            let ends_with_comma = list
                .tokens
                .clone()
                .into_iter()
                .last()
                .is_some_and(|t| t.to_string() == ",");
            if list.tokens.is_empty() || ends_with_comma {
                list.tokens.extend(quote!(__impl = #lit));
            } else {
                list.tokens.extend(quote!(, __impl = #lit));
            }
        }
        Meta::NameValue(_) => {}
    }
}

/// The type's path as spelled, without generic arguments: `Payments`, `billing::Payments`.
fn type_path(ty: &Type) -> Option<String> {
    match ty {
        Type::Path(p) if p.qself.is_none() => Some(path_string(&p.path)),
        Type::Group(g) => type_path(&g.elem),
        Type::Paren(p) => type_path(&p.elem),
        _ => None,
    }
}

fn path_string(path: &syn::Path) -> String {
    let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
    segments.join("::")
}
