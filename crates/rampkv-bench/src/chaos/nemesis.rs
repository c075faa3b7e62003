//! The nemesis: kills server processes with SIGKILL on a schedule drawn from the run's seed,
//! and restarts them later on the same addresses and data directories.
//!
//! # Fault model
//! - `kill-one`: every kill interval (drawn from `--kill-interval` after the previous kill),
//!   one server drawn at random is killed; after a down time drawn from `--restart-after` it
//!   is restarted, and the nemesis waits until it serves again. A kill therefore only ever
//!   hits a cluster whose every server is up (f = 1: one failure at a time). With replication
//!   it also waits until the configuration service says every partition has its full replica
//!   set again (the restarted server, or another, caught up: rejoin), at most
//!   `CHAOS_REPLICA_WAIT_MS_MAX` (then the kill is skipped and counted). A restart or a
//!   catch-up that takes longer than the interval makes the next kill late; the report says by
//!   how much.
//! - `kill-all`: the same, but every server is killed at once and all are restarted together
//!   (persistence: every acknowledged write must survive the whole cluster dying).
//! - `none`: no fault; the control run.
//!
//! The schedule (intervals, victims, down times) is a pure function of the seed: the draws come
//! in a fixed order from one generator, whatever the timing of the run. What the run did with
//! it (when each kill and restart happened, and the pids) is the timeline of [`Event`]s.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rampkv_ycsb::Random;
use serde::Serialize;

use super::clock::RunClock;
use super::error::ChaosError;
use super::network::Network;
use super::servers::Servers;
use crate::limits::{CHAOS_POLL_INTERVAL_MS, CHAOS_REPLICA_WAIT_MS_MAX, CHAOS_SLEEP_STEP_MS};

/// Which faults a run injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NemesisKind {
    /// No fault.
    None,
    /// SIGKILL one random server, restart it later; one at a time.
    #[default]
    KillOne,
    /// SIGKILL every server at once, restart them all later.
    KillAll,
}

impl NemesisKind {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            NemesisKind::None => "none",
            NemesisKind::KillOne => "kill-one",
            NemesisKind::KillAll => "kill-all",
        }
    }

    /// Parses a [name](NemesisKind::name).
    ///
    /// # Errors
    /// [`ChaosError::UnknownName`] for anything else.
    pub fn from_name(name: &str) -> Result<Self, ChaosError> {
        match name {
            "none" => Ok(NemesisKind::None),
            "kill-one" => Ok(NemesisKind::KillOne),
            "kill-all" => Ok(NemesisKind::KillAll),
            _ => Err(ChaosError::UnknownName {
                what: "nemesis",
                name: name.to_owned(),
                known: "kill-one, kill-all, none",
            }),
        }
    }
}

/// What happened to a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Killed with SIGKILL.
    Kill,
    /// Started again (its process spawned).
    Restart,
    /// Serving again: every address it serves accepts connections.
    Ready,
}

/// One line of the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Event {
    /// Milliseconds since the workload started (the history's clock, in ms).
    pub at_ms: u64,
    pub server: usize,
    pub action: Action,
    /// The process killed, or the one started.
    pub pid: u32,
}

/// A closed range of milliseconds, `min..=max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MillisecondRange {
    pub min: u64,
    pub max: u64,
}

impl MillisecondRange {
    fn draw(self, random: &mut Random) -> Duration {
        Duration::from_millis(self.min + random.below(self.max - self.min + 1))
    }
}

/// The draws of the nemesis, in a fixed order from one generator seeded by the run's seed.
#[derive(Debug)]
pub(super) struct Schedule {
    random: Random,
    kill_interval: MillisecondRange,
    restart_after: MillisecondRange,
}

/// Mixed into the run's seed so that the nemesis draws from a stream of its own, not the
/// workload's.
const NEMESIS_STREAM: u64 = 0x6E65_6D65_7369_7321;

impl Schedule {
    pub fn new(seed: u64, kill_interval: MillisecondRange, restart_after: MillisecondRange) -> Schedule {
        assert!(kill_interval.min <= kill_interval.max && restart_after.min <= restart_after.max);
        Schedule { random: Random::new(seed ^ NEMESIS_STREAM), kill_interval, restart_after }
    }

    /// The next kill: how long after the previous one, which servers, and how long they stay
    /// down. Always drawn whole, so the schedule does not depend on the nemesis kind's timing.
    fn next(&mut self, kind: NemesisKind, servers: usize) -> (Duration, Vec<usize>, Duration) {
        let interval = self.kill_interval.draw(&mut self.random);
        let victim = self.random.below(servers as u64) as usize;
        let down = self.restart_after.draw(&mut self.random);
        let victims = match kind {
            NemesisKind::KillAll => (0..servers).collect(),
            NemesisKind::KillOne | NemesisKind::None => vec![victim],
        };
        (interval, victims, down)
    }
}

/// What the nemesis did.
#[derive(Debug, Default)]
pub(super) struct NemesisOutcome {
    pub events: Vec<Event>,
    /// Kills not made because some partition still lacked a copy after
    /// `CHAOS_REPLICA_WAIT_MS_MAX` (replication: f failures at a time).
    pub skipped: u64,
    /// The longest wait, before a kill, for every partition's full replica set (rejoin).
    pub replica_wait_ms_max: u64,
    /// How much later than scheduled the latest kill came (a restart that took longer than the
    /// interval), in milliseconds.
    pub late_ms_max: u64,
}

