#![doc = include_str!("http.md")]
//!
//! ## The status flow
//!
//! One client and one route behind the layer: what each request is answered, and which
//! reach the handler. Drawn from the mermaid source below it
//! (`src/guide/diagrams/http_status.mmd`) by `tools/seqdiag/seqdiag.py`, as the
//! [call diagrams](super::calls) are.
//!
#![doc = include_str!("diagrams/http_status.svg")]
//!
//! <details><summary>mermaid source</summary>
//!
//! ```mermaid
#![doc = include_str!("diagrams/http_status.mmd")]
//! ```
//!
//! </details>
