#![doc = include_str!("failures.md")]
