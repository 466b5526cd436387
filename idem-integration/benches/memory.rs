//! What `#[idempotent]` costs on the memory store, measured against what a user would write
//! instead, in the same run: read the ratios (`BENCHMARKS.md`), not the absolute times.
//!
//! `cargo bench -p idem-integration --bench memory`
//!
//! Every idem side is the attribute as users write it, on a 4-field request taken by value
//! (`#[idempotent(key = req.order_id)] async fn charge(req: ChargeRequest) -> Receipt`), and
//! every baseline is an `async fn` with the same signature, so that both pay for the request
//! clone and the runtime alike.
//!
//! - `memory_replay`: a duplicate answered from the global memory store, vs a hand-written
//!   `DashMap<String, Vec<u8>>` lookup plus JSON decode (the same codec idem uses).
//! - `local_cache_replay`: a duplicate answered from the local cache, vs a hit of the
//!   `cached` crate's `#[cached]` on the same function.
//! - `memory_first_call`: a new order (claim, run, store), vs the hand-written miss, encode
//!   and insert.
//! - `memory_scaling`: replays of 1,024 orders on 1 and on 2 OS threads (each its own
//!   current-thread runtime, as a service's worker threads are); the time is per call, so
//!   `threads_1 / threads_2` is the throughput gained by the second core. The
//!   `by_hand_threads_*` pair does the same with the hand-written check, to show how far a
//!   shared `DashMap` scales on the same machine.
//! - `digest`: what a fingerprint of the request costs beside hashing its JSON by hand.
//! - `replay_parts`: the parts of a replay alone (key, fingerprint, the store's claim, the
//!   envelope and decode), to see what the call around them adds.
//!
//! The replay groups also time `idem_fingerprint_none`: the same function with
//! `fingerprint = none`, which checks no payload, as neither baseline does.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, LazyLock};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use idem::{idempotent, Fingerprint, Idem, MemoryStore};
#[path = "support/memory_pair.rs"]
mod memory_pair;
mod support;

use memory_pair::{charge, charge_by_hand, charge_by_hand_checked, charge_unchecked};
use support::{receipt_for, request, ChargeRequest, Receipt};

// ---------------------------------------------------------------------------------------
// idem, as users write it.

fn cached_engine() -> &'static Idem {
    static ENGINE: LazyLock<Idem> = LazyLock::new(|| {
        Idem::builder()
            .store(MemoryStore::new())
            .local_cache(10_000, Duration::from_secs(3600))
            .build()
            .expect("a memory engine with a local cache")
    });
    &ENGINE
}

/// On an engine with a local cache in front of its memory store; a hit answers a clone of
/// the decoded receipt, as `#[cached]` does (`clone_cached`).
#[idempotent(key = req.order_id, store = cached_engine(), clone_cached)]
async fn charge_local(req: ChargeRequest) -> Receipt {
    receipt_for(&req)
}

/// The local cache without a payload check.
#[idempotent(key = req.order_id, store = cached_engine(), fingerprint = none, clone_cached)]
async fn charge_local_unchecked(req: ChargeRequest) -> Receipt {
    receipt_for(&req)
}

// ---------------------------------------------------------------------------------------
// What users would write instead.

/// The `cached` crate's memoization of the same function, keyed by the order id.
#[cached::proc_macro::cached(key = "String", convert = r#"{ req.order_id.clone() }"#)]
async fn charge_cached(req: ChargeRequest) -> Receipt {
    receipt_for(&req)
}

// ---------------------------------------------------------------------------------------

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
}

fn memory_replay(c: &mut Criterion) {
    let rt = runtime();
    let req = request(42);
    rt.block_on(async {
        charge(req.clone()).await.expect("the first call");
        charge_unchecked(req.clone()).await.expect("the first call");
        charge_by_hand(req.clone()).await;
        charge_by_hand_checked(req.clone())
            .await
            .expect("the first call");
    });
    let mut g = c.benchmark_group("memory_replay");
    g.bench_function("baseline", |b| {
        b.to_async(&rt).iter(|| charge_by_hand(req.clone()))
    });
    g.bench_function("idem", |b| {
        b.to_async(&rt)
            .iter(|| async { charge(req.clone()).await.expect("a replay") })
    });
    g.bench_function("idem_fingerprint_none", |b| {
        b.to_async(&rt)
            .iter(|| async { charge_unchecked(req.clone()).await.expect("a replay") })
    });
    g.finish();
    // The fair pair for a replay with its payload check: the hand-written check that also
    // compares the request's JSON.
    let mut g = c.benchmark_group("memory_replay_checked");
    g.bench_function("baseline", |b| {
        b.to_async(&rt)
            .iter(|| async { charge_by_hand_checked(req.clone()).await.expect("a replay") })
    });
    g.bench_function("idem", |b| {
        b.to_async(&rt)
            .iter(|| async { charge(req.clone()).await.expect("a replay") })
    });
    g.finish();
}

