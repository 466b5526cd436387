//! Store backends for [idem](https://docs.rs/idem).
//!
//! [`MemoryStore`] is always there. The others come with cargo features: `redis`,
//! `redis-cluster`, `postgres`, `sqlite`. [`connect`] picks one from a URL.
#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod connect;
pub mod memory;

pub use connect::connect;
pub use memory::MemoryStore;