/// Runs the nemesis until `stop` is set. Servers it killed and had not restarted by then stay
/// down: the harness restarts them for the final read.
///
/// # Errors
/// A server that does not come back ([`Servers::start_ready`]), or an interruption.
/// What the nemesis works with besides the servers.
pub(super) struct Environment<'a> {
    pub network: &'a Network,
    pub clock: &'a RunClock,
    pub stop: &'a AtomicBool,
    pub interrupted: &'a dyn Fn() -> bool,
    pub log: &'a dyn Fn(&str),
    /// Whether a kill now stays within the failures the cluster promises to survive (with
    /// replication: every partition has its full replica set); a kill due while it is false
    /// waits for it (bounded; then it is skipped).
    pub may_kill: &'a dyn Fn() -> bool,
}

pub(super) fn run(
    kind: NemesisKind,
    mut schedule: Schedule,
    servers: &mut Servers,
    environment: &Environment<'_>,
) -> Result<NemesisOutcome, ChaosError> {
    let Environment { network, clock, stop, interrupted, log, may_kill } = *environment;
    let mut outcome = NemesisOutcome::default();
    if kind == NemesisKind::None {
        sleep_until(None, stop);
        return Ok(outcome);
    }
    let mut last_kill = clock.origin();
    loop {
        let (interval, victims, down) = schedule.next(kind, servers.count());
        let due = last_kill + interval;
        if !sleep_until(Some(due), stop) {
            return Ok(outcome);
        }
        // f = 1: the previous victims were restarted and serve again (below) before this kill,
        // and no server died on its own meanwhile (that would be a crash, reported as such).
        servers.check_alive()?;
        debug_assert!((0..servers.count()).all(|index| servers.is_running(index)));
        let waiting = Instant::now();
        let wait_deadline = waiting + Duration::from_millis(CHAOS_REPLICA_WAIT_MS_MAX);
        let mut full = may_kill();
        while !full && Instant::now() < wait_deadline {
            if !sleep_until(Some(Instant::now() + Duration::from_millis(CHAOS_POLL_INTERVAL_MS)), stop) {
                return Ok(outcome);
            }
            full = may_kill();
        }
        outcome.replica_wait_ms_max = outcome.replica_wait_ms_max.max(waiting.elapsed().as_millis() as u64);
        if !full {
            outcome.skipped += 1;
            log(&format!(
                "{:>9} kill skipped: a partition still lacks a copy after {} ms (no server caught up)",
                clock.label(),
                CHAOS_REPLICA_WAIT_MS_MAX
            ));
            last_kill = Instant::now();
            continue;
        }
        for &victim in &victims {
            if let Some(pid) = servers.kill(victim) {
                outcome.events.push(Event { at_ms: clock.now_ms(), server: victim, action: Action::Kill, pid });
                log(&format!("{:>9} kill server {victim} (pid {pid})", clock.label()));
            }
        }
        last_kill = Instant::now();
        outcome.late_ms_max = outcome.late_ms_max.max(last_kill.saturating_duration_since(due).as_millis() as u64);
        if !sleep_until(Some(last_kill + down), stop) {
            return Ok(outcome);
        }
        restart(servers, &victims, network, clock, interrupted, log, &mut outcome.events)?;
    }
}

/// Restarts `victims` and waits until each serves, recording both in `events`.
pub(super) fn restart(
    servers: &mut Servers,
    victims: &[usize],
    network: &Network,
    clock: &RunClock,
    interrupted: &dyn Fn() -> bool,
    log: &dyn Fn(&str),
    events: &mut Vec<Event>,
) -> Result<(), ChaosError> {
    let restarted_ms = clock.now_ms();
    let ready = servers.start_ready(network, victims, interrupted)?;
    for (&server, &pid) in victims.iter().zip(&ready) {
        events.push(Event { at_ms: restarted_ms, server, action: Action::Restart, pid });
    }
    let ready_ms = clock.now_ms();
    for (&server, &pid) in victims.iter().zip(&ready) {
        events.push(Event { at_ms: ready_ms, server, action: Action::Ready, pid });
        log(&format!(
            "{:>9} restart server {server} (pid {pid}), serving after {} ms",
            RunClock::label_of(restarted_ms),
            ready_ms - restarted_ms
        ));
    }
    Ok(())
}

/// Sleeps until `until` (forever if `None`) in steps of [`CHAOS_SLEEP_STEP_MS`]; returns
/// false as soon as `stop` is set.
fn sleep_until(until: Option<Instant>, stop: &AtomicBool) -> bool {
    let step = Duration::from_millis(CHAOS_SLEEP_STEP_MS);
    loop {
        if stop.load(Ordering::Acquire) {
            return false;
        }
        let left = match until {
            Some(until) => until.saturating_duration_since(Instant::now()),
            None => step,
        };
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(left.min(step));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_is_a_function_of_the_seed() {
        let range = |min, max| MillisecondRange { min, max };
        let draws = |seed| {
            let mut schedule = Schedule::new(seed, range(2_000, 5_000), range(500, 1_500));
            (0..20).map(|_| schedule.next(NemesisKind::KillOne, 3)).collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
        for (interval, victims, down) in draws(7) {
            assert!((2_000..=5_000).contains(&(interval.as_millis() as u64)));
            assert!((500..=1_500).contains(&(down.as_millis() as u64)));
            assert!(victims.len() == 1 && victims[0] < 3);
        }
        let mut all = Schedule::new(7, range(100, 100), range(0, 0));
        assert_eq!(all.next(NemesisKind::KillAll, 3), (Duration::from_millis(100), vec![0, 1, 2], Duration::ZERO));
    }

    #[test]
    fn nemesis_names_parse() {
        for kind in [NemesisKind::None, NemesisKind::KillOne, NemesisKind::KillAll] {
            assert_eq!(NemesisKind::from_name(kind.name()).unwrap(), kind);
        }
        assert!(NemesisKind::from_name("kill-some").is_err());
    }
}
