//! Keys: arbitrary scope and id (split at the first 0xff byte) never panic in `Key::new`;
//! a key is accepted exactly by the rules of ARCHITECTURE.md ("Keys"), keeps its parts,
//! shows without control characters, and two different (scope, id) pairs never share a
//! stored form. The store's own encoders (Redis record keys, Postgres' NUL escaping) are
//! exercised against live servers by `idem-integration/tests/reliability_keys.rs`.
#![no_main]

use idem::{Error, Key};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (a, b) = match data.iter().position(|&b| b == 0xff) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &b"id"[..]),
    };
    let (scope, id) = (String::from_utf8_lossy(a), String::from_utf8_lossy(b));
    let valid = !scope.is_empty()
        && scope.len() <= 256
        && !scope.contains('/')
        && !id.is_empty()
        && id.len() <= 1024;
    match Key::new(&*scope, &*id) {
        Ok(k) => {
            assert!(valid);
            assert_eq!(k.scope(), scope);
            assert_eq!(k.id(), id);
            assert_eq!(k.as_str(), format!("{scope}/{id}"));
            assert!(!k.to_string().chars().any(|c| c.is_control()));
            // The other split of the same text is another key, or the same pair.
            if let Some(at) = k.as_str().rfind('/') {
                let (s2, i2) = (&k.as_str()[..at], &k.as_str()[at + 1..]);
                if let Ok(k2) = Key::new(s2, i2) {
                    assert_eq!(k == k2, (s2, i2) == (&*scope, &*id));
                }
            }
        }
        Err(Error::InvalidKey { .. }) => assert!(!valid),
        Err(other) => panic!("{other:?}"),
    }
});
