//! Parsing of the attribute's options: `#[idempotent(key = ..., ttl = "24h", ...)]`.
//!
//! Everything that can be judged from the attribute alone is checked here (unknown and
//! duplicated options, duration literals, `in_progress` values, the scope literal); checks
//! that need the function are in `valid.rs`.

use proc_macro2::Span;
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{Expr, Ident, LitStr, Token};

/// The option a misspelled name most likely meant: the nearest by edit distance
/// (insertions, deletions, substitutions and swaps of neighbours, so `tll` is `ttl`), when
/// it is close enough to be a typo rather than another word.
fn closest_option(name: &str) -> Option<&'static str> {
    let name = name.to_ascii_lowercase();
    OPTIONS
        .iter()
        .map(|option| (edit_distance(&name, option), *option))
        .filter(|(d, option)| *d <= 1 + option.len() / 4)
        .min_by_key(|(d, _)| *d)
        .map(|(_, option)| option)
}

/// Optimal string alignment distance between two short ASCII-ish strings.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

/// The option names, in the order the docs list them.
pub const OPTIONS: &[&str] = &[
    "key",
    "scope",
    "store",
    "ttl",
    "lease",
    "in_progress",
    "wait_timeout",
    "lease_loss",
    "at_most_once",
    "fingerprint",
    "skip",
    "cache_errors",
    "codec",
    "version",
    "missing_key",
    "clone_cached",
    "crate",
];

pub mod kw {
    syn::custom_keyword!(key);
    syn::custom_keyword!(scope);
    syn::custom_keyword!(store);
    syn::custom_keyword!(ttl);
    syn::custom_keyword!(lease);
    syn::custom_keyword!(in_progress);
    syn::custom_keyword!(wait_timeout);
    syn::custom_keyword!(lease_loss);
    syn::custom_keyword!(at_most_once);
    syn::custom_keyword!(fingerprint);
    syn::custom_keyword!(skip);
    syn::custom_keyword!(cache_errors);
    syn::custom_keyword!(codec);
    syn::custom_keyword!(version);
    syn::custom_keyword!(missing_key);
    syn::custom_keyword!(clone_cached);
    syn::custom_keyword!(none);
    syn::custom_keyword!(__impl);
}

/// A parsed option together with the span of its name, for errors about the option.
pub struct Opt<T> {
    pub name: Span,
    pub value: T,
}

/// A duration option: a literal checked here, or an expression evaluated at run time.
pub enum DurationArg {
    Millis(u64, Span),
    Expr(Box<Expr>),
}

/// `in_progress = "reject" | "wait"`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum InProgressMode {
    Reject,
    Wait,
}

/// `lease_loss = "cancel" | "finish"`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum LeaseLossMode {
    Cancel,
    Finish,
}

/// `missing_key = "error" | "run"`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum MissingKeyMode {
    Error,
    Run,
}

/// `fingerprint = none` or `fingerprint = <expr>`.
pub enum FingerprintArg {
    None,
    Expr(Box<Expr>),
}

/// Every option of one attribute. Each is set at most once.
#[derive(Default)]
pub struct Args {
    pub key: Option<Opt<Expr>>,
    pub scope: Option<Opt<LitStr>>,
    pub store: Option<Opt<Expr>>,
    pub ttl: Option<Opt<DurationArg>>,
    pub lease: Option<Opt<DurationArg>>,
    pub in_progress: Option<Opt<InProgressMode>>,
    pub wait_timeout: Option<Opt<DurationArg>>,
    pub lease_loss: Option<Opt<LeaseLossMode>>,
    /// `at_most_once`: the body runs at most once per key, even across a crash.
    pub at_most_once: Option<Opt<()>>,
    pub fingerprint: Option<Opt<FingerprintArg>>,
    pub skip: Option<Opt<Vec<Ident>>>,
    /// `cache_errors` alone (`None`: cache every error) or `cache_errors = <predicate>`.
    pub cache_errors: Option<Opt<Option<Expr>>>,
    pub codec: Option<Opt<Expr>>,
    pub version: Option<Opt<syn::LitInt>>,
    pub missing_key: Option<Opt<MissingKeyMode>>,
    /// `clone_cached`: local-cache hits answer a clone of the kept decoded value.
    pub clone_cached: Option<Opt<()>>,
    pub krate: Option<Opt<syn::Path>>,
    /// Set by `#[idem::scoped]` on the enclosing impl block: the impl's type as the source
    /// spells it (`Payments`, `<Payments as Charge>`), which names a method's default scope.
    pub impl_path: Option<Opt<LitStr>>,
    /// Errors found while parsing: each wrong option is left out, the others kept.
    pub errors: Vec<syn::Error>,
    /// Expressions given where a literal belongs (`version = V`): refused, yet kept so
    /// that the fallback expansion still uses what they name.
    pub stray: Vec<Expr>,
}

