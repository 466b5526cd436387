//! The conformance suite: every store backend passes it (feature `testing`).
//!
//! Each behaviour of the store contract is one async function of this module that takes
//! the store as an `Arc<dyn Store>` and panics when the store breaks the contract; its
//! name is in [`BEHAVIOURS`] and its doc comment in the source says what it checks, in one
//! file per area of the contract under `testing/`: the record round trips (`records.rs`),
//! leases and fencing (`fencing.rs`), requests resent after a lost reply (`repeats.rs`),
//! keys and payloads (`keys.rs`), [`Store::replace`](crate::Store::replace) (`replace.rs`),
//! and the store through the engine (`engine.rs`) and consumer dedup (`dedup.rs`).
//! [`conformance_tests!`](crate::conformance_tests) stamps one named
//! `#[tokio::test]` per behaviour for a backend, so that its tests read
//! `memory::lease_takeover_after_lease_ends`, `redis::fencing_stale_token_cannot_complete`,
//! and so on. The functions are hidden from the API: a store runs them through the macro.
//!
//! To run it against your own store, depend on `idem` with the `testing` feature and on
//! `tokio` with the features the stamped tests use, in your dev-dependencies:
//!
//! ```toml
//! [dev-dependencies]
//! idem = { package = "idemkit", version = "0.1", features = ["testing"] }
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! then, in a test file (`tests/conformance.rs`), one line per store:
//!
//! ```text
//! idem::conformance_tests!(my_store, async { Some(MyStore::connect().await) });
//! ```
//!
//! The second argument is a future that yields `Option<store>`: `None` skips the test (a
//! backend whose server is not configured prints why, and panics instead when
//! `IDEM_REQUIRE_BACKENDS=1`; see [`backend_url`]).
//!
//! Behaviours that only some backends offer are [`Capabilities`](crate::Capabilities) flags; the suite checks
//! each flag both ways rather than skipping.
//!
//! Timing: leases and ttls in the suite are a few hundred milliseconds of real time, so the
//! suite runs against remote stores whose clock is their own.

mod dedup;
mod engine;
mod fencing;
mod keys;
mod records;
mod repeats;
mod replace;
mod skips;
mod support;

#[doc(hidden)]
pub use dedup::*;
#[doc(hidden)]
pub use engine::*;
#[doc(hidden)]
pub use fencing::*;
#[doc(hidden)]
pub use keys::*;
#[doc(hidden)]
pub use records::*;
#[doc(hidden)]
pub use repeats::*;
#[doc(hidden)]
pub use replace::*;

pub use skips::skip;
#[doc(hidden)]
pub use skips::skipped;
pub use support::{backend_url, unique_scope};

/// Every behaviour, by name: what [`conformance_tests!`](crate::conformance_tests) stamps.
pub const BEHAVIOURS: &[&str] = crate::__conformance_behaviours!(__behaviour_names!());

/// Stamps one `#[tokio::test]` per conformance behaviour into a module named `$backend`.
///
/// `$make` is an expression, evaluated once per test, of a future that yields
/// `Option<S>` for a `S: Store` (`None` skips, see [`backend_url`]). The crate using it
/// needs `tokio` with the `macros` and `rt-multi-thread` features among its dev-dependencies
/// (the stamped tests are `#[tokio::test]`s); see the [module documentation](crate::testing).
///
/// ```text
/// idem::conformance_tests!(memory, async { Some(idem::MemoryStore::new()) });
/// ```
///
/// A store on tokio's clock (the memory store) can run the suite on a paused clock:
/// `conformance_tests!(memory, paused, async { ... })` stamps
/// `#[tokio::test(start_paused = true)]` tests instead, so that its leases and expiries
/// end exactly when the suite says rather than after real sleeps.
#[macro_export]
macro_rules! conformance_tests {
    ($backend:ident, paused, $make:expr) => {
        $crate::__conformance_behaviours!(__conformance_tests!(
            $backend,
            $make,
            (start_paused = true),
        ));
    };
    ($backend:ident, $make:expr) => {
        $crate::__conformance_behaviours!(__conformance_tests!(
            $backend,
            $make,
            (flavor = "multi_thread", worker_threads = 4),
        ));
    };
}

