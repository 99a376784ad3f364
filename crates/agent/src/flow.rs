//! Per-channel credit windows, SSH style, used identically by both sides.
//!
//! A sender may put at most `window` unacknowledged bytes on a channel. The receiver
//! grants more (a window frame) only once its *consumer* has taken bytes, never when
//! they are merely queued, so every buffer is bounded by the window and a stalled
//! consumer stalls only its own channel.

use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

/// Largest window any channel may reach; a grant beyond it is a protocol violation.
pub const MAX_WINDOW: u64 = u32::MAX as u64;

/// Default window per channel.
pub const DEFAULT_WINDOW: u32 = 1 << 20;

#[derive(Debug)]
struct SendState {
    avail: u64,
    closed: bool,
    /// Nobody reads this channel any more (its connection detached): credit is endless
    /// and what would be sent is dropped ([`SendWindow::discard`]).
    discard: bool,
    waker: Option<Waker>,
}

/// Credit the peer has granted us for one channel.
#[derive(Debug)]
pub struct SendWindow {
    state: Mutex<SendState>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means another thread panicked while holding it; the plain
    // counters inside are still consistent, so keep going rather than cascade the panic.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl SendWindow {
    /// A window with `initial` bytes of credit.
    pub fn new(initial: u32) -> Self {
        Self {
            state: Mutex::new(SendState {
                avail: u64::from(initial),
                closed: false,
                discard: false,
                waker: None,
            }),
        }
    }

    /// Adds credit. `false` if the window would exceed [`MAX_WINDOW`].
    pub fn grant(&self, n: u32) -> bool {
        let mut s = lock(&self.state);
        let next = s.avail + u64::from(n);
        if next > MAX_WINDOW {
            return false;
        }
        s.avail = next;
        if let Some(w) = s.waker.take() {
            w.wake();
        }
        true
    }

    /// Takes up to `max` bytes of credit, waiting for some to be available.
    /// `Ready(None)` once the window is closed (stream ended or connection lost).
    pub fn poll_reserve(&self, cx: &mut Context<'_>, max: usize) -> Poll<Option<usize>> {
        let mut s = lock(&self.state);
        if s.closed {
            return Poll::Ready(None);
        }
        if s.discard {
            return Poll::Ready(Some(max));
        }
        if s.avail == 0 || max == 0 {
            if max == 0 {
                return Poll::Ready(Some(0));
            }
            s.waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = s.avail.min(max as u64);
        s.avail -= n;
        Poll::Ready(Some(n as usize))
    }

    /// Async form of [`Self::poll_reserve`].
    pub async fn reserve(&self, max: usize) -> Option<usize> {
        std::future::poll_fn(|cx| self.poll_reserve(cx, max)).await
    }

    /// Gives back credit that was reserved but not used.
    pub fn refund(&self, n: usize) {
        if n > 0 {
            let mut s = lock(&self.state);
            s.avail += n as u64;
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        }
    }

    /// From now on nobody reads this channel, and its writer must not be held up or cut
    /// off: credit is endless and the sender drops what it would send
    /// ([`SendWindow::discarding`]). A detached connection's processes go on writing.
    pub fn discard(&self) {
        let mut s = lock(&self.state);
        s.discard = true;
        s.avail = MAX_WINDOW;
        if let Some(w) = s.waker.take() {
            w.wake();
        }
    }

    /// Whether [`SendWindow::discard`] was called.
    pub fn discarding(&self) -> bool {
        lock(&self.state).discard
    }

    /// Closes the window; waiters wake up with `None`.
    pub fn close(&self) {
        let mut s = lock(&self.state);
        s.closed = true;
        if let Some(w) = s.waker.take() {
            w.wake();
        }
    }
}

#[derive(Debug)]
struct RecvState {
    /// Bytes the peer may still send.
    remaining: u64,
    /// Bytes consumed but not yet granted back.
    unreturned: u64,
}

/// Credit we granted the peer for one channel.
#[derive(Debug)]
pub struct RecvWindow {
    state: Mutex<RecvState>,
    window: u32,
}

impl RecvWindow {
    /// A window of `window` bytes, all granted up front (announced in the hello).
    pub fn new(window: u32) -> Self {
        Self {
            state: Mutex::new(RecvState {
                remaining: u64::from(window),
                unreturned: 0,
            }),
            window,
        }
    }

    /// Accounts `n` received bytes. `false` if the peer exceeded its window.
    pub fn on_data(&self, n: usize) -> bool {
        let mut s = lock(&self.state);
        if n as u64 > s.remaining {
            return false;
        }
        s.remaining -= n as u64;
        true
    }

    /// Accounts `n` consumed bytes; returns an increment to send once enough has
    /// accumulated (a quarter window), so credit frames stay rare. With at most a
    /// quarter window withheld the sender always keeps credit, so this cannot deadlock.
    pub fn on_consumed(&self, n: usize) -> Option<u32> {
        let mut s = lock(&self.state);
        s.unreturned += n as u64;
        let threshold = u64::from((self.window / 4).max(1));
        if s.unreturned >= threshold {
            let inc = s.unreturned.min(MAX_WINDOW) as u32;
            s.unreturned -= u64::from(inc);
            s.remaining += u64::from(inc);
            Some(inc)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn send_window_waits_and_closes() {
        let w = std::sync::Arc::new(SendWindow::new(10));
        assert_eq!(w.reserve(4).await, Some(4));
        assert_eq!(w.reserve(100).await, Some(6));
        let w2 = w.clone();
        let waiter = tokio::spawn(async move { w2.reserve(100).await });
        tokio::task::yield_now().await;
        assert!(w.grant(3));
        assert_eq!(waiter.await.unwrap(), Some(3));
        assert!(!w.grant(u32::MAX) || !w.grant(u32::MAX));
        w.close();
        assert_eq!(w.reserve(1).await, None);
    }

    #[test]
    fn recv_window_accounting() {
        let r = RecvWindow::new(8);
        assert!(r.on_data(8));
        assert!(!r.on_data(1));
        assert_eq!(r.on_consumed(1), None);
        assert_eq!(r.on_consumed(1), Some(2));
        assert!(r.on_data(2));
        assert!(!r.on_data(1));
    }
}
