//! Checks that need the function: its shape (an `async fn`, or one already rewritten by
//! `#[async_trait]`), its return type, and the argument names that `skip` refers to. The
//! result is a [`Func`]: what the expansion needs to know about the function.

use proc_macro2::Span;
use syn::{
    Block, Expr, FnArg, GenericArgument, Ident, ItemFn, Pat, PathArguments, ReturnType, Stmt, Type,
    TypeParamBound,
};

use crate::attr::Args;

/// How the function's body is reached.
pub enum Shape {
    /// `async fn`: the body is the function's block and the return type may be rewritten.
    Async,
    /// A method already rewritten by `#[async_trait]`: the body is the block of the
    /// `Box::pin(async move { ... })` it returns, and the signature belongs to the trait.
    AsyncTrait { body: Box<Block> },
}

/// What the function returns, as the engine sees it.
pub enum Ret {
    /// Any type that is not a `Result`: the function then returns `Result<T, idem::Error>`.
    Value(Type),
    /// `Result<T, E>` (or an alias such as `io::Result<T>`, whose parts are then named by
    /// projection): the signature is kept.
    Result {
        full: Box<Type>,
        ok: Option<Box<Type>>,
        err: Option<Box<Type>>,
    },
}

/// A function the macro can rewrite.
pub struct Func {
    pub shape: Shape,
    pub ret: Ret,
    /// The type the body evaluates to (`T`, or `Result<T, E>`).
    pub body_ty: Type,
    /// The function returns `Outcome<T>` (or `Result<Outcome<T>, E>`) while its body
    /// evaluates to `T` (or `Result<T, E>`): the engine call then reports where the result
    /// came from.
    pub outcome: bool,
    /// Bindings of the arguments that are digested (receivers and skipped ones left out),
    /// in order.
    pub digested: Vec<Ident>,
}

/// A function the checks refused: every error, and what the expansion would have needed
/// when the function has a shape the macro can rewrite, for the fallback expansion.
pub struct Refused {
    pub error: syn::Error,
    pub func: Option<Box<Func>>,
}

/// Checks the function against its options: every error found, or what the expansion
/// needs to know about it.
pub fn check(func: &ItemFn, args: &Args) -> Result<Func, Refused> {
    let mut errors: Vec<syn::Error> = Vec::new();
    let sig = &func.sig;
    let shape = shape(func, &mut errors);
    let (body_ty, ret) = body_type(shape.as_ref(), sig, args, &mut errors);

    // `Outcome<T>` in the place of the stored value: the body evaluates to `T` there.
    let (body_ty, ret, outcome) = unwrap_outcome(body_ty, ret);
    // (Not for a fn refused above: its `impl Future` is not a stored type.)
    if let (Some(_), Some(span)) = (&shape, find_impl_trait(&body_ty)) {
        errors.push(syn::Error::new(
            span,
            "the result of an #[idempotent] fn is decoded from the store, so its type must be concrete: `impl Trait` cannot be decoded",
        ));
    }

    if let (Some(opt), Ret::Value(ty)) = (&args.cache_errors, &ret) {
        errors.push(syn::Error::new(
            opt.name,
            format!(
                "`cache_errors` needs a function that returns `Result<T, E>`; this one returns `{}`",
                quote::ToTokens::to_token_stream(ty)
            ),
        ));
    }

    if args.scope.is_none() {
        scope_needed(sig, args, &mut errors);
    }
    let digested = digested(sig, args, &mut errors);

    let func = shape.map(|shape| Func {
        shape,
        ret,
        body_ty,
        outcome,
        digested,
    });
    let mut errors = args.errors.iter().cloned().chain(errors);
    match (errors.next(), func) {
        (None, Some(func)) => Ok(func),
        (Some(mut error), func) => {
            for e in errors {
                error.combine(e);
            }
            Err(Refused {
                error,
                func: func.map(Box::new),
            })
        }
        // Each branch that leaves the shape unknown reports why; this is for safety.
        (None, None) => Err(Refused {
            error: syn::Error::new(sig.fn_token.span, "#[idempotent] cannot rewrite this fn"),
            func: None,
        }),
    }
}

