//! The `idem.call` span: one per call, its fields, each outcome value, and the body's own
//! spans nested under it. In a test binary of its own, one test: tracing caches whether a
//! callsite is wanted process-wide (see `tracing_events.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use idem::{
    store::Bytes, store::Claim, store::Record, store::Store, store::StoreError, store::Token,
    Fingerprint, Idem, Key, MemoryStore,
};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record as SpanRecord};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// One span as the recorder saw it: its name, its parent's name, its fields.
#[derive(Debug, Clone, Default)]
struct Seen {
    name: String,
    parent: Option<String>,
    fields: HashMap<String, String>,
}

#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<(u64, Seen)>>>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.to_string());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let parent = ctx
            .span(id)
            .and_then(|s| s.parent())
            .map(|p| p.name().to_owned());
        let mut seen = Seen {
            name: attrs.metadata().name().into(),
            parent,
            fields: HashMap::new(),
        };
        attrs.record(&mut Fields(&mut seen.fields));
        self.0.lock().unwrap().push((id.into_u64(), seen));
    }
    fn on_record(&self, id: &Id, values: &SpanRecord<'_>, _: Context<'_, S>) {
        let mut all = self.0.lock().unwrap();
        if let Some((_, seen)) = all.iter_mut().rev().find(|(i, _)| *i == id.into_u64()) {
            values.record(&mut Fields(&mut seen.fields));
        }
    }
}

impl Spans {
    /// The `idem.call` spans recorded since the last take.
    fn take_calls(&self) -> Vec<Seen> {
        let all = std::mem::take(&mut *self.0.lock().unwrap());
        all.into_iter()
            .map(|(_, s)| s)
            .filter(|s| s.name == "idem.call")
            .collect()
    }
}

/// A memory store whose `complete` answers `Fenced` (another caller took the key over) or
/// whose `claim` fails, as chosen.
#[derive(Debug)]
struct Faulty {
    inner: MemoryStore,
    fence_complete: bool,
    fail_claim: bool,
}

#[async_trait]
impl Store for Faulty {
    async fn claim(
        &self,
        key: &Key,
        fp: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        if self.fail_claim {
            return Err(StoreError::Backend {
                backend: "custom",
                source: "refused for the test".into(),
            });
        }
        self.inner.claim(key, fp, token, lease).await
    }
    async fn complete(
        &self,
        key: &Key,
        token: Token,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        if self.fence_complete {
            return Err(StoreError::Fenced);
        }
        self.inner.complete(key, token, payload, ttl).await
    }
    async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError> {
        self.inner.release(key, token).await
    }
    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
        self.inner.extend(key, token, lease).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }
    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        self.inner.delete(key).await
    }
}

fn key(id: &str) -> Key {
    Key::new("ops-span", id).unwrap()
}