/// Parses every option, also after one that is wrong: its error is kept in `errors`, the
/// parse goes on after the next comma, and the options that did parse (`crate`, the
/// `__impl` of `#[idem::scoped]`, the expressions) still shape the fallback expansion.
impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = Args::default();
        while !input.is_empty() {
            let parsed = args.parse_one(input).and_then(|()| match input.is_empty() {
                true => Ok(()),
                false => input.parse::<Token![,]>().map(drop),
            });
            if let Err(e) = parsed {
                args.errors.push(e);
                while !input.is_empty() && !input.peek(Token![,]) {
                    input.parse::<proc_macro2::TokenTree>()?;
                }
                if !input.is_empty() {
                    input.parse::<Token![,]>()?;
                }
            }
        }
        Ok(args)
    }
}

impl Args {
    /// One option and its value. The options that say what a call stores, and under which
    /// key, are here; those that say how the call behaves are in
    /// [`parse_behaviour`](Self::parse_behaviour).
    fn parse_one(&mut self, input: ParseStream<'_>) -> syn::Result<()> {
        let name_span = input.span();
        if input.peek(Token![crate]) {
            input.parse::<Token![crate]>()?;
            let path = parse_crate_path(input)?;
            return self.set(|a| &mut a.krate, "crate", name_span, path);
        }
        if input.peek(kw::key) {
            input.parse::<kw::key>()?;
            input.parse::<Token![=]>()?;
            let expr = input.parse()?;
            self.set(|a| &mut a.key, "key", name_span, expr)
        } else if input.peek(kw::scope) {
            input.parse::<kw::scope>()?;
            input.parse::<Token![=]>()?;
            let lit = self.parse_lit_str(
                input,
                "scope",
                "a scope such as `scope = \"billing::charge\"`",
            )?;
            if let Err(e) = check_scope(&lit) {
                self.errors.push(e);
            }
            self.set(|a| &mut a.scope, "scope", name_span, lit)
        } else if input.peek(kw::store) {
            input.parse::<kw::store>()?;
            input.parse::<Token![=]>()?;
            let expr = input.parse()?;
            self.set(|a| &mut a.store, "store", name_span, expr)
        } else if input.peek(kw::fingerprint) {
            input.parse::<kw::fingerprint>()?;
            input.parse::<Token![=]>()?;
            let fp =
                if input.peek(kw::none) && (input.peek2(Token![,]) || peek_end_after_one(input)) {
                    input.parse::<kw::none>()?;
                    FingerprintArg::None
                } else {
                    FingerprintArg::Expr(Box::new(input.parse()?))
                };
            self.set(|a| &mut a.fingerprint, "fingerprint", name_span, fp)
        } else if input.peek(kw::skip) {
            input.parse::<kw::skip>()?;
            let content;
            syn::parenthesized!(content in input);
            let names = content.parse_terminated(parse_skip_name, Token![,])?;
            let names = names.into_iter().collect();
            self.set(|a| &mut a.skip, "skip", name_span, names)
        } else if input.peek(kw::codec) {
            input.parse::<kw::codec>()?;
            input.parse::<Token![=]>()?;
            let expr = input.parse()?;
            self.set(|a| &mut a.codec, "codec", name_span, expr)
        } else if input.peek(kw::version) {
            input.parse::<kw::version>()?;
            input.parse::<Token![=]>()?;
            let version = self.parse_version(input)?;
            self.set(|a| &mut a.version, "version", name_span, version)
        } else if input.peek(kw::__impl) {
            input.parse::<kw::__impl>()?;
            input.parse::<Token![=]>()?;
            let lit: LitStr = input.parse()?;
            self.set(|a| &mut a.impl_path, "__impl", name_span, lit)
        } else {
            self.parse_behaviour(input, name_span)
        }
    }

