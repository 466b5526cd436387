//! What idem costs on top of the work it guards, measured against hand-written baselines in
//! the same run: read the ratios, not the absolute times.
//!
//! `cargo bench --bench engine`
//!
//! - replay: a duplicate call answered from the memory store, vs a bare `DashMap` lookup plus
//!   JSON decode (the least a hand-rolled result cache does).
//! - first_call: claim, run, store on a fresh key, vs a bare `DashMap` insert plus JSON encode.
//! - key_digest: the blake3 key digest of a request struct, vs hashing its JSON by hand
//!   (`serde_json::to_vec` + `blake3::hash`), the obvious hand-written alternative.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use dashmap::DashMap;
use idem::{Fingerprint, Idem, Key, MemoryStore};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Receipt {
    charge_id: String,
    amount_cents: u64,
    currency: String,
    captured: bool,
}

#[derive(Serialize)]
struct ChargeRequest<'a> {
    order_id: &'a str,
    amount_cents: u64,
    currency: &'a str,
    customer: &'a str,
}

fn receipt() -> Receipt {
    Receipt {
        charge_id: "ch_3PqZ8rLkdIwHu7ix0hZWfBk2".into(),
        amount_cents: 1250,
        currency: "EUR".into(),
        captured: true,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn replay(c: &mut Criterion) {
    let rt = runtime();
    let idem = Idem::new(MemoryStore::new());
    let cached = Idem::builder()
        .store(MemoryStore::new())
        .local_cache(1024, std::time::Duration::from_secs(60))
        .build()
        .unwrap();
    let key = Key::new("bench::charge", "order-42").unwrap();
    let fp = Fingerprint::of("payload");
    for engine in [&idem, &cached] {
        rt.block_on(engine.call(key.clone(), fp).run(|| async { receipt() }))
            .unwrap();
    }
    let baseline: DashMap<String, Vec<u8>> = DashMap::new();
    baseline.insert(
        key.as_str().to_owned(),
        serde_json::to_vec(&receipt()).unwrap(),
    );

    let mut g = c.benchmark_group("replay");
    g.bench_function("baseline: dashmap get + json decode", |b| {
        b.iter(|| {
            let bytes = baseline.get(key.as_str()).unwrap();
            let r: Receipt = serde_json::from_slice(&bytes).unwrap();
            r
        })
    });
    g.bench_function("idem memory store", |b| {
        b.to_async(&rt).iter(|| async {
            let r: Receipt = idem
                .call(key.clone(), fp)
                .run(|| async { receipt() })
                .await
                .unwrap();
            r
        })
    });
    g.bench_function("idem memory store + local cache", |b| {
        b.to_async(&rt).iter(|| async {
            let r: Receipt = cached
                .call(key.clone(), fp)
                .run(|| async { receipt() })
                .await
                .unwrap();
            r
        })
    });
    g.finish();
}

fn first_call(c: &mut Criterion) {
    let rt = runtime();
    let idem = Idem::new(MemoryStore::new());
    let n = Arc::new(AtomicU64::new(0));
    let baseline: DashMap<String, Vec<u8>> = DashMap::new();
    let fp = Fingerprint::of("payload");

    let mut g = c.benchmark_group("first_call");
    g.bench_function("baseline: dashmap insert + json encode", |b| {
        b.iter_batched(
            || format!("bench::charge/order-{}", n.fetch_add(1, Ordering::Relaxed)),
            |k| {
                baseline.insert(k, serde_json::to_vec(&receipt()).unwrap());
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("idem memory store", |b| {
        b.to_async(&rt).iter_batched(
            || {
                Key::new(
                    "bench::charge",
                    format!("order-{}", n.fetch_add(1, Ordering::Relaxed)),
                )
                .unwrap()
            },
            |k| async {
                let r: Receipt = idem.call(k, fp).run(|| async { receipt() }).await.unwrap();
                r
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn key_digest(c: &mut Criterion) {
    let req = ChargeRequest {
        order_id: "order-42",
        amount_cents: 1250,
        currency: "EUR",
        customer: "cus_9s6XKzkNRiz8i3",
    };
    let mut g = c.benchmark_group("key_digest");
    g.bench_function("baseline: serde_json::to_vec", |b| {
        b.iter(|| serde_json::to_vec(&req).unwrap())
    });
    g.bench_function("baseline: serde_json::to_vec + blake3::hash", |b| {
        b.iter(|| blake3::hash(&serde_json::to_vec(&req).unwrap()))
    });
    g.bench_function("idem digest_hex", |b| b.iter(|| idem::digest_hex(&req)));
    g.bench_function("idem Fingerprint::of", |b| b.iter(|| Fingerprint::of(&req)));
    g.finish();
}

criterion_group!(benches, replay, first_call, key_digest);
criterion_main!(benches);
