//! [`ResponseBody`]: the body of every response the layer answers.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use idem_core::BoxError;
use pin_project_lite::pin_project;

pin_project! {
    /// The body of a response of [`IdempotencyService`](crate::IdempotencyService): bytes
    /// the layer holds (a stored response, a problem, a first response read whole), or the
    /// handler's own body passed through (a request that is not guarded, a response not
    /// stored, or one too large or streaming to store), after what was already read of it.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Full { data: Option<Bytes> },
        Inner { #[pin] rest: B },
        Resumed { read: VecDeque<Bytes>, rest: Pin<Box<B>> },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn full(data: Bytes) -> Self {
        ResponseBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }

    pub(crate) fn inner(body: B) -> Self {
        ResponseBody {
            kind: Kind::Inner { rest: body },
        }
    }

    /// `body`, of which `read` was already read.
    pub(crate) fn resumed(read: VecDeque<Bytes>, body: Pin<Box<B>>) -> Self {
        ResponseBody {
            kind: Kind::Resumed { read, rest: body },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Inner { rest } => poll_inner(rest, cx),
            KindProj::Resumed { read, rest } => match read.pop_front() {
                Some(chunk) => Poll::Ready(Some(Ok(Frame::data(chunk)))),
                None => poll_inner(rest.as_mut(), cx),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { data } => data.is_none(),
            Kind::Inner { rest } => rest.is_end_stream(),
            Kind::Resumed { read, rest } => read.is_empty() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Inner { rest } => rest.size_hint(),
            Kind::Resumed { read, rest } => {
                let already: u64 = read.iter().map(|c| c.len() as u64).sum();
                let inner = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(inner.lower().saturating_add(already));
                if let Some(upper) = inner.upper() {
                    hint.set_upper(upper.saturating_add(already));
                }
                hint
            }
        }
    }
}

/// The next frame of the handler's body, its data as `Bytes`.
fn poll_inner<B>(
    body: Pin<&mut B>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    match body.poll_frame(cx) {
        Poll::Pending => Poll::Pending,
        Poll::Ready(None) => Poll::Ready(None),
        Poll::Ready(Some(Err(err))) => Poll::Ready(Some(Err(err.into()))),
        Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(
            frame.map_data(|mut d| d.copy_to_bytes(d.remaining()))
        ))),
    }
}

impl<B> From<Bytes> for ResponseBody<B> {
    fn from(data: Bytes) -> Self {
        ResponseBody::full(data)
    }
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Full { data } => f
                .debug_struct("ResponseBody::Full")
                .field("len", &data.as_ref().map_or(0, Bytes::len))
                .finish(),
            Kind::Inner { .. } | Kind::Resumed { .. } => f.write_str("ResponseBody::Inner(..)"),
        }
    }
}
