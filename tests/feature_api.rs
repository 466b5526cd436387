//! The public items each cargo feature promises, named under that feature's cfg alone.
//!
//! Nothing here runs anything: the file compiles only if every item is there. `.ci/run`
//! builds it with no feature and with each feature on its own (`cargo check -p idemkit
//! --no-default-features --features <one> --test feature_api`), so an item compiled only
//! beside another feature (a `cfg(any(..))` that forgets one) fails CI, not a user whose
//! build has that feature alone. A feature that promises a new item adds it here.

/// Every build: the engine, the attribute, the memory store, a store from a URL.
fn always() {
    let _ = idem::Idem::builder;
    let _: Option<idem::stores::MemoryStore> = None;
    let _ = idem::stores::connect;
    #[allow(unused_imports)]
    use idem::{idempotent, scoped};
}

#[cfg(feature = "postcard")]
fn postcard() {
    let _ = idem::codec::Postcard;
}

#[cfg(feature = "bincode")]
fn bincode() {
    let _ = idem::codec::Bincode;
}

#[cfg(feature = "redis")]
fn redis() {
    let _ = idem::stores::RedisStore::open;
    let _ = idem::stores::RedisStore::builder;
    let _: Option<idem::stores::LostRecords> = None;
    let _ = idem::stores::DEFAULT_REDIS_PREFIX;
}

#[cfg(feature = "redis-cluster")]
fn redis_cluster() {
    let _ = idem::stores::RedisStore::from_cluster_connection;
    let _ = idem::stores::RedisStoreBuilder::cluster_connection;
}

/// What every SQL store gives: its builder and the transactional dedup and steps, which
/// write a record inside the caller's own transaction.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
macro_rules! sql_store {
    ($store:ty, $builder:ty) => {{
        let _: Option<$builder> = None;
        let _ = <$store>::builder;
        let _ = <$store>::mark_processed_in;
        let _ = <$store>::save_result_in::<()>;
        let _ = <$store>::completed_step_in::<()>;
        let _ = <$store>::record_step_in::<()>;
        let _: Option<idem::stores::SqlStoreBuilder<_>> = None::<$builder>;
        let _ = idem::stores::DEFAULT_ACQUIRE_TIMEOUT;
        let _ = idem::stores::DEFAULT_MIGRATE_LOCK_TIMEOUT;
        fn transactional<D: idem::stores::Transactional>() {}
        let _ = transactional::<<$store as HasDialect>::Dialect>;
    }};
}

/// The dialect of a SQL store type, to name it without naming sqlx.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
trait HasDialect {
    type Dialect;
}

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
impl<D: idem::stores::Dialect> HasDialect for idem::stores::SqlStore<D> {
    type Dialect = D;
}

#[cfg(feature = "postgres")]
fn postgres() {
    sql_store!(
        idem::stores::PostgresStore,
        idem::stores::PostgresStoreBuilder
    );
    let _: Option<idem::stores::SynchronousCommit> = None;
}

#[cfg(feature = "sqlite")]
fn sqlite() {
    sql_store!(idem::stores::SqliteStore, idem::stores::SqliteStoreBuilder);
    let _: Option<idem::stores::SqliteSettings> = None;
    let _ = idem::stores::DEFAULT_BUSY_TIMEOUT;
}

#[cfg(feature = "mysql")]
fn mysql() {
    sql_store!(idem::stores::MySqlStore, idem::stores::MySqlStoreBuilder);
}

#[cfg(feature = "testing")]
fn testing() {
    let _ = idem::testing::backend_url;
    let _ = idem::testing::unique_scope;
    #[allow(unused_imports)]
    use idem::conformance_tests;
}

#[cfg(feature = "http")]
fn http() {
    let _: Option<idem::http::IdempotencyLayer> = None;
    let _: Option<idem::http::IdempotencyKey> = None;
    let _: Option<idem::http::IdemError> = None;
    let _ = idem::http::IDEMPOTENCY_KEY;
}

#[cfg(feature = "http-axum")]
fn http_axum() {
    let _: Option<idem::http::IdempotencyKeyRejection> = None;
}

#[cfg(feature = "http-client")]
fn http_client() {
    let _: Option<idem::http::IdempotentClient> = None;
    let _: Option<idem::http::RetryPolicy> = None;
}

#[test]
fn every_promised_item_is_there() {
    always();
    #[cfg(feature = "postcard")]
    postcard();
    #[cfg(feature = "bincode")]
    bincode();
    #[cfg(feature = "redis")]
    redis();
    #[cfg(feature = "redis-cluster")]
    redis_cluster();
    #[cfg(feature = "postgres")]
    postgres();
    #[cfg(feature = "sqlite")]
    sqlite();
    #[cfg(feature = "mysql")]
    mysql();
    #[cfg(feature = "testing")]
    testing();
    #[cfg(feature = "http")]
    http();
    #[cfg(feature = "http-axum")]
    http_axum();
    #[cfg(feature = "http-client")]
    http_client();
}
