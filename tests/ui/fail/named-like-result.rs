use idem::idempotent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub struct SearchResult<T> {
    pub items: Vec<T>,
}

// The first error says what happened; the type mismatches after it follow from it.
#[idempotent]
async fn search(query: String) -> SearchResult<String> {
    SearchResult { items: vec![query] }
}

fn main() {}
