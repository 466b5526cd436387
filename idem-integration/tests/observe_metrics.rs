//! The `metrics` feature: `idem_calls_total{scope,outcome}`,
//! `idem_store_step_seconds{step,backend}` and `idem_calls_in_progress`, read back from
//! `metrics-util`'s debugging recorder, on the memory store and on a real SQLite file.
#![cfg(feature = "metrics")]

use std::collections::HashMap;

use idem::{Fingerprint, Idem, Key};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;

/// Each metric of the snapshot by name and sorted labels.
fn snapshot(snap: &Snapshotter) -> Metrics {
    snap.snapshot()
        .into_vec()
        .into_iter()
        .map(|(ck, _, _, v)| {
            let (kind, key) = ck.into_parts();
            let _: MetricKind = kind;
            let mut labels: Vec<_> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            ((key.name().to_owned(), labels), v)
        })
        .collect()
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<_> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    v.sort();
    v
}

type Metrics = HashMap<(String, Vec<(String, String)>), DebugValue>;

/// The debugging recorder's snapshot resets what it reads (counters and gauges to zero,
/// histograms emptied): two readings are added up into the totals.
fn merge(mut a: Metrics, b: Metrics) -> Metrics {
    for (k, v) in b {
        let merged = match (a.remove(&k), v) {
            (Some(DebugValue::Counter(x)), DebugValue::Counter(y)) => DebugValue::Counter(x + y),
            (Some(DebugValue::Gauge(x)), DebugValue::Gauge(y)) => DebugValue::Gauge(x + y),
            (Some(DebugValue::Histogram(mut x)), DebugValue::Histogram(y)) => {
                x.extend(y);
                DebugValue::Histogram(x)
            }
            (_, v) => v,
        };
        a.insert(k, merged);
    }
    a
}

/// Runs a claimed call, a replay and a key reuse on `idem`, with a reading taken inside the
/// first body; answers that reading.
async fn three_calls(idem: &Idem, snap: &Snapshotter) -> Metrics {
    let key = |id: &str| Key::new("ops-metrics", id).unwrap();
    let fp = Fingerprint::of(&1);
    let mut during = None;
    let _: u32 = idem
        .call(key("k1"), fp)
        .run(|| async {
            during = Some(snapshot(snap));
            1
        })
        .await
        .unwrap();
    let _: u32 = idem.call(key("k1"), fp).run(|| async { 1 }).await.unwrap();
    let e = idem
        .call(key("k1"), Fingerprint::of(&2))
        .run(|| async { 1u32 })
        .await
        .unwrap_err();
    assert!(matches!(e, idem::Error::KeyReuse { .. }), "{e}");
    during.expect("the gauge was set while the body ran")
}

fn check(backend: &str, url: &str) {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // A local recorder: tests of this binary run on other threads at the same time.
    let mid_body = metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let idem = idem::connect(url).await.unwrap();
            three_calls(&idem, &snap).await
        })
    });
    assert_eq!(
        mid_body.get(&("idem_calls_in_progress".to_owned(), vec![])),
        Some(&DebugValue::Gauge(1.0.into())),
        "one call in progress during the body"
    );

    let m = merge(mid_body, snapshot(&snap));
    for outcome in ["claimed", "replayed", "key_reuse"] {
        let k = (
            "idem_calls_total".to_owned(),
            labels(&[("scope", "ops-metrics"), ("outcome", outcome)]),
        );
        assert_eq!(m.get(&k), Some(&DebugValue::Counter(1)), "{outcome}: {m:?}");
    }
    assert_eq!(
        m.get(&("idem_calls_in_progress".to_owned(), vec![])),
        Some(&DebugValue::Gauge(0.0.into())),
        "back to zero after the calls"
    );
    // Three claims (the second answers the stored result, the third key reuse), one complete.
    for (step, n) in [("claim", 3), ("complete", 1)] {
        let k = (
            "idem_store_step_seconds".to_owned(),
            labels(&[("step", step), ("backend", backend)]),
        );
        match m.get(&k) {
            Some(DebugValue::Histogram(v)) => {
                assert_eq!(v.len(), n, "{step} on {backend}");
                assert!(v.iter().all(|s| s.into_inner() >= 0.0));
            }
            other => panic!("no histogram for {step} on {backend}: {other:?}; {m:?}"),
        }
    }
    // Bounded labels: no key id anywhere.
    assert!(
        m.keys().all(|(_, l)| l.iter().all(|(_, v)| v != "k1")),
        "a key id became a label: {m:?}"
    );
}

#[test]
fn metrics_on_the_memory_store() {
    check("memory", "memory://");
}

#[cfg(feature = "sqlite")]
#[test]
fn metrics_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("m.db").display());
    check("sqlite", &url);
}