    /// One option that says how a call behaves (its times, what it does with a duplicate,
    /// a lost lease, an error, a missing key), or an unknown option's error.
    fn parse_behaviour(&mut self, input: ParseStream<'_>, name_span: Span) -> syn::Result<()> {
        if input.peek(kw::ttl) {
            input.parse::<kw::ttl>()?;
            let d = self.parse_duration(input)?;
            self.set(|a| &mut a.ttl, "ttl", name_span, d)
        } else if input.peek(kw::lease) {
            input.parse::<kw::lease>()?;
            let d = self.parse_duration(input)?;
            self.set(|a| &mut a.lease, "lease", name_span, d)
        } else if input.peek(kw::wait_timeout) {
            input.parse::<kw::wait_timeout>()?;
            let d = self.parse_duration(input)?;
            self.set(|a| &mut a.wait_timeout, "wait_timeout", name_span, d)
        } else if input.peek(kw::in_progress) {
            input.parse::<kw::in_progress>()?;
            let mode = self.parse_in_progress(input)?;
            self.set(|a| &mut a.in_progress, "in_progress", name_span, mode)
        } else if input.peek(kw::lease_loss) {
            input.parse::<kw::lease_loss>()?;
            let mode = self.parse_lease_loss(input)?;
            self.set(|a| &mut a.lease_loss, "lease_loss", name_span, mode)
        } else if input.peek(kw::cache_errors) {
            input.parse::<kw::cache_errors>()?;
            let pred = if input.peek(Token![=]) {
                input.parse::<Token![=]>()?;
                Some(input.parse()?)
            } else {
                None
            };
            self.set(|a| &mut a.cache_errors, "cache_errors", name_span, pred)
        } else if input.peek(kw::at_most_once) {
            input.parse::<kw::at_most_once>()?;
            no_value(input, "at_most_once")?;
            self.set(|a| &mut a.at_most_once, "at_most_once", name_span, ())
        } else if input.peek(kw::clone_cached) {
            input.parse::<kw::clone_cached>()?;
            no_value(input, "clone_cached")?;
            self.set(|a| &mut a.clone_cached, "clone_cached", name_span, ())
        } else if input.peek(kw::missing_key) {
            input.parse::<kw::missing_key>()?;
            let mode = self.parse_missing_key(input)?;
            self.set(|a| &mut a.missing_key, "missing_key", name_span, mode)
        } else {
            Err(unknown_option(input)?)
        }
    }

    /// `= <integer>`: a non-literal is kept (for its spans) and refused.
    fn parse_version(&mut self, input: ParseStream<'_>) -> syn::Result<syn::LitInt> {
        if !input.peek(syn::LitInt) {
            let expr: Expr = input.parse()?;
            let span = expr.span();
            self.stray.push(expr);
            return Err(syn::Error::new(
                span,
                "`version` takes an integer literal, like `version = 2`: it is written into every stored record, so it is fixed in the source",
            ));
        }
        let lit: syn::LitInt = input.parse()?;
        if let Err(e) = lit.base10_parse::<u64>() {
            self.errors.push(syn::Error::new(
                lit.span(),
                format!("`version` takes a whole number from 0 up (a u64): {e}"),
            ));
        }
        Ok(lit)
    }

    /// `= "reject"` or `= "wait"`.
    fn parse_in_progress(&mut self, input: ParseStream<'_>) -> syn::Result<InProgressMode> {
        input.parse::<Token![=]>()?;
        let lit = self.parse_lit_str(
            input,
            "in_progress",
            "`in_progress = \"reject\"` or `in_progress = \"wait\"`",
        )?;
        Ok(match lit.value().as_str() {
            "reject" => InProgressMode::Reject,
            "wait" => InProgressMode::Wait,
            other => {
                self.errors.push(syn::Error::new(
                    lit.span(),
                    format!("unknown `in_progress` value `{other:?}`; expected \"reject\" (answer `idem::Error::InProgress` at once) or \"wait\" (wait for the first call's result)"),
                ));
                InProgressMode::Reject
            }
        })
    }

    /// `= "cancel"` or `= "finish"`.
    fn parse_lease_loss(&mut self, input: ParseStream<'_>) -> syn::Result<LeaseLossMode> {
        input.parse::<Token![=]>()?;
        let lit = self.parse_lit_str(
            input,
            "lease_loss",
            "`lease_loss = \"cancel\"` or `lease_loss = \"finish\"`",
        )?;
        Ok(match lit.value().as_str() {
            "cancel" => LeaseLossMode::Cancel,
            "finish" => LeaseLossMode::Finish,
            other => {
                self.errors.push(syn::Error::new(
                    lit.span(),
                    format!("unknown `lease_loss` value `{other:?}`; expected \"cancel\" (drop the body when its lease is lost) or \"finish\" (let it run to its end)"),
                ));
                LeaseLossMode::Cancel
            }
        })
    }