fn local_cache_replay(c: &mut Criterion) {
    let rt = runtime();
    let req = request(42);
    rt.block_on(async {
        charge_local(req.clone()).await.expect("the first call");
        charge_local_unchecked(req.clone())
            .await
            .expect("the first call");
        charge_cached(req.clone()).await;
    });
    let mut g = c.benchmark_group("local_cache_replay");
    g.bench_function("cached", |b| {
        b.to_async(&rt).iter(|| charge_cached(req.clone()))
    });
    g.bench_function("idem", |b| {
        b.to_async(&rt)
            .iter(|| async { charge_local(req.clone()).await.expect("a replay") })
    });
    g.bench_function("idem_fingerprint_none", |b| {
        b.to_async(&rt)
            .iter(|| async { charge_local_unchecked(req.clone()).await.expect("a replay") })
    });
    g.finish();
}

fn memory_first_call(c: &mut Criterion) {
    let rt = runtime();
    // Orders never seen before, on both sides; making the request is setup, not measured.
    let next = AtomicU64::new(1_000_000);
    let fresh = || request(next.fetch_add(1, Ordering::Relaxed));
    let mut g = c.benchmark_group("memory_first_call");
    g.bench_function("baseline", |b| {
        b.to_async(&rt)
            .iter_batched(fresh, charge_by_hand, BatchSize::SmallInput)
    });
    g.bench_function("idem", |b| {
        b.to_async(&rt).iter_batched(
            fresh,
            |req| async { charge(req).await.expect("a first call") },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

/// `iters` replays spread over `threads` OS threads, each on its own current-thread runtime
/// and its own slice of the 1,024 stored orders; the time from a common start to the last
/// thread's end.
fn replays_on_threads(threads: usize, iters: u64, requests: &Arc<Vec<ChargeRequest>>) -> Duration {
    on_threads(threads, iters, requests, |req| async {
        black_box(charge(req).await.expect("a replay"));
    })
}

/// The same with the hand-written check: how far a shared `DashMap` itself scales here.
fn by_hand_on_threads(threads: usize, iters: u64, requests: &Arc<Vec<ChargeRequest>>) -> Duration {
    on_threads(threads, iters, requests, |req| async {
        black_box(charge_by_hand(req).await);
    })
}

/// `iters` calls of `call` spread over `threads` OS threads as described above.
fn on_threads<F, Fut>(
    threads: usize,
    iters: u64,
    requests: &Arc<Vec<ChargeRequest>>,
    call: F,
) -> Duration
where
    F: Fn(ChargeRequest) -> Fut + Copy + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (start, requests) = (start.clone(), requests.clone());
            let share = iters / threads as u64 + u64::from((t as u64) < iters % threads as u64);
            std::thread::spawn(move || {
                let rt = runtime();
                start.wait();
                rt.block_on(async {
                    for i in 0..share {
                        let req = &requests[(i as usize * threads + t) % requests.len()];
                        call(req.clone()).await;
                    }
                });
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    for h in handles {
        h.join().expect("a bench thread");
    }
    began.elapsed()
}

fn memory_scaling(c: &mut Criterion) {
    let requests: Arc<Vec<ChargeRequest>> = Arc::new((0..1024).map(request).collect());
    runtime().block_on(async {
        for req in requests.iter() {
            charge_by_hand(req.clone()).await;
            charge(req.clone()).await.expect("a first call");
        }
    });
    let mut g = c.benchmark_group("memory_scaling");
    for threads in [1, 2] {
        g.bench_function(format!("threads_{threads}"), |b| {
            b.iter_custom(|iters| replays_on_threads(threads, iters, &requests))
        });
        g.bench_function(format!("by_hand_threads_{threads}"), |b| {
            b.iter_custom(|iters| by_hand_on_threads(threads, iters, &requests))
        });
    }
    g.finish();
}

fn digest(c: &mut Criterion) {
    let req = request(42);
    let mut g = c.benchmark_group("digest");
    g.bench_function("serde_json::to_vec + blake3::hash", |b| {
        b.iter(|| blake3::hash(&serde_json::to_vec(black_box(&req)).expect("json")))
    });
    g.bench_function("Fingerprint::of", |b| {
        b.iter(|| Fingerprint::of(black_box(&req)))
    });
    g.finish();
}

/// The parts of a memory replay, each alone, as the engine does them: the key, the
/// fingerprint of the argument tuple, the claim through `dyn Store` (answered by the stored
/// record), and the envelope check plus JSON decode of the receipt. Their sum against
/// `memory_replay/idem` shows what the call around them costs (span, options, futures).
/// And the two store steps of a first call, against `memory_first_call`.
fn replay_parts(c: &mut Criterion) {
    let rt = runtime();
    let req = request(42);
    let store: Arc<dyn idem::store::Store> = Arc::new(MemoryStore::new());
    let scope = "memory::charge";
    let key = idem::Key::new(scope, &req.order_id).expect("a key");
    let fp = Fingerprint::of(&(&req,));
    let lease = Duration::from_secs(30);
    let payload = rt.block_on(async {
        let token = idem::store::Token::random();
        store.claim(&key, &fp, token, lease).await.expect("a claim");
        let sealed = idem_core::envelope::seal_value(&idem::codec::Json, 0, &receipt_for(&req))
            .expect("a receipt seals");
        store
            .complete(&key, token, sealed.into(), Duration::from_secs(3600))
            .await
            .expect("stored");
        match store
            .claim(&key, &fp, idem::store::Token::random(), lease)
            .await
        {
            Ok(idem::store::Claim::Completed { payload, .. }) => payload,
            other => panic!("expected the stored record, got {other:?}"),
        }
    });
    let mut g = c.benchmark_group("replay_parts");
    g.bench_function("key", |b| {
        b.iter(|| idem::Key::new(scope, black_box(&req.order_id)).expect("a key"))
    });
    g.bench_function("fingerprint", |b| {
        b.iter(|| Fingerprint::of(&(black_box(&req),)))
    });
    g.bench_function("store_claim", |b| {
        b.to_async(&rt).iter(|| async {
            store
                .claim(&key, &fp, idem::store::Token::random(), lease)
                .await
                .expect("the stored record")
        })
    });
    // A first call's two store steps on a key never seen (the map grows, as in
    // `memory_first_call`): the claim must be visible before the body runs, so it is its own
    // map access, and the complete another.
    let next = AtomicU64::new(0);
    let sealed: idem::store::Bytes =
        idem_core::envelope::seal_value(&idem::codec::Json, 0, &receipt_for(&req))
            .expect("a receipt seals")
            .into();
    g.bench_function("store_claim_and_complete", |b| {
        b.to_async(&rt).iter_batched(
            || {
                let order = next.fetch_add(1, Ordering::Relaxed);
                idem::Key::new(scope, format!("fresh-{order}")).expect("a key")
            },
            |key| {
                let (store, sealed) = (&store, &sealed);
                async move {
                    let token = idem::store::Token::random();
                    store.claim(&key, &fp, token, lease).await.expect("a claim");
                    store
                        .complete(&key, token, sealed.clone(), Duration::from_secs(3600))
                        .await
                        .expect("stored")
                }
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("open_and_decode", |b| {
        b.iter(|| {
            idem_core::envelope::open_value::<_, Receipt>(
                &idem::codec::Json,
                0,
                black_box(&payload),
            )
            .expect("a receipt")
        })
    });
    g.finish();
}

fn choose_global_engine(_: &mut Criterion) {
    // The functions without `store = ...` need a global engine: the memory store, as a
    // test would choose.
    let _ = idem::set_global(Idem::new(MemoryStore::new()));
}

criterion_group!(
    benches,
    choose_global_engine,
    memory_replay,
    local_cache_replay,
    memory_first_call,
    memory_scaling,
    digest,
    replay_parts
);
criterion_main!(benches);
