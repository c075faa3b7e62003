//! The nemesis: injects faults on a schedule drawn from the run's seed (kills with SIGKILL and
//! restarts, pauses with SIGSTOP and SIGCONT, network partitions and their healing) and
//! records what it did.
//!
//! # Fault model
//! - `kill-one`: every kill interval (drawn from `--kill-interval` after the previous fault),
//!   one server drawn at random is killed; after a down time drawn from `--restart-after` it
//!   is restarted, and the nemesis waits until it serves again.
//! - `kill-all`: the same, but every server is killed at once and all are restarted together
//!   (persistence: every acknowledged write must survive the whole cluster dying).
//! - `pause`: every interval, one *primary* (a server the configuration service names primary
//!   of some partition; any server without replication) is stopped with SIGSTOP, and resumed
//!   with SIGCONT after a hold drawn from `--restart-after`, but never shorter than
//!   [`CHAOS_FAULT_HOLD_MS_MIN`] (longer than a lease with its drift margin) and, with
//!   replication, not before the configuration service deposed it (named other primaries for
//!   every partition it served), at most [`CHAOS_FAULT_HOLD_MS_MAX`] (then it is resumed all
//!   the same, and the report counts it). The woken process finds its lease over and a
//!   successor serving with newer writes; the requests its clients queued meanwhile, and its
//!   replication stream, are what its fencing must refuse.
//! - `partition`: the same choice of victim and the same hold, but the victim is cut off from
//!   every other server, and so from the configuration service they run, while the clients
//!   still reach it (`network.rs`, "Partitions"); then the partition heals. Namespace mode
//!   only.
//! - `mixed`: each fault drawn from kill-one, pause and partition (kill-one and pause on
//!   loopback, where no partition can be made), and kill-all when the servers keep their data
//!   on disk (`--data-dir`: a whole-cluster kill is survived only then).
//! - `none`: no fault; the control run.
//!
//! Whatever the kind, a fault only ever hits a cluster whose every server is up and not
//! paused or cut off (the previous fault was healed and its victim serves again: f = 1, one
//! failure at a time), and with replication only once the configuration service says every
//! partition has its full replica set again (the victim, or another server, caught up:
//! rejoin), at most `CHAOS_REPLICA_WAIT_MS_MAX` (then the fault is skipped and counted). A
//! restart, a catch-up or a hold longer than the interval makes the next fault late; the
//! report says by how much.
//!
//! The schedule (intervals, victims, holds, and for `mixed` the kind of each fault) is a pure
//! function of the seed, the kind and the network mode: the draws come in a fixed order from
//! one generator, whatever the timing of the run. Which server a pause or partition hits is
//! the first primary at or after the drawn server, in server order, in the configuration of
//! that moment. What the run did (when each fault and its end happened, and the pids) is the
//! timeline of [`Event`]s. A fault in place when the run stops is healed before the nemesis
//! returns, and by its guard on every other path (an error, a panic).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rampkv_ycsb::Random;
use rustix::process::Signal;
use serde::Serialize;

use super::clock::RunClock;
use super::error::ChaosError;
use super::network::{Network, NetworkMode};
use super::servers::Servers;
use crate::limits::{
    CHAOS_DEPOSED_POLL_MS, CHAOS_FAULT_HOLD_MS_MAX, CHAOS_FAULT_HOLD_MS_MIN, CHAOS_POLL_INTERVAL_MS,
    CHAOS_REPLICA_WAIT_MS_MAX, CHAOS_SLEEP_STEP_MS,
};

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
    /// SIGSTOP one primary for longer than its lease, then SIGCONT.
    Pause,
    /// Cut one primary off from every other server (clients still reach it), then heal.
    Partition,
    /// Each fault drawn from kill-one, pause and partition (and kill-all with `--data-dir`).
    Mixed,
}

/// Every kind, in the order the command line lists them.
const KINDS: [NemesisKind; 6] = [
    NemesisKind::KillOne,
    NemesisKind::KillAll,
    NemesisKind::Pause,
    NemesisKind::Partition,
    NemesisKind::Mixed,
    NemesisKind::None,
];