/// How the function's body is reached, or `None` (with the reason in `errors`) when it
/// is not a function the macro can rewrite.
fn shape(func: &ItemFn, errors: &mut Vec<syn::Error>) -> Option<Shape> {
    let sig = &func.sig;
    let mut shape = None;
    if let Some(constness) = &sig.constness {
        errors.push(syn::Error::new(
            constness.span,
            "#[idempotent] cannot go on a `const fn`: it claims its key in a store at run time; write an `async fn`",
        ));
    } else if sig.abi.is_some() || sig.variadic.is_some() {
        if let Some(abi) = &sig.abi {
            errors.push(syn::Error::new(
                abi.extern_token.span,
                "#[idempotent] cannot go on an `extern` fn: the rewritten function is an `async fn` with Rust's ABI",
            ));
        }
        if let Some(variadic) = &sig.variadic {
            errors.push(syn::Error::new(
                variadic.dots.spans[0],
                "#[idempotent] cannot go on a variadic fn: every argument must be named and digestible",
            ));
        }
    } else if sig.asyncness.is_some() {
        shape = Some(Shape::Async);
    } else if let Some(body) = async_trait_body(&func.block) {
        shape = Some(Shape::AsyncTrait { body });
    } else if let Some(ty) = returned_future(&sig.output) {
        // A future built by hand: often a trait method written for `#[async_trait]`
        // without the attribute on the impl, or a trait whose method returns a future.
        errors.push(syn::Error::new_spanned(
            ty,
            format!(
                "#[idempotent] goes on an `async fn`, and `{name}` returns a future it builds itself: in an impl of an `#[async_trait]` trait, put `#[async_trait]` on the impl block (above `#[idem::scoped]`) and write `async fn {name}(...)` as the trait declares it, so that `#[async_trait]` expands first; elsewhere, write it as an `async fn` returning the future's output",
                name = sig.ident
            ),
        ));
    } else {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            "#[idempotent] goes on an `async fn`: make this function `async`",
        ));
    }

    shape
}

/// The type the body evaluates to, and whether it is a `Result`.
fn body_type(
    shape: Option<&Shape>,
    sig: &syn::Signature,
    args: &Args,
    errors: &mut Vec<syn::Error>,
) -> (Type, Ret) {
    let (body_ty, ret) = match shape {
        Some(Shape::AsyncTrait { .. }) => match future_output(&sig.output) {
            Some(ty) => {
                let ret = classify(ty);
                if let Ret::Value(_) = ret {
                    errors.push(syn::Error::new_spanned(
                        ty,
                        "inside an `#[async_trait]` impl, an #[idempotent] method must return `Result<T, E>` with `E: From<idem::Error>`: the trait's signature cannot become `Result<T, idem::Error>`",
                    ));
                }
                (ty.clone(), ret)
            }
            None => {
                errors.push(syn::Error::new_spanned(
                    &sig.output,
                    "#[idempotent] cannot read the output type of this `#[async_trait]` method",
                ));
                (unit(), Ret::Value(unit()))
            }
        },
        _ => match &sig.output {
            ReturnType::Default => (unit(), Ret::Value(unit())),
            ReturnType::Type(_, ty) => ((**ty).clone(), classify(ty)),
        },
    };
    // In a trait impl the trait fixes the signature, so a plain `T` cannot become
    // `Result<T, idem::Error>`. `#[idem::scoped]` says whether this is one.
    if let (Some(Shape::Async), true, Ret::Value(ty)) = (shape, in_trait_impl(args), &ret) {
        let message = format!(
            "in a trait impl, #[idempotent] cannot turn `{ty}` into `Result<{ty}, idem::Error>`: the trait fixes the method's return type. Declare the method as returning `Result<{ty}, E>` with `E: From<idem::Error>`, in the trait and here",
            ty = quote::ToTokens::to_token_stream(ty)
        );
        errors.push(match &sig.output {
            ReturnType::Type(_, declared) => syn::Error::new_spanned(declared, message),
            ReturnType::Default => syn::Error::new(sig.ident.span(), message),
        });
    }

    (body_ty, ret)
}

