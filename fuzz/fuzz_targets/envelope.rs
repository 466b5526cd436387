//! The record envelope decoder, through the public API: arbitrary bytes planted as a
//! completed record, replayed as several types. Never a panic; `Error::Decode` naming the
//! key, or exactly the value a valid envelope's payload holds.
#![no_main]

use std::time::Duration;

use idem::{Error, Fingerprint, Idem, Key, MemoryStore, store::Store, store::Token};
use libfuzzer_sys::fuzz_target;
use serde::{de::DeserializeOwned, Deserialize, Serialize};

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Receipt {
    order: String,
    cents: u64,
}

/// The first 7 bytes of a JSON value envelope: magic, format version, codec, kind.
const HEADER_LEN: usize = 15;

async fn check<T>(bytes: &[u8])
where
    T: Serialize + DeserializeOwned + Send + PartialEq + std::fmt::Debug + 'static,
{
    let store = MemoryStore::new();
    let idem = Idem::new(store.clone());
    let key = Key::new("fuzz.envelope", "k").unwrap();
    let token = Token::random();
    let long = Duration::from_secs(60);
    store.claim(&key, &Fingerprint::NONE, token, long).await.unwrap();
    store
        .complete(&key, token, bytes.to_vec().into(), long)
        .await
        .unwrap();
    let out: Result<T, Error> = idem
        .call(key.clone(), Fingerprint::NONE)
        .run(|| async { panic!("a completed record made the body run") })
        .await;
    match out {
        Err(Error::Decode { key: k, .. }) => assert_eq!(k, key),
        Ok(v) => {
            assert!(bytes.len() >= HEADER_LEN && &bytes[..4] == b"idem");
            let payload: T = serde_json::from_slice(&bytes[HEADER_LEN..]).unwrap();
            assert_eq!(payload, v);
        }
        Err(other) => panic!("arbitrary bytes answered {other:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        check::<u64>(data).await;
        check::<String>(data).await;
        check::<Receipt>(data).await;
        check::<Vec<u32>>(data).await;
    });
});
