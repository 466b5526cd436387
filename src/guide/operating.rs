#![doc = include_str!("operating.md")]
