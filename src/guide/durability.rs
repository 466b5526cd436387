#![doc = include_str!("durability.md")]
