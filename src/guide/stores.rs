#![doc = include_str!("stores.md")]
