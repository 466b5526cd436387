//! The expansion names everything by absolute path and keeps its locals to itself: the
//! user's `Result`, `Option`, `core`, `idem`-like names and `__idem_*` locals change
//! nothing.
#![allow(dead_code, non_camel_case_types)]

mod core {}
struct Option;
struct Some;
type Result = u8;
struct Duration;
mod __private {}

mod deps {
    pub use idem as renamed;
}

#[idem::idempotent(crate = "crate::deps::renamed", ttl = "1h")]
async fn renamed(__idem_engine: u32, __idem_key: u32) -> u32 {
    let __idem_ret = __idem_engine + __idem_key;
    __idem_ret
}

#[idem::idempotent]
async fn returns_early(n: u32) -> u32 {
    if n > 10 {
        return 10;
    }
    n
}

#[idem::idempotent]
async fn unit(n: u32) {
    let _ = n;
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // The functions without `store = ...` run on the global engine.
        let _ = idem::set_global(idem::Idem::new(idem::MemoryStore::new()));
        assert_eq!(renamed(1, 2).await.unwrap(), 3);
        assert_eq!(returns_early(11).await.unwrap(), 10);
        unit(1).await.unwrap();
    });
}
