//! Code generation: the function keeps its signature (only a non-`Result` return type
//! becomes `Result<T, idem::Error>`) and its body becomes one call of the engine.
//!
//! Generated code names runtime items by absolute path through `<crate>::__private` and
//! `::core`, and its locals are `__idem_*` idents with mixed-site hygiene, so neither the
//! user's imports nor the user's names can change what it means.

use proc_macro2::{Delimiter, Group, Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{Ident, ItemFn, ReturnType, Type};

use crate::attr::{
    Args, DurationArg, FingerprintArg, InProgressMode, LeaseLossMode, MissingKeyMode, Opt,
};
use crate::valid::{self, Func, Ret, Shape};

/// The attribute's entry point: parse, check, generate; on any error, the user's function
/// unchanged beside the errors, so that the rest of the crate still compiles.
pub fn idempotent(attr: TokenStream, item: TokenStream) -> TokenStream {
    let func: ItemFn = match syn::parse2(item.clone()) {
        Ok(func) => func,
        Err(_) => {
            let e = syn::Error::new(
                Span::call_site(),
                "#[idempotent] goes on an `async fn` with a body (a free function or a method in an impl block)",
            );
            return with_error(item, e);
        }
    };
    let args: Args = match syn::parse2(attr) {
        Ok(args) => args,
        Err(e) => return with_error(item, e),
    };
    match valid::check(&func, &args) {
        Ok(checked) => generate(func, &args, checked),
        Err(refused) => {
            let error = refused.error.to_compile_error();
            let func = fallback(func, &args, refused.func.map(|f| *f));
            quote!(#func #error)
        }
    }
}

fn with_error(item: TokenStream, error: syn::Error) -> TokenStream {
    let error = error.to_compile_error();
    quote!(#item #error)
}

/// The function to emit beside the errors of a refused attribute, so that they are the only
/// messages: its signature is the one the expansion would give it (callers that `?` or
/// `.unwrap()` its result still compile), its body is type-checked as the expansion would
/// check it but never runs, and every argument and every expression of the attribute is
/// used (no warning about a variable or an import only the attribute names). A function
/// the macro cannot rewrite (not `async`, `const`, `extern`) is kept as written.
fn fallback(mut func: ItemFn, args: &Args, checked: Option<Func>) -> TokenStream {
    let uses = valid::bound_names(&func.sig)
        .into_iter()
        .map(|name| quote!(let _ = &#name;));
    let exprs = attribute_exprs(args).map(|e| quote!(let _ = &(#e);));
    let uses = quote! {
        let _ = || { #(#exprs)* };
        #(#uses)*
    };
    // A function the expansion cannot rewrite, or one whose `impl Trait` result (refused)
    // only its own body can define, is kept as written.
    let checked = match checked {
        Some(checked) if valid::find_impl_trait(&checked.body_ty).is_none() => checked,
        _ => {
            let block = &func.block;
            func.block = syn::parse_quote!({ #uses #block });
            return func.into_token_stream();
        }
    };
    let body_ty = &checked.body_ty;
    match &checked.shape {
        Shape::Async => {
            let block = &func.block;
            let ret = local("__idem_ret");
            // An `impl Trait` result (refused) cannot name the body's type.
            let typed = valid::find_impl_trait(body_ty).is_none();
            let body = if typed {
                quote! {
                    if let ::core::option::Option::Some(#ret) = ::core::option::Option::None::<#body_ty> {
                        #[allow(unreachable_code)]
                        return #ret;
                    }
                    let #ret: #body_ty = #block;
                    #[allow(unreachable_code)]
                    #ret
                }
            } else {
                quote!(#block)
            };
            if let (Ret::Value(ty), true, false) = (&checked.ret, typed, valid::in_trait_impl(args))
            {
                let krate = match &args.krate {
                    Some(opt) => opt.value.to_token_stream(),
                    None => quote!(::idem),
                };
                let (arrow, ty) = match &func.sig.output {
                    ReturnType::Type(arrow, declared) => (*arrow, &**declared),
                    ReturnType::Default => (Default::default(), ty),
                };
                let wrapped: Type = syn::parse_quote_spanned!(ty.span()=>
                    ::core::result::Result<#ty, #krate::Error>
                );
                func.sig.output = ReturnType::Type(arrow, Box::new(wrapped));
            }
            func.block = syn::parse_quote!({
                #uses
                let _ = move || async move { #body };
                ::core::unreachable!("#[idempotent] refused this fn: the crate does not compile")
            });
        }
        Shape::AsyncTrait { body } => {
            let body = mark_rebindings_used(body);
            func.block = syn::parse_quote!({
                ::std::boxed::Box::pin(async move #body)
            });
        }
    }
    func.into_token_stream()
}

/// The expressions the attribute holds, refused ones included.
fn attribute_exprs(args: &Args) -> impl Iterator<Item = &syn::Expr> {
    let durations = [&args.ttl, &args.lease, &args.wait_timeout]
        .into_iter()
        .filter_map(|opt| match opt.as_ref().map(|o| &o.value) {
            Some(DurationArg::Expr(e)) => Some(&**e),
            _ => None,
        });
    let fingerprint = match args.fingerprint.as_ref().map(|o| &o.value) {
        Some(FingerprintArg::Expr(e)) => Some(&**e),
        _ => None,
    };
    let others = [&args.key, &args.store, &args.codec]
        .into_iter()
        .filter_map(|opt| opt.as_ref().map(|o| &o.value));
    let predicate = args.cache_errors.as_ref().and_then(|o| o.value.as_ref());
    // A closure's parameters are typed by the call it is passed to, which is not made.
    others
        .chain(durations)
        .chain(fingerprint)
        .chain(predicate)
        .chain(&args.stray)
        .filter(|e| !matches!(e, syn::Expr::Closure(_)))
}

fn local(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

fn generate(mut func: ItemFn, args: &Args, checked: Func) -> TokenStream {
    let krate = match &args.krate {
        Some(opt) => opt.value.to_token_stream(),
        None => quote!(::idem),
    };
    let pr = quote!(#krate::__private);
    let engine = local("__idem_engine");
    let key = local("__idem_key");
    let fp = local("__idem_fp");
    let digest = local("__idem_args");
    let ret_local = local("__idem_ret");

    // The engine call names the stored types by the user's own tokens, so that a missing
    // bound is reported there (see `__private::run`). The call and its `.await` carry the
    // span of the result type too: awaiting re-checks the same bounds, and rustc reports an
    // identical error at an identical span only once.
    let eq_of = |ty: &TokenStream| {
        quote!({
            #[allow(unused_imports)]
            use #pr::Otherwise as _;
            #pr::EqProbe::<#ty>::NEW.__idem_probe()
        })
    };
    // What the engine may do with a result beyond serde: compare it by `==`, and, with
    // `clone_cached`, keep it decoded in the local cache. That one is asked for rather than
    // probed: a probe cannot see whether a generic type is `'static`.
    let ops_of = |ty: &TokenStream| {
        let eq = eq_of(ty);
        let share = match &args.clone_cached {
            Some(opt) => quote_spanned!(opt.name=> #pr::share::<#ty>()),
            None => quote!(::core::option::Option::None),
        };
        quote!(#pr::ValueOps::new(#eq, #share))
    };
    let (run, turbofish, from_idem, at, eqs) = match &checked.ret {
        Ret::Value(ty) => {
            let eq = ops_of(&ty.to_token_stream());
            (
                quote!(run),
                quote!(#ty, _, _, _, _),
                None,
                ty.span(),
                quote!(#eq,),
            )
        }
        Ret::Result { full, ok, err } => {
            // With `cache_errors`, the error type is the one that newly needs serde, so its
            // missing bounds are the likelier ones: the `.await` shares its span then.
            let at = match (args.cache_errors.is_some(), ok, err) {
                (true, _, Some(err)) => err.span(),
                (false, Some(ok), _) => ok.span(),
                _ => full.span(),
            };
            let ok = match ok {
                Some(ty) => ty.to_token_stream(),
                None => quote!(<#full as #pr::Fallible>::Ok),
            };
            let err = match err {
                Some(ty) => ty.to_token_stream(),
                None => quote!(<#full as #pr::Fallible>::Err),
            };
            let ok_eq = ops_of(&ok);
            if args.cache_errors.is_some() {
                let err_eq = eq_of(&err);
                (
                    quote!(run_caching_errors),
                    quote!(#ok, #err, _, _, _, _, _),
                    None,
                    at,
                    quote!((#ok_eq, #err_eq),),
                )
            } else {
                (
                    quote!(run_fallible),
                    quote!(#ok, #err, _, _, _, _),
                    Some(quote!(#pr::error_from::<#err>,)),
                    at,
                    quote!(#ok_eq,),
                )
            }
        }
    };

    let engine_init = match &args.store {
        Some(opt) => {
            let store = spanned_ref(&opt.value);
            quote!(let #engine = #pr::engine(#store);)
        }
        None => quote!(let #engine = #pr::global();),
    };

    let name = func.sig.ident.to_string();
    // The default scope is spelled by the source alone (module path, the impl's type as
    // `#[idem::scoped]` read it, the fn's name), never by what the compiler says of a type,
    // so it stays the same across toolchains. `valid.rs` has made sure a method has its type.
    let scope = match (&args.scope, &args.impl_path) {
        (Some(opt), _) => opt.value.to_token_stream(),
        (None, Some(opt)) => {
            let ty = &opt.value;
            quote!(::core::concat!(::core::module_path!(), "::", #ty, "::", #name))
        }
        (None, None) => quote!(::core::concat!(::core::module_path!(), "::", #name)),
    };

    // A function on the implicit global engine is checked at each call (see
    // `idem::set_global`): its key becomes the error that refuses it.
    let implicit = match &args.store {
        Some(_) => TokenStream::new(),
        None => quote!(let #key = #pr::implicit_global(#scope, #key);),
    };

    // The tuple of digested arguments, when the key or the fingerprint needs it.
    let fingerprint = args.fingerprint.as_ref().map(|o| &o.value);
    let needs_args = args.key.is_none() || fingerprint.is_none();
    let arg_stmts = if needs_args {
        let asserts = checked.digested.iter().map(|arg| {
            let r = quote_spanned!(arg.span()=> &#arg);
            quote!(#pr::assert_arg(#r);)
        });
        let items = checked.digested.iter().map(|arg| {
            let method = format_ident!("__idem_probe", span = arg.span());
            quote!(#pr::ArgProbe(&#arg).#method())
        });
        let tuple = chunked_tuple(items.collect());
        quote! {
            #(#asserts)*
            let #digest = #tuple;
        }
    } else {
        TokenStream::new()
    };
    let key_expr = match &args.key {
        Some(opt) => {
            let r = spanned_ref(&opt.value);
            quote!(#pr::key(#scope, #r))
        }
        None => quote!(#pr::digest_key(#scope, &#digest)),
    };
    let fp_expr = match fingerprint {
        Some(FingerprintArg::None) => quote!(#pr::Fingerprint::NONE),
        Some(FingerprintArg::Expr(expr)) => {
            let r = spanned_ref(expr);
            quote!(#pr::fingerprint_of(#r))
        }
        // The arguments' encoding when the engine has a local cache, their hash otherwise.
        None => quote!(#pr::request_print(::core::borrow::Borrow::borrow(&#engine), &#digest)),
    };

    let options = call_options(args, checked.outcome, &pr);
    let predicate = match &args.cache_errors {
        Some(opt) => match &opt.value {
            Some(pred) => quote!(#pred,),
            None => quote!(#pr::cache_every_error,),
        },
        None => TokenStream::new(),
    };

    let body_ty = &checked.body_ty;
    let block = match &checked.shape {
        Shape::Async => func.block.to_token_stream(),
        Shape::AsyncTrait { body } => {
            let mut body = mark_rebindings_used(body);
            if checked.outcome {
                retype_async_trait_block(&mut body, body_ty);
            }
            body.to_token_stream()
        }
    };
    let run_path = respan(quote!(#pr::#run), at);
    let body = quote! {
        move || async move {
            // Fixes the block's type before the body is checked, so that `?` and
            // `return` in the body know what they return.
            if let ::core::option::Option::Some(#ret_local) = ::core::option::Option::None::<#body_ty> {
                #[allow(unreachable_code)]
                return #ret_local;
            }
            let #ret_local: #body_ty = #block;
            #[allow(unreachable_code)]
            #ret_local
        }
    };
    let mut call_args = Group::new(
        Delimiter::Parenthesis,
        quote! {
            #pr::call(::core::borrow::Borrow::borrow(&#engine), #key, #fp) #options,
            #eqs
            #from_idem
            #predicate
            #body
        },
    );
    call_args.set_span(at);
    let engine_call = quote_spanned!(at=> #run_path::<#turbofish> #call_args .await);
    let call = quote! {
        #engine_init
        let (#key, #fp) = {
            #[allow(unused_imports)]
            use #pr::Otherwise as _;
            #arg_stmts
            (#key_expr, #fp_expr)
        };
        #implicit
        #engine_call
    };

    match checked.shape {
        Shape::Async => {
            if let Ret::Value(ty) = &checked.ret {
                // The declared type (`Outcome<T>` stays), or `()` for none.
                let (arrow, ty) = match &func.sig.output {
                    ReturnType::Type(arrow, declared) => (*arrow, &**declared),
                    ReturnType::Default => (Default::default(), ty),
                };
                let wrapped: Type = syn::parse_quote_spanned!(ty.span()=>
                    ::core::result::Result<#ty, #krate::Error>
                );
                func.sig.output = ReturnType::Type(arrow, Box::new(wrapped));
            }
            func.block = syn::parse_quote!({ #call });
        }
        Shape::AsyncTrait { .. } => {
            func.block = syn::parse_quote!({
                ::std::boxed::Box::pin(async move { #call })
            });
        }
    }
    func.into_token_stream()
}

/// The engine call's options given in the attribute, as builder calls on the call
/// (`.ttl(..)`, `.in_progress(..)`, ...).
fn call_options(args: &Args, outcome: bool, pr: &TokenStream) -> TokenStream {
    let mut options = TokenStream::new();
    for (method, opt) in [
        ("ttl", &args.ttl),
        ("lease", &args.lease),
        ("wait_timeout", &args.wait_timeout),
    ] {
        if let Some(opt) = opt {
            let method = Ident::new(method, opt.name);
            let value = match &opt.value {
                DurationArg::Millis(ms, span) => quote_spanned!(*span=> #pr::duration_ms(#ms)),
                DurationArg::Expr(expr) => {
                    quote_spanned!(expr.span()=> #pr::into_duration(#expr))
                }
            };
            options.extend(quote!(.#method(#value)));
        }
    }
    if let Some(opt) = &args.in_progress {
        let mode = match opt.value {
            InProgressMode::Reject => quote!(Reject),
            InProgressMode::Wait => quote!(Wait),
        };
        options.extend(quote!(.in_progress(#pr::InProgress::#mode)));
    }
    if let Some(opt) = &args.lease_loss {
        let mode = match opt.value {
            LeaseLossMode::Cancel => quote!(Cancel),
            LeaseLossMode::Finish => quote!(Finish),
        };
        options.extend(quote!(.lease_loss(#pr::LeaseLoss::#mode)));
    }
    if args.at_most_once.is_some() {
        options.extend(quote!(.at_most_once()));
    }
    if let Some(opt) = &args.codec {
        let expr = &opt.value;
        options.extend(quote!(.codec(#expr)));
    }
    if let Some(opt) = &args.version {
        let version = &opt.value;
        options.extend(quote!(.version(#version)));
    }
    if let Some(Opt {
        value: MissingKeyMode::Run,
        ..
    }) = &args.missing_key
    {
        options.extend(quote!(.missing_key(#pr::MissingKey::Run)));
    }
    if outcome {
        options.extend(quote!(.with_outcome()));
    }
    options
}

/// `#[async_trait]` moves each argument into its future with `let x = x;` among the
/// top-level statements of the block (the user's body is nested one level deeper). An
/// argument used only in `key` or `fingerprint` is used outside the block and not inside
/// it, so its rebinding would warn as unused; this marks each one used.
fn mark_rebindings_used(block: &syn::Block) -> syn::Block {
    let mut block = block.clone();
    let mut stmts = Vec::with_capacity(block.stmts.len() * 2);
    for stmt in block.stmts.drain(..) {
        let rebound = match &stmt {
            syn::Stmt::Local(local) => rebinding(local),
            _ => None,
        };
        stmts.push(stmt);
        if let Some(ident) = rebound {
            stmts.push(syn::parse_quote!(let _ = &#ident;));
        }
    }
    block.stmts = stmts;
    block
}

/// `#[async_trait]` types its block by the trait's output (`if let Some(__ret) =
/// None::<Ret>` and `let __ret: Ret = { body };`); for a method that returns
/// `Result<Outcome<T>, E>`, the body evaluates to `Result<T, E>`, so both become that.
fn retype_async_trait_block(block: &mut syn::Block, body_ty: &Type) {
    for stmt in &mut block.stmts {
        match stmt {
            syn::Stmt::Local(local) => {
                if let syn::Pat::Type(pat) = &mut local.pat {
                    if matches!(&*pat.pat, syn::Pat::Ident(i) if i.ident == "__ret") {
                        *pat.ty = body_ty.clone();
                    }
                }
            }
            syn::Stmt::Expr(syn::Expr::If(expr_if), _) => {
                let syn::Expr::Let(let_expr) = &mut *expr_if.cond else {
                    continue;
                };
                let syn::Expr::Path(path) = &mut *let_expr.expr else {
                    continue;
                };
                if let Some(last) = path.path.segments.last_mut() {
                    if last.ident == "None" {
                        last.arguments =
                            syn::PathArguments::AngleBracketed(syn::parse_quote!(::<#body_ty>));
                    }
                }
            }
            _ => {}
        }
    }
}

/// `x` in `let x = x;` or `let mut x = x;`.
fn rebinding(local: &syn::Local) -> Option<Ident> {
    let syn::Pat::Ident(pat) = &local.pat else {
        return None;
    };
    let init = local.init.as_ref()?;
    match &*init.expr {
        syn::Expr::Path(path) if path.path.is_ident(&pat.ident) => Some(pat.ident.clone()),
        _ => None,
    }
}

/// `&(expr)` whose span covers the whole expression (from its first token to its last),
/// so that an error about the value underlines all of it.
///
/// The items of a tuple are borrowed (`(a, b)` digests as `(&a, &b)`, which serializes the
/// same), so that `key = (tenant, invoice_no)` does not move the arguments the body needs.
fn spanned_ref(expr: &syn::Expr) -> TokenStream {
    let tokens = match expr {
        syn::Expr::Tuple(tuple) => {
            let items = tuple.elems.iter().map(|item| {
                let r = spanned_ref(item);
                quote!(#r,)
            });
            let mut group = Group::new(Delimiter::Parenthesis, quote!(#(#items)*));
            group.set_span(tuple.paren_token.span.join());
            group.into_token_stream()
        }
        _ => expr.to_token_stream(),
    };
    let first = expr.span();
    let last = tokens
        .clone()
        .into_iter()
        .last()
        .map_or(first, |t| t.span());
    let mut group = Group::new(Delimiter::Parenthesis, tokens);
    group.set_span(last);
    quote_spanned!(first=> & #group)
}

/// The same tokens, every one at `span`.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tt| {
            if let TokenTree::Group(g) = &tt {
                let mut group = Group::new(g.delimiter(), respan(g.stream(), span));
                group.set_span(span);
                tt = TokenTree::Group(group);
            } else {
                tt.set_span(span);
            }
            tt
        })
        .collect()
}

/// `(a, b, c,)`; more than 12 items nest in tuples of 12, since serde implements
/// `Serialize` for tuples up to 16 items.
fn chunked_tuple(items: Vec<TokenStream>) -> TokenStream {
    if items.len() <= 12 {
        return quote!((#(#items,)*));
    }
    let chunks = items.chunks(12).map(|c| chunked_tuple(c.to_vec()));
    chunked_tuple(chunks.collect())
}