impl NemesisKind {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            NemesisKind::None => "none",
            NemesisKind::KillOne => "kill-one",
            NemesisKind::KillAll => "kill-all",
            NemesisKind::Pause => "pause",
            NemesisKind::Partition => "partition",
            NemesisKind::Mixed => "mixed",
        }
    }

    /// Parses a [name](NemesisKind::name).
    ///
    /// # Errors
    /// [`ChaosError::UnknownName`] for anything else.
    pub fn from_name(name: &str) -> Result<Self, ChaosError> {
        KINDS.into_iter().find(|kind| kind.name() == name).ok_or_else(|| ChaosError::UnknownName {
            what: "nemesis",
            name: name.to_owned(),
            known: "kill-one, kill-all, pause, partition, mixed, none",
        })
    }

    /// Whether its faults can leave a deposed primary alive and reachable by clients (a pause,
    /// a partition): only its fencing then keeps it from serving.
    pub fn leaves_deposed_primaries_alive(self) -> bool {
        matches!(self, NemesisKind::Pause | NemesisKind::Partition | NemesisKind::Mixed)
    }

    /// The faults it draws from (`mixed`: partitions only where the network can make them,
    /// whole-cluster kills only where the servers keep their data on disk, `persistent`).
    pub(super) fn faults(self, network: NetworkMode, persistent: bool) -> &'static [Fault] {
        match (self, network, persistent) {
            (NemesisKind::None, ..) => &[],
            (NemesisKind::KillOne, ..) => &[Fault::Kill],
            (NemesisKind::KillAll, ..) => &[Fault::KillAll],
            (NemesisKind::Pause, ..) => &[Fault::Pause],
            (NemesisKind::Partition, ..) => &[Fault::Partition],
            (NemesisKind::Mixed, NetworkMode::Namespaces, false) => &[Fault::Kill, Fault::Pause, Fault::Partition],
            (NemesisKind::Mixed, NetworkMode::Loopback, false) => &[Fault::Kill, Fault::Pause],
            (NemesisKind::Mixed, NetworkMode::Namespaces, true) => {
                &[Fault::Kill, Fault::Pause, Fault::Partition, Fault::KillAll]
            }
            (NemesisKind::Mixed, NetworkMode::Loopback, true) => &[Fault::Kill, Fault::Pause, Fault::KillAll],
        }
    }
}

/// One fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fault {
    /// SIGKILL the drawn server; restart it after the hold.
    Kill,
    /// SIGKILL every server; restart them all after the hold.
    KillAll,
    /// SIGSTOP a primary; SIGCONT after the hold.
    Pause,
    /// Cut a primary off from the other servers; heal after the hold.
    Partition,
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
    /// Stopped with SIGSTOP.
    Pause,
    /// Resumed with SIGCONT.
    Resume,
    /// Cut off from every other server (the clients still reach it).
    Partition,
    /// Its partition healed.
    Heal,
    /// The configuration service (the other servers' nodes) named other primaries for every
    /// partition it served: deposed while alive.
    Deposed,
}

/// One line of the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Event {
    /// Milliseconds since the workload started (the history's clock, in ms).
    pub at_ms: u64,
    pub server: usize,
    pub action: Action,
    /// The process killed, started, stopped, resumed, cut off or deposed.
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

/// The next fault of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Planned {
    /// Time from the previous fault.
    interval: Duration,
    fault: Fault,
    /// The server drawn (a pause or partition hits the first primary at or after it).
    server: usize,
    /// How long the fault lasts (a kill: the down time).
    hold: Duration,
}

impl Schedule {
    pub fn new(seed: u64, kill_interval: MillisecondRange, restart_after: MillisecondRange) -> Schedule {
        assert!(kill_interval.min <= kill_interval.max && restart_after.min <= restart_after.max);
        Schedule { random: Random::new(seed ^ NEMESIS_STREAM), kill_interval, restart_after }
    }

    /// The next fault among `faults` (not empty): how long after the previous one, which
    /// server, and how long it lasts. Always drawn whole and in this order (the kind last, only
    /// when there is a choice), so that the schedule of a single-fault kind is what it was
    /// before there were others, and does not depend on the timing of the run.
    fn next(&mut self, faults: &[Fault], servers: usize) -> Planned {
        assert!(!faults.is_empty() && servers > 0);
        let interval = self.kill_interval.draw(&mut self.random);
        let server = self.random.below(servers as u64) as usize;
        let hold = self.restart_after.draw(&mut self.random);
        let fault = match faults {
            [only] => *only,
            _ => faults[self.random.below(faults.len() as u64) as usize],
        };
        Planned { interval, fault, server, hold }
    }
}