    /// `= "error"` or `= "run"`.
    fn parse_missing_key(&mut self, input: ParseStream<'_>) -> syn::Result<MissingKeyMode> {
        input.parse::<Token![=]>()?;
        let lit = self.parse_lit_str(
            input,
            "missing_key",
            "`missing_key = \"error\"` or `missing_key = \"run\"`",
        )?;
        Ok(match lit.value().as_str() {
            "error" => MissingKeyMode::Error,
            "run" => MissingKeyMode::Run,
            other => {
                self.errors.push(syn::Error::new(
                    lit.span(),
                    format!("unknown `missing_key` value `{other:?}`; expected \"error\" (a `None` key answers `idem::Error::MissingKey`) or \"run\" (a `None` key runs the body without idempotency)"),
                ));
                MissingKeyMode::Error
            }
        })
    }

    /// Records an option, or an error at its name when it was already given.
    fn set<T>(
        &mut self,
        field: impl FnOnce(&mut Args) -> &mut Option<Opt<T>>,
        name: &str,
        span: Span,
        value: T,
    ) -> syn::Result<()> {
        let slot = field(self);
        if slot.is_some() {
            self.errors.push(syn::Error::new(
                span,
                format!("duplicate option `{name}`: it is already set earlier in this attribute"),
            ));
        } else {
            *slot = Some(Opt { name: span, value });
        }
        Ok(())
    }

    /// A string literal, or the error that says which one `option` takes.
    fn parse_lit_str(
        &mut self,
        input: ParseStream<'_>,
        option: &str,
        example: &str,
    ) -> syn::Result<LitStr> {
        if input.peek(LitStr) {
            return input.parse();
        }
        let expr: Expr = input.parse()?;
        let span = expr.span();
        self.stray.push(expr);
        Err(syn::Error::new(
            span,
            format!("`{option}` takes a string literal: {example}"),
        ))
    }

    /// `= "30s"` (checked now) or `= <expr>` (any `Duration`).
    fn parse_duration(&mut self, input: ParseStream<'_>) -> syn::Result<DurationArg> {
        input.parse::<Token![=]>()?;
        if input.peek(LitStr) {
            let lit: LitStr = input.parse()?;
            match parse_duration_ms(&lit.value()) {
                Ok(ms) => Ok(DurationArg::Millis(ms, lit.span())),
                Err(why) => {
                    self.errors.push(syn::Error::new(
                        lit.span(),
                        format!(
                            "invalid duration {:?}: {why}; write a whole number and a unit, like \"250ms\", \"30s\", \"5m\", \"24h\" or \"7d\", or give a `std::time::Duration` expression",
                            lit.value()
                        ),
                    ));
                    Ok(DurationArg::Millis(1, lit.span()))
                }
            }
        } else {
            Ok(DurationArg::Expr(Box::new(input.parse()?)))
        }
    }
}

/// `= "<path>"`: the path of the renamed `idem` dependency.
fn parse_crate_path(input: ParseStream<'_>) -> syn::Result<syn::Path> {
    input.parse::<Token![=]>()?;
    let lit: LitStr = input.parse()?;
    lit.parse::<syn::Path>().map_err(|_| {
        syn::Error::new(
            lit.span(),
            "`crate` takes the path of the renamed `idem` dependency, like `crate = \"my_idem\"`",
        )
    })
}

/// A flag option's error when a value follows it.
fn no_value(input: ParseStream<'_>, option: &str) -> syn::Result<()> {
    if input.peek(Token![=]) {
        return Err(syn::Error::new(
            input.span(),
            format!("`{option}` takes no value: write it alone, as in `#[idempotent(key = id, {option})]`"),
        ));
    }
    Ok(())
}

/// The error for an option #[idempotent] does not know, with the closest one it does.
fn unknown_option(input: ParseStream<'_>) -> syn::Result<syn::Error> {
    let unknown: proc_macro2::TokenTree = input.parse()?;
    let name = unknown.to_string();
    let hint = match closest_option(&name) {
        Some(option) => format!("did you mean `{option}`? "),
        None => String::new(),
    };
    Ok(syn::Error::new(
        unknown.span(),
        format!(
            "unknown option `{unknown}` of #[idempotent]; {hint}expected one of: {}",
            OPTIONS.join(", ")
        ),
    ))
}

