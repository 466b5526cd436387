use idem::idempotent;

pub struct Payload(Vec<u8>);

#[idempotent(key = id, fingerprint = payload)]
async fn ingest(id: u64, payload: Payload) -> usize {
    payload.0.len()
}

fn main() {}
