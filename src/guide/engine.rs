#![doc = include_str!("engine.md")]