/// The one list of behaviours: hands it to the macro named in its argument, after that
/// macro's own arguments. `BEHAVIOURS` and `conformance_tests!` both read it from here.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_behaviours {
    ($callback:ident!($($args:tt)*)) => {
        $crate::$callback! {$($args)* [
            claim_fresh_key_is_acquired,
            claim_held_key_is_in_progress,
            complete_then_claim_replays_payload,
            release_lets_next_claim_acquire,
            get_missing_is_none,
            get_sees_in_progress_then_completed,
            delete_removes_record,
            delete_missing_is_false,
            completed_record_expires_after_ttl,
            completed_record_outlives_its_lease,
            lease_takeover_after_lease_ends,
            extend_keeps_lease_alive,
            fencing_stale_token_cannot_complete,
            fencing_stale_token_cannot_extend,
            fencing_stale_token_cannot_release,
            fencing_unknown_token_is_refused,
            fences_increase_with_every_claim,
            claim_repeated_with_same_token_is_acquired_again,
            claim_with_another_token_while_held_is_in_progress,
            complete_repeated_with_same_token_keeps_the_first_result,
            extend_repeated_with_same_token_is_ok,
            release_repeated_with_same_token_is_ok,
            release_after_complete_is_fenced,
            delete_of_an_ended_claim_leaves_nothing,
            concurrent_claims_have_one_winner,
            empty_payload_round_trips,
            large_payload_round_trips,
            binary_payload_round_trips,
            unicode_keys_are_distinct,
            long_keys_are_distinct,
            special_character_keys_are_distinct,
            control_character_keys_are_distinct,
            scopes_keep_equal_ids_apart,
            fingerprint_is_kept,
            wait_capability_is_honest,
            engine_runs_once_and_replays,
            engine_undecodable_result_is_a_decode_error_naming_the_key,
            engine_concurrent_duplicates_wait_for_one_run,
            engine_body_sees_its_fence,
            dedup_marks_once_and_tells_duplicates,
            dedup_concurrent_deliveries_have_one_first,
            dedup_refuses_a_reused_id_with_another_payload,
            replace_swaps_only_the_completed_payload_it_expects,
            replace_sets_the_new_records_ttl,
            concurrent_replaces_have_one_winner,
        ]}
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __behaviour_names {
    ([$($name:ident),* $(,)?]) => {
        &[$(stringify!($name)),*]
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($backend:ident, $make:expr, $flavor:tt, [$($name:ident),* $(,)?]) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[::tokio::test $flavor]
                async fn $name() {
                    let Some(store) = ($make).await else { return };
                    let store: ::std::sync::Arc<dyn $crate::Store> = ::std::sync::Arc::new(store);
                    $crate::testing::$name(store).await;
                }
            )*
        }
    };
}

#[cfg(test)]
mod tests {
    /// Every scenario function is in the list that `conformance_tests!` stamps.
    #[test]
    fn every_scenario_is_stamped() {
        let src = [
            include_str!("testing.rs"),
            include_str!("testing/records.rs"),
            include_str!("testing/fencing.rs"),
            include_str!("testing/repeats.rs"),
            include_str!("testing/keys.rs"),
            include_str!("testing/engine.rs"),
            include_str!("testing/dedup.rs"),
            include_str!("testing/replace.rs"),
        ];
        let scenarios: Vec<&str> = src
            .iter()
            .flat_map(|file| file.lines())
            .filter_map(|l| l.strip_prefix("pub async fn "))
            .filter_map(|l| l.split('(').next())
            .collect();
        assert!(scenarios.len() >= 20, "{scenarios:?}");
        for name in &scenarios {
            assert!(
                super::BEHAVIOURS.contains(name),
                "{name} is not in the conformance list"
            );
        }
        assert_eq!(scenarios.len(), super::BEHAVIOURS.len());
    }
}