/// What the nemesis did.
#[derive(Debug, Default)]
pub(super) struct NemesisOutcome {
    pub events: Vec<Event>,
    /// Faults not made because some partition still lacked a copy after
    /// `CHAOS_REPLICA_WAIT_MS_MAX` (replication: f failures at a time).
    pub skipped: u64,
    /// The longest wait, before a fault, for every partition's full replica set (rejoin).
    pub replica_wait_ms_max: u64,
    /// How much later than scheduled the latest fault came (a restart, catch-up or hold that
    /// took longer than the interval), in milliseconds.
    pub late_ms_max: u64,
    /// The longest time from a pause or partition to its victim's deposition, in milliseconds.
    pub deposed_ms_max: u64,
    /// Pauses and partitions (with replication) whose victim the configuration service had not
    /// deposed after `CHAOS_FAULT_HOLD_MS_MAX`: no failover happened.
    pub not_deposed: u64,
    /// Whole-cluster kills made (every server killed at once, then all restarted).
    pub whole_cluster_kills: u64,
}

/// Asks the configuration service which servers are primaries (of at least one partition),
/// asking every node but the one given (a stopped or cut-off server's node cannot know the
/// newest configuration). `None`: no node answered.
pub(super) type Primaries<'a> = &'a dyn Fn(Option<usize>) -> Option<Vec<usize>>;

/// What the nemesis works with besides the servers.
pub(super) struct Environment<'a> {
    pub network: &'a Network,
    pub clock: &'a RunClock,
    pub stop: &'a AtomicBool,
    pub interrupted: &'a dyn Fn() -> bool,
    pub log: &'a dyn Fn(&str),
    /// Whether a fault now stays within the failures the cluster promises to survive (with
    /// replication: every partition has its full replica set); a fault due while it is false
    /// waits for it (bounded; then it is skipped).
    pub may_fault: &'a dyn Fn() -> bool,
    /// With replication: who the primaries are now. `None`: no configuration service (every
    /// server is the primary of its partitions, and nobody is deposed).
    pub primaries: Option<Primaries<'a>>,
}

/// Runs the nemesis until `stop` is set. Servers it killed and had not restarted by then stay
/// down: the harness restarts them for the final read. A pause or partition in place then is
/// healed before it returns.
///
/// # Errors
/// A server that does not come back ([`Servers::start_ready`]), a partition that cannot be made
/// or healed, or an interruption.
pub(super) fn run(
    faults: &[Fault],
    mut schedule: Schedule,
    servers: &mut Servers,
    environment: &Environment<'_>,
) -> Result<NemesisOutcome, ChaosError> {
    let Environment { clock, stop, .. } = *environment;
    let mut outcome = NemesisOutcome::default();
    if faults.is_empty() {
        sleep_until(None, stop);
        return Ok(outcome);
    }
    let mut last_fault = clock.origin();
    loop {
        let planned = schedule.next(faults, servers.count());
        let due = last_fault + planned.interval;
        if !sleep_until(Some(due), stop) {
            return Ok(outcome);
        }
        // f = 1: the previous fault was healed and its victim serves again (below) before this
        // one, and no server died on its own meanwhile (that would be a crash, reported as such).
        servers.check_alive()?;
        debug_assert!((0..servers.count()).all(|index| servers.is_running(index)));
        match wait_until_faults_allowed(environment, &mut outcome) {
            Allowed::Stopped => return Ok(outcome),
            Allowed::No => {
                last_fault = Instant::now();
                continue;
            }
            Allowed::Yes => {}
        }
        last_fault = Instant::now();
        outcome.late_ms_max = outcome.late_ms_max.max(last_fault.saturating_duration_since(due).as_millis() as u64);
        let went_on = match planned.fault {
            Fault::Kill => kill_and_restart(&[planned.server], planned.hold, servers, environment, &mut outcome)?,
            Fault::KillAll => {
                outcome.whole_cluster_kills += 1;
                let everyone: Vec<usize> = (0..servers.count()).collect();
                kill_and_restart(&everyone, planned.hold, servers, environment, &mut outcome)?
            }
            Fault::Pause => pause(planned, servers, environment, &mut outcome),
            Fault::Partition => partition(planned, servers, environment, &mut outcome)?,
        };
        if !went_on {
            return Ok(outcome);
        }
    }
}

