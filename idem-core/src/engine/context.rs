//! What a running body can ask about its own call: its fence, through a task-local that
//! the first run sets around the body's future.

use std::future::Future;

use crate::store::Fence;

tokio::task_local! {
    /// The fence of the claim whose body this task is running; `None` on a store that
    /// assigns no fences.
    static FENCE: Option<Fence>;
}

/// The [`Fence`] of the claim whose body is running: `Some` inside the body of a call that
/// claimed its key on a store that [assigns fences](crate::Capabilities::assigns_fences)
/// (every built-in store does), `None` anywhere else (outside a body, in a body run without
/// a key by `missing_key = "run"`, or on a store that assigns none).
///
/// Hand it to the system the body writes to, so that a holder whose lease was taken over
/// cannot overwrite its successor's writes: keep the highest fence in your row and write
/// only with a larger one (`UPDATE accounts SET balance = $3, fence = $1 WHERE id = $2 AND
/// fence < $1`). The guide's chapter on failures has the whole example.
///
/// The fence is task-local: it is the body's, and the futures the body awaits see it, but a
/// task the body spawns does not; read it in the body and move it into the task.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem::Error> {
/// let idem = idem::Idem::new(idem::MemoryStore::new());
/// assert_eq!(idem::fence(), None, "no call is running here");
/// let key = idem::Key::new("demo", "order-1")?;
/// let seen = idem
///     .call(key, idem::Fingerprint::NONE)
///     .run(|| async { idem::fence().map(|fence| fence.get()) })
///     .await?;
/// assert!(seen.is_some(), "the memory store assigns fences");
/// # Ok(()) }
/// ```
pub fn fence() -> Option<Fence> {
    FENCE.try_with(|fence| *fence).ok().flatten()
}

/// `body` with `fence` as what [`fence()`] answers while it runs.
pub(super) fn with_fence<F: Future>(
    fence: Option<Fence>,
    body: F,
) -> impl Future<Output = F::Output> {
    FENCE.scope(fence, body)
}
