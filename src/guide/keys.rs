#![doc = include_str!("keys.md")]