/// Whether a fault may be made now.
enum Allowed {
    Yes,
    /// Some partition lacked a copy for too long: skipped.
    No,
    Stopped,
}

/// Waits (bounded) until `may_fault` holds; counts the wait and a skip in `outcome`.
fn wait_until_faults_allowed(environment: &Environment<'_>, outcome: &mut NemesisOutcome) -> Allowed {
    let Environment { clock, stop, log, may_fault, .. } = *environment;
    let waiting = Instant::now();
    let wait_deadline = waiting + Duration::from_millis(CHAOS_REPLICA_WAIT_MS_MAX);
    let mut full = may_fault();
    while !full && Instant::now() < wait_deadline {
        if !sleep_until(Some(Instant::now() + Duration::from_millis(CHAOS_POLL_INTERVAL_MS)), stop) {
            return Allowed::Stopped;
        }
        full = may_fault();
    }
    outcome.replica_wait_ms_max = outcome.replica_wait_ms_max.max(waiting.elapsed().as_millis() as u64);
    if stop.load(Ordering::Acquire) {
        // Asking took a while: the run may have ended meanwhile, and no fault starts after it.
        return Allowed::Stopped;
    }
    if full {
        return Allowed::Yes;
    }
    outcome.skipped += 1;
    log(&format!(
        "{:>9} fault skipped: a partition still lacks a copy after {} ms (no server caught up)",
        clock.label(),
        CHAOS_REPLICA_WAIT_MS_MAX
    ));
    Allowed::No
}

/// Kills `victims`, and restarts them after `down`. False: the run stopped before the restart
/// (the harness restarts them).
fn kill_and_restart(
    victims: &[usize],
    down: Duration,
    servers: &mut Servers,
    environment: &Environment<'_>,
    outcome: &mut NemesisOutcome,
) -> Result<bool, ChaosError> {
    let Environment { network, clock, stop, interrupted, log, .. } = *environment;
    for &victim in victims {
        if let Some(pid) = servers.kill(victim) {
            outcome.events.push(Event { at_ms: clock.now_ms(), server: victim, action: Action::Kill, pid });
            log(&format!("{:>9} kill server {victim} (pid {pid})", clock.label()));
        }
    }
    if !sleep_until(Some(Instant::now() + down), stop) {
        return Ok(false);
    }
    restart(servers, victims, network, clock, interrupted, log, &mut outcome.events)?;
    Ok(true)
}

/// Stops the primary at or after the planned server with SIGSTOP, holds, resumes it with
/// SIGCONT. False: the run stopped during the hold (the process was resumed all the same).
fn pause(planned: Planned, servers: &Servers, environment: &Environment<'_>, outcome: &mut NemesisOutcome) -> bool {
    let Environment { clock, log, .. } = *environment;
    let victim = choose_primary(planned.server, servers.count(), environment);
    let Some(pid) = servers.signal(victim, Signal::STOP) else {
        // It has no process: it exited on its own, which the next `check_alive` reports.
        return true;
    };
    // Resumes it however this function is left (a panic in the hold too).
    let resume = ResumeOnDrop(pid);
    outcome.events.push(Event { at_ms: clock.now_ms(), server: victim, action: Action::Pause, pid });
    log(&format!("{:>9} pause server {victim} (pid {pid}, SIGSTOP)", clock.label()));
    let started = Instant::now();
    let went_on = hold(victim, pid, planned.hold, environment, outcome);
    drop(resume);
    outcome.events.push(Event { at_ms: clock.now_ms(), server: victim, action: Action::Resume, pid });
    log(&format!(
        "{:>9} resume server {victim} (pid {pid}, SIGCONT) after {} ms",
        clock.label(),
        started.elapsed().as_millis()
    ));
    went_on
}

/// Sends SIGCONT to a process the nemesis stopped, when dropped.
struct ResumeOnDrop(u32);

