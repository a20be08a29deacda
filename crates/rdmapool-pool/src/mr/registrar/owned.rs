//! Registration of buffers the caller owns, off the caller's thread
//! ([`crate::mr::Registrar::submit_owned`]).

use super::RegHandle;
use crate::fabric::{Mr, Raw, RegisterError, StableBuf};
use crate::mr::state::RegState;
use crate::{Error, Result};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A submitted registration of an owned buffer ([`super::Registrar::submit_owned`]): a future, or
/// [`OwnedRegHandle::wait`]. Like every future it must not be polled after it resolved.
pub struct OwnedRegHandle<B: StableBuf> {
    handle: RegHandle<Raw>,
    buf: Option<B>,
}

impl<B: StableBuf> OwnedRegHandle<B> {
    pub(super) fn new(handle: RegHandle<Raw>, buf: B) -> Self {
        Self {
            handle,
            buf: Some(buf),
        }
    }

    /// Where the request is now.
    pub fn state(&self) -> RegState {
        self.handle.state()
    }

    /// Cancels the request (see [`RegHandle::cancel`]); the outcome, with the buffer, stays
    /// available.
    pub fn cancel(&self) -> bool {
        self.handle.cancel()
    }

    fn finish(
        &mut self,
        r: Result<Mr<Raw>>,
    ) -> std::result::Result<Mr<B>, RegisterError<B, Error>> {
        let buf = self
            .buf
            .take()
            .expect("OwnedRegHandle polled after it resolved");
        match r {
            Ok(mr) => Ok(mr.into_owned(buf)),
            Err(e) => Err(RegisterError::new(e, buf)),
        }
    }

    /// Blocks until the request is final; the registered buffer, or the error and the buffer.
    pub fn wait(mut self) -> std::result::Result<Mr<B>, RegisterError<B, Error>> {
        let r = self.handle.wait();
        self.finish(r)
    }
}

impl<B: StableBuf> Unpin for OwnedRegHandle<B> {}

impl<B: StableBuf> Future for OwnedRegHandle<B> {
    type Output = std::result::Result<Mr<B>, RegisterError<B, Error>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match Pin::new(&mut self.handle).poll(cx) {
            Poll::Ready(r) => Poll::Ready(self.finish(r)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<B: StableBuf> Drop for OwnedRegHandle<B> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            // A worker may still be registering the buffer, or the finished region may still
            // sit in the request: the request keeps the buffer and drops it after both.
            self.handle.cancel();
            self.handle.keep_until_done(Box::new(buf));
        }
    }
}
