//! How much memory a completed record takes in the memory store, beside a hand-written
//! `DashMap<String, Vec<u8>>` holding the same keys and payloads.
//!
//! `cargo bench -p idem-integration --bench footprint`
//!
//! Each side runs in a child process of its own (this binary, run again with
//! `IDEM_FOOTPRINT_SIDE` set), so that neither inherits the other's freed memory:
//!
//! - `idem`: 1,000,000 records put through the `Store` trait of a `MemoryStore`, as the
//!   engine does (`claim` with a `Token::random()`, then `complete` with a 64-byte payload),
//!   under keys `Key::new("bench::charge", "order-{i}")`;
//! - `baseline`: the same 1,000,000 keys as strings (`bench::charge/order-{i}`) mapped to
//!   64-byte `Vec<u8>`s in a `DashMap`.
//!
//! What is reported per record is the growth of the live heap, counted by a global
//! allocator that adds up the sizes requested of it (minus those given back), divided by
//! the record count: keys, payloads, fingerprints, the maps' tables and their spare
//! capacity, everything the side keeps. It does not count what the allocator itself adds
//! (size-class rounding, headers, fragmentation): the resident set growth read from
//! `/proc/self/statm` (Linux only) is printed beside it as what the process pays.
//!
//! The figures are printed as a table and written to
//! `$CARGO_TARGET_DIR/criterion/memory_footprint/result.json` (`target/...` without the
//! variable) for `tools/bench-report`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use idem::{store::Bytes, store::Claim, store::Store, store::Token, Fingerprint, Key, MemoryStore};

const RECORDS: usize = 1_000_000;
const PAYLOAD_BYTES: usize = 64;
const SIDE_VAR: &str = "IDEM_FOOTPRINT_SIDE";

/// The system allocator, counting the bytes currently allocated through it.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// A global allocator cannot be written without unsafe code; it only forwards to `System`.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `alloc`'s contract.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator with `layout`, as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as `dealloc` and `alloc`; the caller upholds `realloc`'s contract.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            LIVE.fetch_add(new_size, Ordering::Relaxed);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The resident set in bytes, where `/proc/self/statm` says it (pages of 4 KiB assumed).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// What one side keeps: live heap growth and resident set growth, in bytes.
struct Growth {
    heap: usize,
    rss: Option<u64>,
}

/// Runs `build`, keeps what it returns alive while measuring, and returns the growth.
fn measure<T>(build: impl FnOnce() -> T) -> Growth {
    let (heap_before, rss_before) = (LIVE.load(Ordering::SeqCst), resident_bytes());
    let kept = build();
    let (heap_after, rss_after) = (LIVE.load(Ordering::SeqCst), resident_bytes());
    drop(kept);
    Growth {
        heap: heap_after.saturating_sub(heap_before),
        rss: rss_before.zip(rss_after).map(|(b, a)| a.saturating_sub(b)),
    }
}

fn idem_side() -> Growth {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let lease = Duration::from_secs(60);
    measure(|| {
        let store = MemoryStore::new();
        rt.block_on(async {
            for i in 0..RECORDS {
                let key = Key::new("bench::charge", format!("order-{i}")).expect("a valid key");
                let fingerprint = Fingerprint::of(&i);
                let token = Token::random();
                match store.claim(&key, &fingerprint, token, lease).await {
                    Ok(Claim::Acquired { .. }) => {}
                    other => panic!("a new key is acquired, not {other:?}"),
                }
                store
                    .complete(
                        &key,
                        token,
                        Bytes::from(vec![7u8; PAYLOAD_BYTES]),
                        idem::DEFAULT_TTL,
                    )
                    .await
                    .expect("complete");
            }
        });
        assert_eq!(store.len(), RECORDS);
        store
    })
}

fn baseline_side() -> Growth {
    measure(|| {
        let map: DashMap<String, Vec<u8>> = DashMap::new();
        for i in 0..RECORDS {
            map.insert(format!("bench::charge/order-{i}"), vec![7u8; PAYLOAD_BYTES]);
        }
        assert_eq!(map.len(), RECORDS);
        map
    })
}

/// Runs one side in a child process; its answer is one line, `heap rss` (`-` for no RSS).
fn in_child(side: &str) -> Growth {
    let exe = std::env::current_exe().expect("the path of this bench");
    let out = Command::new(exe)
        .env(SIDE_VAR, side)
        .output()
        .expect("the bench runs itself");
    assert!(
        out.status.success(),
        "the {side} side failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).expect("utf-8");
    let mut fields = line.split_whitespace();
    let heap = fields
        .next()
        .and_then(|f| f.parse().ok())
        .expect("the heap growth");
    let rss = fields.next().and_then(|f| f.parse().ok());
    Growth { heap, rss }
}

fn per_record(bytes: usize) -> f64 {
    bytes as f64 / RECORDS as f64
}

fn main() {
    // `cargo bench` passes `--bench`; there is nothing to choose, so arguments are ignored.
    if let Ok(side) = std::env::var(SIDE_VAR) {
        let growth = match side.as_str() {
            "idem" => idem_side(),
            "baseline" => baseline_side(),
            other => panic!("{SIDE_VAR} is `idem` or `baseline`, not `{other}`"),
        };
        let rss = growth.rss.map_or("-".to_string(), |r| r.to_string());
        println!("{} {rss}", growth.heap);
        return;
    }

    let idem = in_child("idem");
    let baseline = in_child("baseline");

    let rss = |g: &Growth| {
        g.rss.map_or("n/a".to_string(), |r| {
            format!("{:.1}", r as f64 / RECORDS as f64)
        })
    };
    println!(
        "memory footprint: {RECORDS} completed records, {PAYLOAD_BYTES}-byte payloads, bytes per record"
    );
    println!("{:<10} {:>12} {:>12}", "side", "live heap", "RSS growth");
    for (name, g) in [("baseline", &baseline), ("idem", &idem)] {
        println!("{name:<10} {:>12.1} {:>12}", per_record(g.heap), rss(g));
    }
    println!(
        "idem / baseline (live heap): {:.2}",
        idem.heap as f64 / baseline.heap as f64
    );

    // Beside criterion's results: the workspace's target directory, not this package's
    // (a bench runs in its package's directory).
    let dir = std::path::PathBuf::from(
        std::env::var("CARGO_TARGET_DIR")
            .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../target").to_string()),
    )
    .join("criterion")
    .join("memory_footprint");
    std::fs::create_dir_all(&dir).expect("the results directory");
    let json = serde_json::json!({
        "records": RECORDS,
        "payload_bytes": PAYLOAD_BYTES,
        "idem_bytes_per_record": per_record(idem.heap),
        "baseline_bytes_per_record": per_record(baseline.heap),
    });
    let path = dir.join("result.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&json).expect("json"))
        .expect("the result file");
    println!("written to {}", path.display());
}