impl Drop for ResumeOnDrop {
    fn drop(&mut self) {
        let pid = i32::try_from(self.0).ok().and_then(rustix::process::Pid::from_raw);
        if let Some(pid) = pid {
            // Fails only if the process is gone: nothing left to resume.
            let _ = rustix::process::kill_process(pid, Signal::CONT);
        }
    }
}

/// Cuts the primary at or after the planned server off from the other servers, holds, heals.
/// False: the run stopped during the hold (the partition was healed all the same).
///
/// # Errors
/// The partition could not be made or healed (an `ip` command failed).
fn partition(
    planned: Planned,
    servers: &Servers,
    environment: &Environment<'_>,
    outcome: &mut NemesisOutcome,
) -> Result<bool, ChaosError> {
    let Environment { network, clock, log, .. } = *environment;
    let victim = choose_primary(planned.server, servers.count(), environment);
    let Some(pid) = servers.pid(victim) else { return Ok(true) };
    let started = Instant::now();
    // Healed however this function is left (its guard), normally by `heal` below.
    let cut = network.cut_off(victim, servers.count())?;
    outcome.events.push(Event { at_ms: clock.now_ms(), server: victim, action: Action::Partition, pid });
    log(&format!(
        "{:>9} partition: server {victim} (pid {pid}) cut off from every other server and the configuration \
         service; clients still reach it",
        clock.label()
    ));
    let went_on = hold(victim, pid, planned.hold, environment, outcome);
    cut.heal()?;
    outcome.events.push(Event { at_ms: clock.now_ms(), server: victim, action: Action::Heal, pid });
    log(&format!(
        "{:>9} partition of server {victim} healed after {} ms",
        clock.label(),
        started.elapsed().as_millis()
    ));
    Ok(went_on)
}

/// The first server at or after `drawn` (in server order, wrapping) that is the primary of
/// some partition now; `drawn` itself without replication, or when the configuration service
/// does not answer.
fn choose_primary(drawn: usize, servers: usize, environment: &Environment<'_>) -> usize {
    let Some(primaries) = environment.primaries else { return drawn };
    let Some(primaries) = primaries(None) else { return drawn };
    (0..servers).map(|offset| (drawn + offset) % servers).find(|server| primaries.contains(server)).unwrap_or(drawn)
}