/// Whether exactly one token is left (so that `fingerprint = none` is the keyword, while
/// `fingerprint = none.x` or `none(..)` stays an expression).
fn peek_end_after_one(input: ParseStream<'_>) -> bool {
    let fork = input.fork();
    fork.parse::<proc_macro2::TokenTree>().is_ok() && fork.is_empty()
}

fn parse_skip_name(input: ParseStream<'_>) -> syn::Result<Ident> {
    if input.peek(Token![self]) {
        let token: Token![self] = input.parse()?;
        return Ok(Ident::new("self", token.span));
    }
    input.parse()
}

fn check_scope(lit: &LitStr) -> syn::Result<()> {
    let scope = lit.value();
    let problem = if scope.is_empty() {
        "the scope is empty"
    } else if scope.contains('/') {
        "the scope contains `/`, which separates the scope from the key id in the store"
    } else if scope.len() > 256 {
        "the scope is longer than 256 bytes"
    } else {
        return Ok(());
    };
    Err(syn::Error::new(
        lit.span(),
        format!("invalid scope {scope:?}: {problem}"),
    ))
}

/// `"250ms"`, `"30s"`, `"5m"`, `"24h"`, `"7d"` -> milliseconds. At least 1ms.
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err("it does not start with a number".into());
    }
    let (number, unit) = text.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| "the number is too large".to_string())?;
    let per_unit: u64 = match unit.trim() {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "" => return Err("the unit is missing".into()),
        other => return Err(format!("`{other}` is not a unit (ms, s, m, h, d)")),
    };
    let ms = number
        .checked_mul(per_unit)
        .ok_or_else(|| "the duration is too large".to_string())?;
    if ms == 0 {
        return Err("a duration must be at least 1ms".into());
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::{closest_option, parse_duration_ms, Args};

    #[test]
    fn a_wrong_option_is_reported_and_the_others_still_parse() {
        let args: Args = syn::parse_quote!(
            tll = "1h",
            key = order.id,
            version = V,
            store = self.idem,
            in_progress = 3,
            crate = "my_idem"
        );
        let errors: Vec<String> = args.errors.iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[0].contains("unknown option `tll`"), "{errors:?}");
        assert!(
            errors[1].contains("`version` takes an integer literal"),
            "{errors:?}"
        );
        assert!(
            errors[2].contains("`in_progress` takes a string literal"),
            "{errors:?}"
        );
        assert!(args.key.is_some() && args.store.is_some() && args.krate.is_some());
        assert!(args.version.is_none() && args.in_progress.is_none());
        assert_eq!(args.stray.len(), 2, "`V` and `3` are kept for the fallback");
    }

    #[test]
    fn duration_literals() {
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("30s"), Ok(30_000));
        assert_eq!(parse_duration_ms("5m"), Ok(300_000));
        assert_eq!(parse_duration_ms("24h"), Ok(86_400_000));
        assert_eq!(parse_duration_ms("7d"), Ok(604_800_000));
        assert!(parse_duration_ms("0s").is_err());
        assert!(parse_duration_ms("30").is_err());
        assert!(parse_duration_ms("s").is_err());
        assert!(parse_duration_ms("1.5s").is_err());
        assert!(parse_duration_ms("3 weeks").is_err());
        assert!(parse_duration_ms("99999999999999999999h").is_err());
    }

    #[test]
    fn typos_suggest_the_option_they_meant() {
        for (typo, meant) in [
            ("tll", "ttl"),
            ("ttls", "ttl"),
            ("leas", "lease"),
            ("in_progres", "in_progress"),
            ("inprogress", "in_progress"),
            ("wait_timout", "wait_timeout"),
            ("fingerprnt", "fingerprint"),
            ("cache_error", "cache_errors"),
            ("Key", "key"),
            ("scop", "scope"),
            ("missingkey", "missing_key"),
        ] {
            assert_eq!(closest_option(typo), Some(meant), "{typo}");
        }
        for unrelated in ["timeout", "retries", "x", "idempotency"] {
            assert_eq!(closest_option(unrelated), None, "{unrelated}");
        }
    }
}
