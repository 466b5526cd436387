//! Destructuring argument patterns: every binding is digested and can be skipped.
use idem::idempotent;
use serde::Serialize;

#[derive(Serialize)]
pub struct Point {
    pub x: i64,
    pub y: i64,
}

pub struct Conn;

#[idempotent]
async fn area((w, h): (u32, u32), Point { x, y }: Point) -> i64 {
    i64::from(w * h) + x + y
}

#[idempotent(skip(conn))]
async fn with_conn((conn, id): (Conn, u64), mut extra: Vec<u8>) -> usize {
    let _ = conn;
    extra.push(1);
    extra.len() + id as usize
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // The functions without `store = ...` run on the global engine.
    let _ = idem::set_global(idem::Idem::new(idem::MemoryStore::new()));
    assert_eq!(area((2, 3), Point { x: 1, y: 1 }).await.unwrap(), 8);
    assert_eq!(with_conn((Conn, 1), vec![]).await.unwrap(), 2);
}