/// Holds a pause or partition of `victim` (process `pid`): at least `planned` and
/// [`CHAOS_FAULT_HOLD_MS_MIN`]; with replication also until the configuration service deposed
/// it, at most [`CHAOS_FAULT_HOLD_MS_MAX`] (or `planned` if longer). False: the run stopped.
fn hold(
    victim: usize,
    pid: u32,
    planned: Duration,
    environment: &Environment<'_>,
    outcome: &mut NemesisOutcome,
) -> bool {
    let Environment { clock, stop, log, primaries, .. } = *environment;
    let started = Instant::now();
    let planned = planned.max(Duration::from_millis(CHAOS_FAULT_HOLD_MS_MIN));
    let until = started + planned;
    let give_up = started + planned.max(Duration::from_millis(CHAOS_FAULT_HOLD_MS_MAX));
    let mut deposed = primaries.is_none();
    loop {
        if let (false, Some(primaries)) = (deposed, primaries) {
            // Every node but the victim's: it cannot know (and a stopped one would not answer).
            if primaries(Some(victim)).is_some_and(|primaries| !primaries.contains(&victim)) {
                deposed = true;
                let after_ms = started.elapsed().as_millis() as u64;
                outcome.deposed_ms_max = outcome.deposed_ms_max.max(after_ms);
                outcome.events.push(Event { at_ms: clock.now_ms(), server: victim, action: Action::Deposed, pid });
                log(&format!(
                    "{:>9} server {victim} deposed: the configuration service names other primaries for every \
                     partition it served ({after_ms} ms after the fault)",
                    clock.label()
                ));
            }
        }
        let now = Instant::now();
        if deposed && now >= until {
            return true;
        }
        if now >= give_up {
            outcome.not_deposed += 1;
            log(&format!(
                "{:>9} server {victim} is still a primary {} ms after the fault (no failover): ending the fault",
                clock.label(),
                started.elapsed().as_millis()
            ));
            return true;
        }
        let next = if deposed { until } else { (now + Duration::from_millis(CHAOS_DEPOSED_POLL_MS)).min(give_up) };
        if !sleep_until(Some(next), stop) {
            return false;
        }
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

    fn range(min: u64, max: u64) -> MillisecondRange {
        MillisecondRange { min, max }
    }

    #[test]
    fn the_schedule_is_a_function_of_the_seed() {
        let draws = |seed, kind: NemesisKind| {
            let mut schedule = Schedule::new(seed, range(2_000, 5_000), range(500, 1_500));
            (0..20).map(|_| schedule.next(kind.faults(NetworkMode::Namespaces, false), 3)).collect::<Vec<_>>()
        };
        for kind in [NemesisKind::KillOne, NemesisKind::Pause, NemesisKind::Partition, NemesisKind::Mixed] {
            assert_eq!(draws(7, kind), draws(7, kind));
            assert_ne!(draws(7, kind), draws(8, kind));
            for planned in draws(7, kind) {
                assert!((2_000..=5_000).contains(&(planned.interval.as_millis() as u64)));
                assert!((500..=1_500).contains(&(planned.hold.as_millis() as u64)));
                assert!(planned.server < 3);
                assert!(kind.faults(NetworkMode::Namespaces, false).contains(&planned.fault));
            }
        }
        let mut all = Schedule::new(7, range(100, 100), range(0, 0));
        let planned = all.next(NemesisKind::KillAll.faults(NetworkMode::Loopback, false), 3);
        assert_eq!(
            (planned.interval, planned.fault, planned.hold),
            (Duration::from_millis(100), Fault::KillAll, Duration::ZERO)
        );
    }

    /// A single-fault kind draws what kill-one always drew (interval, server, hold), so its
    /// seeds replay as before; `mixed` draws the kind after them.
    #[test]
    fn single_fault_kinds_share_kill_ones_draws_and_mixed_draws_every_fault() {
        let draws = |kind: NemesisKind, network| {
            let mut schedule = Schedule::new(42, range(2_000, 5_000), range(500, 1_500));
            (0..200).map(|_| schedule.next(kind.faults(network, false), 5)).collect::<Vec<_>>()
        };
        let strip = |planned: &Planned| (planned.interval, planned.server, planned.hold);
        let kill: Vec<_> = draws(NemesisKind::KillOne, NetworkMode::Namespaces).iter().map(strip).collect();
        let pause: Vec<_> = draws(NemesisKind::Pause, NetworkMode::Namespaces).iter().map(strip).collect();
        assert_eq!(kill, pause);
        let mixed = draws(NemesisKind::Mixed, NetworkMode::Namespaces);
        for fault in [Fault::Kill, Fault::Pause, Fault::Partition] {
            assert!(mixed.iter().any(|planned| planned.fault == fault), "{fault:?} never drawn");
        }
        let loopback = draws(NemesisKind::Mixed, NetworkMode::Loopback);
        assert!(loopback.iter().all(|planned| planned.fault != Fault::Partition));
        assert!(loopback.iter().any(|planned| planned.fault == Fault::Pause));
        // Whole-cluster kills only where the servers keep their data on disk.
        assert!(mixed.iter().chain(&loopback).all(|planned| planned.fault != Fault::KillAll));
        for network in [NetworkMode::Namespaces, NetworkMode::Loopback] {
            let mut schedule = Schedule::new(42, range(2_000, 5_000), range(500, 1_500));
            let persistent: Vec<_> =
                (0..200).map(|_| schedule.next(NemesisKind::Mixed.faults(network, true), 5)).collect();
            assert!(persistent.iter().any(|planned| planned.fault == Fault::KillAll), "{network:?}");
            assert!(persistent.iter().any(|planned| planned.fault == Fault::Kill), "{network:?}");
        }
    }

    #[test]
    fn nemesis_names_parse() {
        for kind in KINDS {
            assert_eq!(NemesisKind::from_name(kind.name()).unwrap(), kind);
        }
        let error = NemesisKind::from_name("kill-some").unwrap_err().to_string();
        assert!(error.contains("pause, partition, mixed"), "{error}");
    }
}
