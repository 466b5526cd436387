//! The response future of [`IdempotencyService`](crate::IdempotencyService).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The response future of [`IdempotencyService`](crate::IdempotencyService): the inner
/// service's own for requests that pass through, and a wait for the handler's task for
/// guarded ones (dropping it does not stop that task).
pub struct ResponseFuture<R, E> {
    inner: BoxFuture<Result<R, E>>,
}

impl<R, E> ResponseFuture<R, E> {
    pub(crate) fn new(fut: impl Future<Output = Result<R, E>> + Send + 'static) -> Self {
        ResponseFuture {
            inner: Box::pin(fut),
        }
    }
}

impl<R, E> Future for ResponseFuture<R, E> {
    type Output = Result<R, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<R, E> fmt::Debug for ResponseFuture<R, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
