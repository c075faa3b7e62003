//! The router of a server group: where a reply for a connection of *another* front end goes.
//!
//! S2PL defers replies: a lock released by one connection grants a request that waits on
//! another, and a wait past its deadline is aborted by whichever front end expires it. Every
//! front end of the group (the TCP poller, a fabric poller, each in-process client) serves the
//! same cores, so such a reply can come out of a front end that does not own the waiting
//! connection. Each front end registers an [`Inbox`] with a wake-up (its epoll waker, its
//! fabric doorbell, a condition variable) and gets a front id, which every [`ConnectionId`] it
//! hands out carries; the router puts a reply into the owner's inbox and wakes it. A reply for a
//! front end that is gone is dropped (its connections are closed: nobody to tell).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use rampkv_core::protocol::server::Addressed;
use rampkv_core::protocol::ConnectionId;

use crate::message::Wake;

/// Replies routed to one front end.
pub struct Inbox {
    replies: Mutex<Vec<Addressed>>,
    pending: AtomicBool,
    /// The front end holds replies until a server's log is durable: a log's wake-up is for it.
    holding: AtomicBool,
    wake: Arc<dyn Wake>,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Inbox").field("pending", &self.pending()).finish()
    }
}

impl Inbox {
    /// Whether replies wait (one load: a poller's wake-up condition).
    pub fn pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// Moves the waiting replies into `out`.
    pub fn take(&self, out: &mut Vec<Addressed>) {
        if self.pending.swap(false, Ordering::AcqRel) {
            out.append(&mut self.replies.lock());
        }
    }

    /// Says whether the front end holds replies behind a log. It must look at the logs' durable
    /// positions once more *after* setting it (a log that moved before it was set did not wake
    /// it): the fences here and in [`Router::wake_holding`] make one of the two see the other.
    pub fn set_holding(&self, holding: bool) {
        self.holding.store(holding, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    fn put(&self, reply: Addressed) {
        self.replies.lock().push(reply);
        self.pending.store(true, Ordering::Release);
        self.wake.wake();
    }
}

/// The front ends of one server group and their inboxes.
#[derive(Debug, Default)]
pub struct Router {
    inboxes: RwLock<Vec<(u32, Arc<Inbox>)>>,
    /// Front ids are never reused, so a late reply never reaches a newer front end.
    next_front: AtomicU32,
}

impl Router {
    /// Registers a front end woken by `wake`; returns its front id and inbox.
    pub fn register(&self, wake: Arc<dyn Wake>) -> (u32, Arc<Inbox>) {
        let front = self.next_front.fetch_add(1, Ordering::Relaxed);
        let inbox = Arc::new(Inbox {
            replies: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
            holding: AtomicBool::new(false),
            wake,
        });
        self.inboxes.write().push((front, Arc::clone(&inbox)));
        (front, inbox)
    }

    /// Forgets front end `front` (it stopped); replies for it are dropped from now on.
    pub fn unregister(&self, front: u32) {
        self.inboxes.write().retain(|(registered, _)| *registered != front);
    }

    /// Hands `reply` to the front end of its connection.
    pub fn route(&self, reply: Addressed) {
        let inbox = self.inbox_of(reply.connection);
        if let Some(inbox) = inbox {
            inbox.put(reply);
        }
    }

    /// Wakes the front ends that hold replies behind a log (its durable position moved; called
    /// after the move is stored). The others have nothing to gain from it: not waking them
    /// saves a wake-up per group commit per front end.
    pub fn wake_holding(&self) {
        self.wake_holding_except(None);
    }

    /// [`Router::wake_holding`] but for front end `except` (the caller, which looks itself).
    pub fn wake_holding_except(&self, except: Option<u32>) {
        std::sync::atomic::fence(Ordering::SeqCst);
        for (front, inbox) in self.inboxes.read().iter() {
            if Some(*front) != except && inbox.holding.load(Ordering::SeqCst) {
                inbox.wake.wake();
            }
        }
    }

    fn inbox_of(&self, connection: ConnectionId) -> Option<Arc<Inbox>> {
        let inboxes = self.inboxes.read();
        inboxes.iter().find(|(front, _)| *front == connection.front).map(|(_, inbox)| Arc::clone(inbox))
    }
}

/// A wake-up for a thread that waits on a condition variable (the in-process client).
#[derive(Debug, Default)]
pub struct Signal {
    raised: std::sync::Mutex<bool>,
    condition: std::sync::Condvar,
}

impl Signal {
    /// Waits until raised or `timeout`, and lowers it.
    pub fn wait(&self, timeout: std::time::Duration) {
        let raised = self.raised.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (mut raised, _) = self
            .condition
            .wait_timeout_while(raised, timeout, |raised| !*raised)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *raised = false;
    }
}

impl Wake for Signal {
    fn wake(&self) {
        *self.raised.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = true;
        self.condition.notify_all();
    }
}
