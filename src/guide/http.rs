#![doc = include_str!("http.md")]
