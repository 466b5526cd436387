//! The digest encoder: any JSON value the bytes parse to (maps, nesting, numbers of every
//! kind, strings of any content) digests without a panic to 32 hex digits, the same twice,
//! and the same whatever the order of a map's entries.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let d = idem_core::digest_hex(&value);
        assert_eq!(d.len(), 32);
        assert!(d.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(d, idem_core::digest_hex(&value));
        if let serde_json::Value::Object(map) = &value {
            let reversed: Vec<(&String, &serde_json::Value)> = map.iter().rev().collect();
            let sorted: BTreeMap<&String, &serde_json::Value> = reversed.into_iter().collect();
            assert_eq!(d, idem_core::digest_hex(&sorted));
        }
    }
    // Raw strings and byte strings of any content too.
    let text = String::from_utf8_lossy(data);
    assert_eq!(idem_core::digest_hex(&text).len(), 32);
    assert_eq!(idem_core::digest_hex(data).len(), 32);
});
