//! The README's Rust examples compile as a user of `idem` writes them. Each ```rust block is
//! a fragment (it uses a `req` or a `gateway` the prose introduces), so each is compiled
//! inside the context its prose gives it: the types it names, and an `async fn` around the
//! statements. A block this test does not know fails it, so a new example gets a context.
#![cfg(feature = "testing")]

use std::path::PathBuf;

/// The application types the examples name.
const APP: &str = r#"
#![allow(dead_code, unused_variables, unused_imports)]
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct ChargeRequest { pub order_id: String, pub cents: u64 }
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Receipt { pub id: String }
#[derive(Debug)]
pub enum PaymentError { Declined, Idem(idem::Error) }
impl From<idem::Error> for PaymentError {
    fn from(e: idem::Error) -> Self { PaymentError::Idem(e) }
}
impl std::fmt::Display for PaymentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "{self:?}") }
}
impl std::error::Error for PaymentError {}
pub struct Gateway;
impl Gateway {
    pub async fn charge(&self, req: &ChargeRequest) -> Result<Receipt, PaymentError> {
        Ok(Receipt { id: req.order_id.clone() })
    }
}
"#;

/// Statements of a block, inside an async fn that has what the prose gave them.
fn in_async_fn(params: &str, prelude: &str, block: &str) -> String {
    format!(
        "{APP}\n{prelude}\nasync fn example({params}) -> Result<(), Box<dyn std::error::Error>> {{\n{block}\nOk(())\n}}\nfn main() {{}}\n"
    )
}

/// The program that compiles `block`, by what the block is.
fn program(block: &str) -> Option<String> {
    if block.contains("struct Payments") {
        // Items: the usage example.
        return Some(format!("{APP}\n{block}\nfn main() {{}}\n"));
    }
    if block.contains("idem::connect(\"sqlite://idem.db\")") {
        // The engine API, with the request and gateway of the usage example.
        return Some(in_async_fn(
            "req: ChargeRequest, gateway: Gateway",
            "",
            block,
        ));
    }
    if block.contains(".with_outcome()") {
        // The replay signal, right after the engine API block (whose `use` it relies on).
        return Some(in_async_fn(
            "idem: idem::Idem, key: idem::Key, req: ChargeRequest, gateway: Gateway",
            "use idem::Fingerprint;",
            block,
        ));
    }
    if block.contains("IdempotencyLayer::new(idem)") {
        // The HTTP layer on an axum router, with the service's two handlers.
        let prelude = r#"
use axum::routing::{get, post};
use axum::Router;
use idem::http::IdempotencyLayer;
async fn charge() -> &'static str { "charged" }
async fn get_payment() -> &'static str { "payment" }
"#;
        return Some(format!(
            "{APP}\n{prelude}\nfn example(idem: idem::Idem) -> Router {{\n{block}\napp\n}}\nfn main() {{}}\n"
        ));
    }
    if block.contains("mark_processed_in") {
        // The transactional dedup of a consumer, on a Postgres store.
        return Some(in_async_fn(
            "store: idem::stores::PostgresStore, key: idem::Key, ttl: std::time::Duration, order_id: String",
            "use idem::Delivery;",
            block,
        ));
    }
    if block.contains("conformance_tests!") {
        // Your own store's test file.
        let store = r#"
#[derive(Debug, Default)]
pub struct MyStore(idem::MemoryStore);
impl idem::StoreWrapper for MyStore {
    type Inner = idem::MemoryStore;
    fn inner(&self) -> &idem::MemoryStore { &self.0 }
}
impl MyStore { pub async fn connect() -> MyStore { MyStore::default() } }
"#;
        return Some(format!("{APP}\n{store}\n{block}\nfn main() {{}}\n"));
    }
    None
}

/// Blocks that need a client crate the facade's tests do not depend on (an sqlx pool, a
/// redis connection manager); what they name from idem is compiled by the stores' own
/// doc examples and tests.
fn needs_a_client_crate(block: &str) -> bool {
    block.contains("PostgresStore::new(pool)") || block.contains("from_connection_manager")
}

fn rust_blocks(readme: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in readme.lines() {
        match (&mut current, line.trim_start()) {
            (None, l) if l.starts_with("```rust") => current = Some(String::new()),
            (Some(_), l) if l.starts_with("```") => blocks.extend(current.take()),
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn readme_examples_compile() {
    let readme = include_str!("../README.md");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("readme");
    std::fs::create_dir_all(&dir).unwrap();
    let cases = trybuild::TestCases::new();
    let mut compiled = 0;
    for (i, block) in rust_blocks(readme).iter().enumerate() {
        if needs_a_client_crate(block) {
            continue;
        }
        let Some(program) = program(block) else {
            panic!("README block {i} has no context in tests/readme.rs:\n{block}");
        };
        let path = dir.join(format!("block_{i}.rs"));
        std::fs::write(&path, program).unwrap();
        cases.pass(&path);
        compiled += 1;
    }
    assert_eq!(compiled, 6, "the README's compilable examples");
}
