#![doc = include_str!("first_steps.md")]
