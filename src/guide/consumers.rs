#![doc = include_str!("consumers.md")]
