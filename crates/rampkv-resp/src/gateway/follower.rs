//! The follower thread (with replication): it learns the current primaries and connects new
//! drivers off the loop, and hands them to the loop through a channel and the loop's waker.
//! The loop's side (parking commands, swapping drivers, the bound) and the contract are in
//! `failover`.

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use mio::{Registry, Waker};

use super::connect::{connect_driver_to, GatewayDriver};
use rampkv_core::cluster::Cluster;
use rampkv_core::limits::FAILOVER_RETRY_BACKOFF_MS;
use rampkv_core::protocol::ramp::TxnOptions;
use rampkv_net::client::{current_addresses, follows_failover, ClientError};

/// Whether a gateway of `cluster` follows its configuration: the blocking `Client`'s test
/// (`client::follows_failover`), for servers reached over the network.
pub(super) fn follows_configuration(cluster: &Cluster, in_process: bool) -> bool {
    !in_process && follows_failover(cluster)
}

/// What the follower hands the loop.
pub(super) enum Update {
    /// A driver connected to `routes`, which differ from the loop's.
    Driver { driver: Box<GatewayDriver>, routes: Vec<String> },
    /// The routes are the loop's driver's.
    Unchanged,
    /// No configuration node answered, or the new routes could not be connected to.
    Failed(ClientError),
}

/// The loop's side of the follower thread.
pub(super) struct Follower {
    shared: Arc<Shared>,
    pub(super) updates: Receiver<Update>,
    /// An ask is under way (its update not taken yet).
    pub(super) asked: bool,
    /// The routes of the loop's driver; None while it has none (the follower then connects
    /// whatever the routes).
    pub(super) routes: Option<Vec<String>>,
}

struct Shared {
    state: Mutex<AskState>,
    wake: Condvar,
}

#[derive(Default)]
struct AskState {
    /// The routes of the loop's driver when it asked (None: it has no driver).
    asked: Option<Option<Vec<String>>>,
    stop: bool,
}

impl std::fmt::Debug for Follower {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Follower").field("asked", &self.asked).field("routes", &self.routes).finish()
    }
}

/// What a follower connects with.
pub(super) struct FollowerSetup {
    pub(super) registry: Registry,
    pub(super) waker: Arc<Waker>,
    pub(super) cluster: Cluster,
    pub(super) sessions: usize,
    pub(super) options: TxnOptions,
}

impl Follower {
    /// Starts the follower thread for a loop whose driver is connected to `routes`.
    pub(super) fn spawn(setup: FollowerSetup, routes: Vec<String>) -> std::io::Result<Follower> {
        let shared = Arc::new(Shared { state: Mutex::new(AskState::default()), wake: Condvar::new() });
        let (sender, updates) = mpsc::channel();
        let thread_shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("rampkv-gateway-follower".into())
            .spawn(move || follow(&thread_shared, &sender, &setup))?;
        Ok(Follower { shared, updates, asked: false, routes: Some(routes) })
    }

    /// Asks for the configuration, unless an ask is under way.
    pub(super) fn ask(&mut self) {
        if self.asked {
            return;
        }
        self.asked = true;
        let mut state = self.shared.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.asked = Some(self.routes.clone());
        self.shared.wake.notify_one();
    }
}

impl Follower {
    /// The loop's driver failed as a whole: the next ask brings a new one whatever the routes.
    pub(super) fn lost_driver(&mut self) {
        self.routes = None;
        self.asked = false; // an ask under way compared with the old routes: ask again
        self.ask();
    }
}

impl Drop for Follower {
    /// Stops the thread at its next look (it is not waited for: an ask under way may take the
    /// configuration nodes' timeouts, a connect the HELLO's).
    fn drop(&mut self) {
        let mut state = self.shared.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.stop = true;
        self.shared.wake.notify_one();
    }
}

/// The follower thread: one ask per request of the loop, each after the backoff.
fn follow(shared: &Shared, updates: &Sender<Update>, setup: &FollowerSetup) {
    loop {
        let in_use = {
            let mut state = shared.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            loop {
                if state.stop {
                    return;
                }
                if let Some(in_use) = state.asked.take() {
                    break in_use;
                }
                state = shared.wake.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        };
        // The failover may not be committed yet: give it a moment, as the Client does.
        std::thread::sleep(Duration::from_millis(FAILOVER_RETRY_BACKOFF_MS));
        let update = match current_addresses(&setup.cluster) {
            Ok(routes) if in_use.as_ref() == Some(&routes) => Update::Unchanged,
            Ok(routes) => {
                let FollowerSetup { registry, cluster, sessions, options, .. } = setup;
                match connect_driver_to(registry, cluster, &routes, *sessions, *options) {
                    Ok(driver) => Update::Driver { driver: Box::new(driver), routes },
                    Err(error) => Update::Failed(error),
                }
            }
            Err(error) => Update::Failed(error),
        };
        if updates.send(update).is_err() {
            return; // the loop is gone
        }
        let _ = setup.waker.wake();
    }
}
