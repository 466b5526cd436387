//! # The idem guide
//!
//! The README shows one function; this guide is the rest, in the order a new user meets
//! it. Every Rust example here is a doctest: `cargo test -p idem-integration --all-features
//! --doc guide` compiles and runs them on the memory store. Those that need a server
//! (Postgres, MySQL, Redis) are compiled with their feature and not run.
//!
//! 1. [First steps](first_steps): `#[idempotent]` on a function and on a method, the
//!    global engine, return types, telling a replay from a first run.
//! 2. [What a call does](calls): a first call, a replay, a concurrent duplicate, a crash
//!    and its takeover with fencing, as sequence diagrams.
//! 3. [The promise](promise): what "idempotent" guarantees, and what is refused.
//! 4. [Keys and records](keys): scopes, ids, digests, the stored envelope, codecs.
//! 5. [The engine API](engine): `Idem::call` without the macro, outcomes, options.
//! 6. [Steps](steps): operations with several side effects, each run once per key; a
//!    retry resumes after the last completed step; unknown outcomes held until resolved;
//!    calls inside calls.
//! 7. [Failures and timeouts](failures): store timeouts, and what an outage looks like to
//!    a caller.
//! 8. [Stores](stores): choosing one, your own store, the SQL stores, Redis.
//! 9. [Durability](durability): how durable a stored result is across a failover.
//! 10. [HTTP](http): the `Idempotency-Key` header as a tower layer, and a retrying client.
//! 11. [Jobs and consumers](consumers): at-least-once delivery made effective once, and
//!     dedup inside a database transaction.
//! 12. [Operating idem](operating): the `idem.call` span, metrics, TLS, the `idem` command.
//!
//! Contributors: `CONTRIBUTING.md` in the repository says how to run the backend tests,
//! the reliability suite, the benchmarks and the fuzzers.
//!
//! Each chapter is one Markdown file beside this one, `<chapter>.md`, declared below; a
//! chapter's sequence diagrams follow its text, each under a heading `Drawn: <title>`
//! that the text links to (`chapter!` puts them on the page).

/// A chapter's page: its Markdown, then each of its sequence diagrams under the heading
/// `Drawn: <title>`, the SVG `tools/seqdiag/seqdiag.py` writes from `diagrams/<name>.mmd`
/// followed by that mermaid source, folded. One string, so that each diagram's closing
/// HTML ends at a blank line.
macro_rules! chapter {
    ($markdown:literal $(, $title:literal => $name:literal)* $(,)?) => {
        concat!(
            include_str!($markdown),
            $(
                "\n## Drawn: ",
                $title,
                "\n\n",
                include_str!(concat!("diagrams/", $name, ".svg")),
                "\n\n<details><summary>mermaid source</summary>\n\n```mermaid\n",
                include_str!(concat!("diagrams/", $name, ".mmd")),
                "```\n\n</details>\n\n",
            )*
        )
    };
}

pub mod first_steps {
    #![doc = chapter!("first_steps.md")]
}

pub mod calls {
    #![doc = chapter!(
        "calls.md",
        "a first call" => "first_call",
        "a replay" => "replay",
        "a concurrent duplicate" => "concurrent",
        "a takeover" => "takeover",
    )]
}

pub mod promise {
    #![doc = chapter!("promise.md")]
}

pub mod keys {
    #![doc = chapter!("keys.md")]
}

pub mod engine {
    #![doc = chapter!("engine.md")]
}

pub mod steps {
    #![doc = chapter!(
        "steps.md",
        "an attempt resumed after a crash" => "steps_resumed",
        "a step held until resolved" => "steps_held",
    )]
}

pub mod failures {
    #![doc = chapter!("failures.md")]
}

pub mod stores {
    #![doc = chapter!("stores.md")]
}

pub mod durability {
    #![doc = chapter!("durability.md")]
}

pub mod http {
    #![doc = chapter!(
        "http.md",
        "the status flow" => "http_status",
    )]
}

pub mod consumers {
    #![doc = chapter!("consumers.md")]
}

pub mod operating {
    #![doc = chapter!("operating.md")]
}
