//! [`Step`]: one scriptable port method — call recording plus fault injection.
//!
//! Every fake method is a `Step<Input, Output>`: it records a clone of each input and answers
//! with its current behaviour. The default behaviour is the fixture's happy path; a test
//! replaces it per step:
//!
//! - [`Step::returns`] a fixed value (e.g. a `lost` renew or publish result),
//! - [`Step::fails`] with an error,
//! - [`Step::waits_for_abort`] / [`Step::rejects_on_abort`]: block until the call's signal
//!   aborts,
//! - [`Step::pends`] forever,
//! - [`Step::set`] any async closure (gates, counters, callbacks).
//!
//! [`Gate`] is the promise-with-resolver the TypeScript tests use to order concurrent steps.

use futures::future::BoxFuture;
use omabox_contract::{AbortSignal, PortError};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// What a step answers.
pub type Reply<T> = BoxFuture<'static, Result<T, PortError>>;
type Behaviour<I, T> = Arc<dyn Fn(I) -> Reply<T> + Send + Sync>;

/// An input that carries the call's cancellation signal.
pub trait WithSignal {
    /// The call's signal.
    fn signal(&self) -> AbortSignal;
}

/// One scriptable port method.
pub struct Step<I, T> {
    calls: Mutex<Vec<I>>,
    behaviour: Mutex<Behaviour<I, T>>,
}

impl<I, T> std::fmt::Debug for Step<I, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Step")
            .field("calls", &lock(&self.calls).len())
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<I, T> Step<I, T>
where
    I: Clone + Send + 'static,
    T: Send + 'static,
{
    /// A step whose default behaviour is `behaviour`.
    pub fn new<F, Fut>(behaviour: F) -> Self
    where
        F: Fn(I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, PortError>> + Send + 'static,
    {
        Self {
            calls: Mutex::new(Vec::new()),
            behaviour: Mutex::new(Arc::new(move |input| Box::pin(behaviour(input)))),
        }
    }

    /// Replaces the behaviour.
    pub fn set<F, Fut>(&self, behaviour: F)
    where
        F: Fn(I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, PortError>> + Send + 'static,
    {
        *lock(&self.behaviour) = Arc::new(move |input| Box::pin(behaviour(input)));
    }

    /// Always answers `value`.
    pub fn returns(&self, value: T)
    where
        T: Clone + Sync,
    {
        self.set(move |_| {
            let value = value.clone();
            async move { Ok(value) }
        });
    }

    /// Always fails with `error`.
    pub fn fails(&self, error: PortError) {
        self.set(move |_| {
            let error = error.clone();
            async move { Err(error) }
        });
    }

    /// Never answers.
    pub fn pends(&self) {
        self.set(|_| std::future::pending());
    }

    /// Records the call, then answers with the current behaviour.
    pub async fn invoke(&self, input: I) -> Result<T, PortError> {
        lock(&self.calls).push(input.clone());
        let behaviour = Arc::clone(&lock(&self.behaviour));
        behaviour(input).await
    }

    /// Every recorded input.
    pub fn calls(&self) -> Vec<I> {
        lock(&self.calls).clone()
    }

    /// How many times the step was called.
    pub fn count(&self) -> usize {
        lock(&self.calls).len()
    }

    /// True once called.
    pub fn called(&self) -> bool {
        self.count() > 0
    }

    /// The first recorded input.
    pub fn first(&self) -> Option<I> {
        lock(&self.calls).first().cloned()
    }

    /// The last recorded input.
    pub fn last(&self) -> Option<I> {
        lock(&self.calls).last().cloned()
    }
}

impl<I, T> Step<I, T>
where
    I: Clone + Send + WithSignal + 'static,
    T: Send + 'static,
{
    /// Blocks until the call's signal aborts, then answers `value` (a port that stops
    /// cooperatively).
    pub fn waits_for_abort(&self, value: T)
    where
        T: Clone + Sync,
    {
        self.set(move |input: I| {
            let value = value.clone();
            let signal = input.signal();
            async move {
                signal.aborted().await;
                Ok(value)
            }
        });
    }

    /// Blocks until the call's signal aborts, then fails with its reason.
    pub fn rejects_on_abort(&self) {
        self.set(|input: I| {
            let signal = input.signal();
            async move { Err(signal.aborted().await) }
        });
    }
}

/// A one-shot latch: `open` once, every `wait` then returns.
#[derive(Debug, Clone)]
pub struct Gate {
    sender: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Self {
            sender: Arc::new(tokio::sync::watch::channel(false).0),
        }
    }

    /// Opens the gate (idempotent).
    pub fn open(&self) {
        self.sender.send_replace(true);
    }

    /// True once opened.
    pub fn is_open(&self) -> bool {
        *self.sender.borrow()
    }

    /// Resolves once the gate is open.
    pub async fn wait(&self) {
        let mut receiver = self.sender.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = receiver.wait_for(|open| *open).await;
    }
}