/// Scopes the source cannot spell. A method's default scope names its type, which an
/// attribute on a fn cannot see: `#[idem::scoped]` on the impl block tells it. A generic
/// fn's instantiations would all share the fn's scope, so the user must say so.
fn scope_needed(sig: &syn::Signature, args: &Args, errors: &mut Vec<syn::Error>) {
    if let (Some(receiver), None) = (sig.receiver(), &args.impl_path) {
        errors.push(syn::Error::new(
            receiver.self_token.span,
            format!(
                "the default scope of a method names its type, which #[idempotent] cannot see from the method: put `#[idem::scoped]` on the impl block (the scope is then `<module>::<Type>::{name}`), or give this method a `scope = \"...\"`",
                name = sig.ident
            ),
        ));
    }
    if let Some(span) = generic_span(sig) {
        errors.push(syn::Error::new(
            span,
            format!(
                "a generic #[idempotent] fn needs a `scope = \"...\"`: every instantiation of `{name}` would share one default scope, and the source cannot name them apart; with an explicit scope they share it knowingly, so put what tells them apart (a type's name constant, say) into `key`",
                name = sig.ident
            ),
        ));
    }
}

/// The bindings of the arguments that are digested; a `skip` name that is none of the
/// arguments is an error.
fn digested(sig: &syn::Signature, args: &Args, errors: &mut Vec<syn::Error>) -> Vec<Ident> {
    let bound = bound_names(sig);
    let skipped: &[Ident] = args.skip.as_ref().map_or(&[], |s| &s.value);
    for name in skipped {
        if name == "self" || bound.iter().any(|b| b == name) {
            continue;
        }
        let known = if bound.is_empty() {
            "this function takes no arguments besides its receiver".to_string()
        } else {
            let names: Vec<String> = bound.iter().map(|b| format!("`{b}`")).collect();
            format!("its arguments are {}", names.join(", "))
        };
        errors.push(syn::Error::new(
            name.span(),
            format!("`skip({name})` names no argument of this function; {known}"),
        ));
    }
    // The argument that is the engine (`store = idem`) is never part of the request.
    let engine_arg = args
        .store
        .as_ref()
        .and_then(|opt| engine_argument(&opt.value));
    bound
        .into_iter()
        .filter(|b| !skipped.iter().any(|s| s == b) && Some(b) != engine_arg)
        .collect()
}

/// Whether `#[idem::scoped]` says the method is in a trait impl, whose trait fixes its
/// signature.
pub fn in_trait_impl(args: &Args) -> bool {
    args.impl_path
        .as_ref()
        .is_some_and(|p| p.value.value().contains(" as "))
}

/// Every name the function's typed arguments bind, in order.
pub fn bound_names(sig: &syn::Signature) -> Vec<Ident> {
    let mut bound = Vec::new();
    for input in &sig.inputs {
        if let FnArg::Typed(arg) = input {
            bindings(&arg.pat, &mut bound);
        }
    }
    bound
}

/// The argument a `store = <expr>` names when the argument is the engine itself, or a
/// reference or pointer to it: `idem`, `&idem`, `*idem`. Not `ctx.idem`: `ctx` may hold
/// request data besides the engine, and leaving it out of the key unasked could let two
/// requests share one.
fn engine_argument(expr: &Expr) -> Option<&Ident> {
    match expr {
        Expr::Path(p) if p.qself.is_none() => p.path.get_ident(),
        Expr::Reference(r) => engine_argument(&r.expr),
        Expr::Unary(u) if matches!(u.op, syn::UnOp::Deref(_)) => engine_argument(&u.expr),
        Expr::Paren(p) => engine_argument(&p.expr),
        Expr::Group(g) => engine_argument(&g.expr),
        _ => None,
    }
}

/// `T` in `Outcome<T>` or `idem::Outcome<T>`, by the last path segment (as `Result` is
/// recognised by name): the replay signal the fn asks for.
fn outcome_inner(ty: &Type) -> Option<&Type> {
    match ty {
        Type::Path(p) if p.qself.is_none() => single_type_arg(ty, "Outcome"),
        _ => None,
    }
}

/// The body's type, the stored types, and whether the fn returns an `Outcome`: the
/// declared `Outcome<T>` becomes `T`, `Result<Outcome<T>, E>` becomes `Result<T, E>`.
fn unwrap_outcome(body_ty: Type, ret: Ret) -> (Type, Ret, bool) {
    match ret {
        Ret::Value(ty) => match outcome_inner(&ty) {
            Some(inner) => (inner.clone(), Ret::Value(inner.clone()), true),
            None => (body_ty, Ret::Value(ty), false),
        },
        Ret::Result {
            full,
            ok: Some(ok),
            err,
        } => match outcome_inner(&ok).cloned() {
            Some(inner) => {
                let mut unwrapped = (*full).clone();
                replace_first_type_arg(&mut unwrapped, &inner);
                let ret = Ret::Result {
                    full: Box::new(unwrapped.clone()),
                    ok: Some(Box::new(inner)),
                    err,
                };
                (unwrapped, ret, true)
            }
            None => (
                body_ty,
                Ret::Result {
                    full,
                    ok: Some(ok),
                    err,
                },
                false,
            ),
        },
        ret => (body_ty, ret, false),
    }
}