async fn all_outcomes(spans: &Spans) {
    let idem = Idem::new(MemoryStore::new());
    let fp = Fingerprint::of(&1);

    // claimed, with a span of the body's own nested under the call's.
    let v: u32 = idem
        .call(key("a\nb"), fp)
        .run(|| async {
            let _inner = tracing::info_span!("charge_card").entered();
            7
        })
        .await
        .unwrap();
    assert_eq!(v, 7);
    let all = std::mem::take(&mut *spans.0.lock().unwrap());
    let body = all.iter().find(|(_, s)| s.name == "charge_card").unwrap();
    assert_eq!(body.1.parent.as_deref(), Some("idem.call"));
    let calls: Vec<_> = all.iter().filter(|(_, s)| s.name == "idem.call").collect();
    assert_eq!(calls.len(), 1, "one span per call");
    let f = &calls[0].1.fields;
    assert_eq!(f["scope"], "ops-span");
    assert_eq!(f["key"], "a\\nb", "the id is escaped as Key's Display does");
    assert_eq!(f["outcome"], "claimed");
    let in_store: f64 = f["store_seconds"].parse().unwrap();
    assert!(
        in_store > 0.0,
        "claim and complete took some time: {in_store}"
    );

    let outcome_of = |spans: &Spans| {
        let calls = spans.take_calls();
        assert_eq!(calls.len(), 1, "one span per call: {calls:?}");
        calls[0].fields["outcome"].clone()
    };

    // replayed
    let _: u32 = idem
        .call(key("a\nb"), fp)
        .run(|| async { 8 })
        .await
        .unwrap();
    assert_eq!(outcome_of(spans), "replayed");

    // key_reuse
    let e = idem
        .call(key("a\nb"), Fingerprint::of(&2))
        .run(|| async { 8u32 })
        .await
        .unwrap_err();
    assert!(matches!(e, idem::Error::KeyReuse { .. }), "{e}");
    assert_eq!(outcome_of(spans), "key_reuse");

    // in_progress: the key held by a claim that is not this call's.
    idem.store()
        .claim(&key("held"), &fp, Token::random(), Duration::from_secs(30))
        .await
        .unwrap();
    let e = idem
        .call(key("held"), fp)
        .run(|| async { 1u32 })
        .await
        .unwrap_err();
    assert!(matches!(e, idem::Error::InProgress { .. }), "{e}");
    assert_eq!(outcome_of(spans), "in_progress");

    // released: a body error gives the claim back.
    let r: Result<u32, idem::Error> = idem
        .call(key("fails"), fp)
        .run_fallible(|| async {
            Err(idem::Error::Config {
                message: "body failed".into(),
                source: None,
            })
        })
        .await;
    assert!(r.is_err());
    assert_eq!(outcome_of(spans), "released");

    // replayed_local
    let cached = Idem::builder()
        .store(MemoryStore::new())
        .local_cache(16, Duration::from_secs(60))
        .build()
        .unwrap();
    let _: u32 = cached.call(key("c"), fp).run(|| async { 1 }).await.unwrap();
    assert_eq!(outcome_of(spans), "claimed");
    let _: u32 = cached.call(key("c"), fp).run(|| async { 1 }).await.unwrap();
    assert_eq!(outcome_of(spans), "replayed_local");

    // lease_lost
    let fenced = Idem::new(Faulty {
        inner: MemoryStore::new(),
        fence_complete: true,
        fail_claim: false,
    });
    let e = fenced
        .call(key("f"), fp)
        .run(|| async { 1u32 })
        .await
        .unwrap_err();
    assert!(matches!(e, idem::Error::LeaseLost { .. }), "{e}");
    assert_eq!(outcome_of(spans), "lease_lost");

    // store_error
    let down = Idem::new(Faulty {
        inner: MemoryStore::new(),
        fence_complete: false,
        fail_claim: true,
    });
    let e = down
        .call(key("d"), fp)
        .run(|| async { 1u32 })
        .await
        .unwrap_err();
    assert!(matches!(e, idem::Error::Store { .. }), "{e}");
    assert_eq!(outcome_of(spans), "store_error");
}

/// A memory store whose steps on a step's record each take 20 ms.
#[derive(Debug)]
struct SlowSteps(MemoryStore);

#[async_trait]
impl idem::store::StoreWrapper for SlowSteps {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.0
    }
    async fn claim(
        &self,
        key: &Key,
        fp: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        if key.scope().contains("#step:") {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.0.claim(key, fp, token, lease).await
    }
}

/// A call's store time counts its steps' store steps too.
async fn steps_count_in_store_seconds(spans: &Spans) {
    let idem = Idem::new(SlowSteps(MemoryStore::new()));
    let _ = spans.take_calls();
    let _: u32 = idem
        .call(key("steps"), Fingerprint::NONE)
        .run_fallible(|| async {
            idem::step("charge", || async { Ok::<_, idem::Error>(1u32) }).await
        })
        .await
        .unwrap();
    let calls = spans.take_calls();
    assert_eq!(calls.len(), 1);
    let in_store: f64 = calls[0].fields["store_seconds"].parse().unwrap();
    assert!(
        in_store >= 0.02,
        "the step's claim (20 ms) is not in the call's store time: {in_store}"
    );
}

/// The same span on a real store: a SQLite file, whose steps take real time.
#[cfg(feature = "sqlite")]
async fn on_sqlite(spans: &Spans) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("span.db").display());
    let idem = idem::connect(&url).await.unwrap();
    let _ = spans.take_calls();
    let _: u32 = idem
        .call(key("sqlite"), Fingerprint::NONE)
        .run(|| async {
            let _inner = tracing::info_span!("charge_card").entered();
            1
        })
        .await
        .unwrap();
    let all = std::mem::take(&mut *spans.0.lock().unwrap());
    let body = all.iter().find(|(_, s)| s.name == "charge_card").unwrap();
    assert_eq!(body.1.parent.as_deref(), Some("idem.call"));
    let call = &all.iter().find(|(_, s)| s.name == "idem.call").unwrap().1;
    assert_eq!(call.fields["outcome"], "claimed");
    let in_store: f64 = call.fields["store_seconds"].parse().unwrap();
    assert!(in_store > 0.0, "{in_store}");
    let _: u32 = idem
        .call(key("sqlite"), Fingerprint::NONE)
        .run(|| async { 2 })
        .await
        .unwrap();
    let calls = spans.take_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].fields["outcome"], "replayed");
}

#[test]
fn idem_call_span_fields_outcomes_and_nesting() {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let _guard = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(all_outcomes(&spans));
    rt.block_on(steps_count_in_store_seconds(&spans));
    #[cfg(feature = "sqlite")]
    rt.block_on(on_sqlite(&spans));
}
