#![doc = include_str!("promise.md")]