/// `Result<U, E>` from `Result<T, E>` (the first type argument of the last segment).
fn replace_first_type_arg(ty: &mut Type, with: &Type) {
    let Type::Path(p) = ty else { return };
    let Some(last) = p.path.segments.last_mut() else {
        return;
    };
    let PathArguments::AngleBracketed(a) = &mut last.arguments else {
        return;
    };
    if let Some(GenericArgument::Type(t)) = a
        .args
        .iter_mut()
        .find(|arg| matches!(arg, GenericArgument::Type(_)))
    {
        *t = with.clone();
    }
}

/// The first type or const parameter of the fn, or `impl Trait` among its argument types.
fn generic_span(sig: &syn::Signature) -> Option<Span> {
    let param = sig.generics.params.iter().find_map(|p| match p {
        syn::GenericParam::Type(t) => Some(t.ident.span()),
        syn::GenericParam::Const(c) => Some(c.ident.span()),
        syn::GenericParam::Lifetime(_) => None,
    });
    param.or_else(|| {
        sig.inputs.iter().find_map(|input| match input {
            FnArg::Typed(arg) => find_impl_trait(&arg.ty),
            FnArg::Receiver(_) => None,
        })
    })
}

fn unit() -> Type {
    syn::parse_quote!(())
}

/// `Result<..>` by its last path segment: `Result<T, E>`, `io::Result<T>`, `anyhow::Result<T>`,
/// and aliases named like one (`AppResult<T>`).
fn classify(ty: &Type) -> Ret {
    if let Type::Path(p) = ty {
        if p.qself.is_none() {
            if let Some(last) = p.path.segments.last() {
                if last.ident.to_string().ends_with("Result") {
                    if let PathArguments::AngleBracketed(generics) = &last.arguments {
                        let types: Vec<&Type> = generics
                            .args
                            .iter()
                            .filter_map(|a| match a {
                                GenericArgument::Type(t) => Some(t),
                                _ => None,
                            })
                            .collect();
                        match types.as_slice() {
                            [ok, err] => {
                                return Ret::Result {
                                    full: Box::new(ty.clone()),
                                    ok: Some(Box::new((*ok).clone())),
                                    err: Some(Box::new((*err).clone())),
                                }
                            }
                            [ok] => {
                                return Ret::Result {
                                    full: Box::new(ty.clone()),
                                    ok: Some(Box::new((*ok).clone())),
                                    err: None,
                                }
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
    }
    Ret::Value(ty.clone())
}

/// The span of an `impl Trait` inside a type, if there is one.
pub fn find_impl_trait(ty: &Type) -> Option<Span> {
    match ty {
        Type::ImplTrait(t) => Some(t.impl_token.span),
        Type::Paren(t) => find_impl_trait(&t.elem),
        Type::Group(t) => find_impl_trait(&t.elem),
        Type::Reference(t) => find_impl_trait(&t.elem),
        Type::Ptr(t) => find_impl_trait(&t.elem),
        Type::Slice(t) => find_impl_trait(&t.elem),
        Type::Array(t) => find_impl_trait(&t.elem),
        Type::Tuple(t) => t.elems.iter().find_map(find_impl_trait),
        Type::Path(t) => t.path.segments.iter().find_map(|seg| match &seg.arguments {
            PathArguments::AngleBracketed(a) => a.args.iter().find_map(|arg| match arg {
                GenericArgument::Type(t) => find_impl_trait(t),
                _ => None,
            }),
            _ => None,
        }),
        _ => None,
    }
}

/// Every name a parameter pattern binds: `x`, `mut x`, `(a, b)`, `Point { x, y }`.
fn bindings(pat: &Pat, out: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(p) => {
            out.push(p.ident.clone());
            if let Some((_, sub)) = &p.subpat {
                bindings(sub, out);
            }
        }
        Pat::Tuple(p) => p.elems.iter().for_each(|e| bindings(e, out)),
        Pat::TupleStruct(p) => p.elems.iter().for_each(|e| bindings(e, out)),
        Pat::Struct(p) => p.fields.iter().for_each(|f| bindings(&f.pat, out)),
        Pat::Slice(p) => p.elems.iter().for_each(|e| bindings(e, out)),
        Pat::Reference(p) => bindings(&p.pat, out),
        Pat::Paren(p) => bindings(&p.pat, out),
        Pat::Type(p) => bindings(&p.pat, out),
        Pat::Or(p) => {
            if let Some(first) = p.cases.first() {
                bindings(first, out);
            }
        }
        _ => {}
    }
}

/// The block of `Box::pin(async move { ... })` when that is the whole body: the shape
/// `#[async_trait]` gives a method before this attribute sees it.
fn async_trait_body(block: &Block) -> Option<Box<Block>> {
    let [Stmt::Expr(Expr::Call(call), None)] = block.stmts.as_slice() else {
        return None;
    };
    let Expr::Path(func) = &*call.func else {
        return None;
    };
    let segments: Vec<String> = func
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    if !segments.ends_with(&["Box".into(), "pin".into()]) || call.args.len() != 1 {
        return None;
    }
    match call.args.first() {
        Some(Expr::Async(inner)) if inner.capture.is_some() => Some(Box::new(inner.block.clone())),
        _ => None,
    }
}

/// The declared type when a non-async fn returns a future: `impl Future<...>`,
/// `Pin<Box<dyn Future<...>>>`, or an alias named like `BoxFuture<...>`.
fn returned_future(output: &ReturnType) -> Option<&Type> {
    let ReturnType::Type(_, ty) = output else {
        return None;
    };
    let names_future = |path: &syn::Path| {
        path.segments
            .last()
            .is_some_and(|s| s.ident.to_string().ends_with("Future"))
    };
    let is_future = match &**ty {
        Type::ImplTrait(t) => t.bounds.iter().any(|b| match b {
            TypeParamBound::Trait(t) => names_future(&t.path),
            _ => false,
        }),
        Type::Path(p) => names_future(&p.path) || future_output(output).is_some(),
        _ => false,
    };
    is_future.then_some(&**ty)
}

/// `X` in `Pin<Box<dyn Future<Output = X> + Send + 'async_trait>>`.
fn future_output(output: &ReturnType) -> Option<&Type> {
    let ReturnType::Type(_, ty) = output else {
        return None;
    };
    let boxed = single_type_arg(ty, "Pin")?;
    let Type::TraitObject(object) = single_type_arg(boxed, "Box")? else {
        return None;
    };
    object.bounds.iter().find_map(|bound| {
        let TypeParamBound::Trait(t) = bound else {
            return None;
        };
        let last = t.path.segments.last()?;
        if last.ident != "Future" {
            return None;
        }
        let PathArguments::AngleBracketed(a) = &last.arguments else {
            return None;
        };
        a.args.iter().find_map(|arg| match arg {
            GenericArgument::AssocType(assoc) if assoc.ident == "Output" => Some(&assoc.ty),
            _ => None,
        })
    })
}

fn single_type_arg<'a>(ty: &'a Type, name: &str) -> Option<&'a Type> {
    let Type::Path(p) = ty else { return None };
    let last = p.path.segments.last()?;
    if last.ident != name {
        return None;
    }
    let PathArguments::AngleBracketed(a) = &last.arguments else {
        return None;
    };
    a.args.iter().find_map(|arg| match arg {
        GenericArgument::Type(t) => Some(t),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::engine_argument;

    #[test]
    fn the_engine_argument_is_the_argument_itself_or_behind_a_reference() {
        for (expr, arg) in [
            (syn::parse_quote!(idem), Some("idem")),
            (syn::parse_quote!(&idem), Some("idem")),
            (syn::parse_quote!(&*idem), Some("idem")),
            (syn::parse_quote!((engine)), Some("engine")),
            (syn::parse_quote!(ctx.idem), None),
            (syn::parse_quote!(ctx.idem()), None),
            (syn::parse_quote!(self.idem), None),
            (syn::parse_quote!(crate::ENGINE), None),
        ] {
            let expr: syn::Expr = expr;
            let found = engine_argument(&expr).map(ToString::to_string);
            assert_eq!(found.as_deref(), arg, "{}", quote::quote!(#expr));
        }
    }
}
