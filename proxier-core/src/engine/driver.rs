//! The driver: decides when a [`Proxier`] syncs, and whether incrementally or fully, as
//! kube-proxy's bounded-frequency runner does; the daemon and embedders reuse it.
//!
//! [`SyncScheduler`] is pure (time is passed in): changes are synced as soon as a token is
//! available (a bucket of `burst` tokens refilled one per `min_sync_period`); a full resync
//! runs every `sync_period`; a failed sync is retried as a full one after a backoff that
//! doubles up to `sync_period`. [`run`] is the async loop: it owns the proxier, applies the
//! changes sent through a [`ProxierHandle`] between syncs, wakes for drains and retries
//! ([`Proxier::next_deadline`]) and tells a [`SyncObserver`] about every sync.

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::{EngineError, FullSyncRead, KernelRead, Proxier, SyncKind, SyncReport};
use crate::backend::{AddressBackend, IpvsBackend};
use crate::conntrack::ConntrackBackend;
use crate::netfilter::NetfilterBackend;
use crate::state::Change;

/// What the runner should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Start a sync of this kind now.
    Run(SyncKind),
    /// Nothing to do before this time (or before a new request arrives).
    WaitUntil(Instant),
    /// A sync is running; wait for it to finish.
    Busy,
}

/// Timing parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverConfig {
    /// Minimum time between syncs once the burst is spent (0: no limit).
    pub min_sync_period: Duration,
    /// Time between full resyncs.
    pub sync_period: Duration,
    /// Syncs allowed back to back (at least 1).
    pub burst: u32,
    /// First retry delay after a failed sync.
    pub retry_initial: Duration,
}

impl DriverConfig {
    /// kube-proxy's timing: a full resync every `sync_period`, at most `burst` syncs back to
    /// back then one per `min_sync_period`; the first retry after 1 s (at most the period).
    pub fn new(sync_period: Duration, min_sync_period: Duration, burst: u32) -> DriverConfig {
        DriverConfig {
            min_sync_period,
            sync_period,
            burst,
            retry_initial: Duration::from_secs(1).min(sync_period),
        }
    }
}

/// The pure scheduling state.
#[derive(Debug, Clone)]
pub struct SyncScheduler {
    config: DriverConfig,
    tokens: f64,
    refilled_at: Instant,
    changes_pending: bool,
    full_due_at: Instant,
    retry_at: Option<Instant>,
    retry_delay: Duration,
    running: bool,
    /// A full sync's kernel read is in flight (incremental syncs may run meanwhile).
    reading: bool,
}

impl SyncScheduler {
    /// A scheduler whose first sync is a full one, due at once.
    pub fn new(config: DriverConfig, now: Instant) -> SyncScheduler {
        let burst = config.burst.max(1);
        SyncScheduler {
            config: DriverConfig { burst, ..config },
            tokens: f64::from(burst),
            refilled_at: now,
            changes_pending: false,
            full_due_at: now,
            retry_at: None,
            retry_delay: config.retry_initial,
            running: false,
            reading: false,
        }
    }

    fn refill(&mut self, now: Instant) {
        let cap = f64::from(self.config.burst);
        if self.config.min_sync_period.is_zero() {
            self.tokens = cap;
        } else {
            let elapsed = now.saturating_duration_since(self.refilled_at);
            let gained = elapsed.as_secs_f64() / self.config.min_sync_period.as_secs_f64();
            self.tokens = (self.tokens + gained).min(cap);
        }
        self.refilled_at = now;
    }

    /// When the next token is available (now if one is).
    fn token_ready_at(&self, now: Instant) -> Instant {
        if self.tokens >= 1.0 {
            return now;
        }
        let missing = 1.0 - self.tokens;
        now + self.config.min_sync_period.mul_f64(missing)
    }

    /// Services or endpoints changed: an incremental sync is wanted.
    pub fn request_sync(&mut self) {
        self.changes_pending = true;
    }

    /// A full resync is wanted as soon as allowed.
    pub fn request_full(&mut self, now: Instant) {
        self.full_due_at = self.full_due_at.min(now);
    }

    /// Whether changes are waiting for a sync.
    pub fn changes_pending(&self) -> bool {
        self.changes_pending
    }

    /// Decides what to do at `now`. Returning `Run` takes a token and marks the sync running
    /// (and the pending changes as taken); call [`SyncScheduler::finished`] afterwards.
    pub fn poll(&mut self, now: Instant) -> Decision {
        if self.running {
            return Decision::Busy;
        }
        self.refill(now);
        // After a failure, the retry time (not the missed schedule) says when the full sync
        // runs; one whose read is in flight is not due again.
        let full_due = !self.reading
            && match self.retry_at {
                Some(retry) => now >= retry,
                None => now >= self.full_due_at,
            };
        let wanted = if full_due {
            Some(SyncKind::Full)
        } else if self.changes_pending && self.retry_at.is_none() {
            Some(SyncKind::Incremental)
        } else {
            None
        };
        let Some(kind) = wanted else {
            if self.reading {
                // The read's end wakes the driver; nothing else is due before it.
                return Decision::WaitUntil(now + self.config.sync_period);
            }
            return Decision::WaitUntil(self.retry_at.unwrap_or(self.full_due_at));
        };
        let ready = self.token_ready_at(now);
        if ready > now {
            return Decision::WaitUntil(ready);
        }
        self.tokens -= 1.0;
        self.running = true;
        self.changes_pending = false;
        Decision::Run(kind)
    }

    /// The full sync [`SyncScheduler::poll`] started runs its kernel read beside other work:
    /// incremental syncs may run until it is [`SyncScheduler::finished`].
    pub fn reading(&mut self) {
        self.running = false;
        self.reading = true;
    }

    /// Records the end of the running sync (or of the full sync whose read was in flight).
    pub fn finished(&mut self, now: Instant, kind: SyncKind, succeeded: bool) {
        self.running = false;
        if kind == SyncKind::Full {
            self.reading = false;
        }
        if succeeded {
            self.retry_at = None;
            self.retry_delay = self.config.retry_initial;
            if kind == SyncKind::Full {
                self.full_due_at = now + self.config.sync_period;
            }
        } else {
            // What failed is unknown: retry with a full sync, backing off.
            self.retry_at = Some(now + self.retry_delay);
            self.retry_delay = (self.retry_delay * 2).min(self.config.sync_period);
        }
    }
}

/// What a [`ProxierHandle`] sends to [`run`].
#[derive(Debug)]
enum Command {
    Apply(Vec<Change>),
    NodeAddresses,
    Full,
}

/// How to feed a running [`run`] loop; cheap to clone. Sends never block; after the loop
/// ended they are dropped.
#[derive(Debug, Clone)]
pub struct ProxierHandle {
    tx: mpsc::UnboundedSender<Command>,
}

/// The receiving end of a [`ProxierHandle`], for [`run`].
#[derive(Debug)]
pub struct Commands {
    rx: mpsc::UnboundedReceiver<Command>,
    /// For the loop's own address watch; weak, so that dropping every handle still ends it.
    tx: mpsc::WeakUnboundedSender<Command>,
}

impl ProxierHandle {
    /// A handle and the receiving end to give [`run`].
    pub fn new() -> (ProxierHandle, Commands) {
        let (tx, rx) = mpsc::unbounded_channel();
        let weak = tx.downgrade();
        (ProxierHandle { tx }, Commands { rx, tx: weak })
    }

    /// Applies changes (in order) before the next sync, and asks for one if they change
    /// anything.
    pub fn apply(&self, changes: Vec<Change>) {
        if !changes.is_empty() {
            let _ = self.tx.send(Command::Apply(changes));
        }
    }

    /// The node's addresses may have changed (an rtnetlink address event): the driver
    /// re-reads them ([`Proxier::refresh_node_addresses`]) and syncs if they did.
    pub fn node_addresses_changed(&self) {
        let _ = self.tx.send(Command::NodeAddresses);
    }

    /// Asks for a full resync as soon as allowed.
    pub fn request_full(&self) {
        let _ = self.tx.send(Command::Full);
    }
}

/// One finished sync, as [`run`] reports it.
#[derive(Debug)]
pub struct SyncOutcome<'a> {
    /// What ran.
    pub kind: SyncKind,
    /// How long it took.
    pub took: Duration,
    /// Its report, or why it could not run.
    pub result: &'a Result<SyncReport, EngineError>,
    /// Whether it counts as a success (no nftables failure, kernel readable); failures are
    /// retried as full syncs.
    pub succeeded: bool,
    /// Whether more changes arrived meanwhile (another sync follows).
    pub changes_pending: bool,
}

/// Told about what [`run`] does: metrics, health, printing.
pub trait SyncObserver<P> {
    /// A change was queued for a sync.
    fn queued(&mut self) {}

    /// A sync finished; `proxier` is as it left it.
    fn synced(&mut self, proxier: &P, outcome: &SyncOutcome<'_>);
}

/// Drives `proxier` until `shutdown` turns true or every [`ProxierHandle`] is dropped: the
/// first sync (full) runs at once, then as `config` and the changes decide. A proxier that
/// takes the node's addresses from the kernel ([`ProxierConfig::node_addresses_from_kernel`])
/// also follows rtnetlink address events, so NodePorts move with the node's interfaces.
///
/// [`ProxierConfig::node_addresses_from_kernel`]: crate::ProxierConfig::node_addresses_from_kernel
pub async fn run<I, A, N, C, O>(
    proxier: &mut Proxier<I, A, N, C>,
    config: DriverConfig,
    commands: Commands,
    observer: &mut O,
    shutdown: watch::Receiver<bool>,
) where
    I: IpvsBackend,
    A: AddressBackend,
    N: NetfilterBackend,
    C: ConntrackBackend + Send + 'static,
    O: SyncObserver<Proxier<I, A, N, C>>,
{
    // Incremental syncs do not wait for their nftables update; the loop syncs its answer
    // when it ends, and waits for the last one before it returns.
    proxier.detach_netfilter_updates(true);
    drive(proxier, config, commands, observer, shutdown).await;
    proxier.detach_netfilter_updates(false);
    proxier.finish_netfilter_update().await;
}

/// [`run`]'s loop.
async fn drive<I, A, N, C, O>(
    proxier: &mut Proxier<I, A, N, C>,
    config: DriverConfig,
    mut commands: Commands,
    observer: &mut O,
    mut shutdown: watch::Receiver<bool>,
) where
    I: IpvsBackend,
    A: AddressBackend,
    N: NetfilterBackend,
    C: ConntrackBackend + Send + 'static,
    O: SyncObserver<Proxier<I, A, N, C>>,
{
    // The address watch starts after the first sync: that sync binds every ClusterIP on the
    // dummy link, and a watch already listening would be sent one event per address (the
    // kernel queues each one to the socket, the daemon wakes and decodes it) while the
    // binding is the start's longest step.
    let mut address_watch_pending = proxier.config().node_addresses_from_kernel;
    let mut scheduler = SyncScheduler::new(config, Instant::now());
    let mut open = true;
    let mut addresses_changed = false;
    // A full sync's kernel read, running beside incremental syncs (decision 8: no change
    // waits for a full resync's read).
    let mut full_read: Option<SpawnedRead> = None;
    // When the full sync whose repair goes on in slices started (between slices,
    // incremental syncs run: no change waits for the whole table to be compared).
    let mut repair_started: Option<Instant> = None;
    // An incremental sync's nftables update runs on after it; its end wakes the loop.
    let netfilter_update_ended = proxier.netfilter_update_ended();
    loop {
        while let Ok(command) = commands.rx.try_recv() {
            handle(
                command,
                proxier,
                &mut scheduler,
                observer,
                &mut addresses_changed,
            );
        }
        if full_read.as_ref().is_some_and(SpawnedRead::is_finished) {
            let answer = SpawnedRead::answer(&mut full_read).await;
            repair_started =
                start_repair(proxier, answer, &mut scheduler, observer, &commands).await;
            continue;
        }
        // An incremental sync's nftables update that ended: a sync takes its answer and
        // brings in the elements that waited for it (or, after a failure, replaces the
        // tables).
        if proxier.netfilter_update_finished() {
            scheduler.request_sync();
        }
        // A burst of address events is one re-read.
        if std::mem::take(&mut addresses_changed) && proxier.refresh_node_addresses().await {
            scheduler.request_sync();
            observer.queued();
        }
        if *shutdown.borrow() {
            return;
        }
        if proxier
            .next_deadline()
            .is_some_and(|at| at <= Instant::now())
        {
            scheduler.request_sync();
        }
        match scheduler.poll(Instant::now()) {
            Decision::Run(SyncKind::Full) if proxier.reads_concurrently() => {
                tracing::info!("full sync: reading the kernel beside incremental syncs");
                full_read = Some(SpawnedRead::start(proxier.begin_full_sync()));
                scheduler.reading();
                // The changes the full sync would have taken do not wait for its read.
                if proxier.has_pending_changes() {
                    scheduler.request_sync();
                }
            }
            Decision::Run(kind) => {
                let started = Instant::now();
                tracing::debug!(?kind, "sync starting");
                let result = proxier.sync(kind).await;
                report(
                    proxier,
                    &mut scheduler,
                    observer,
                    &commands,
                    kind,
                    started,
                    result,
                );
                if std::mem::take(&mut address_watch_pending) {
                    watch_node_addresses(proxier, commands.tx.clone());
                    // One re-read covers an address that changed between the first sync's
                    // read of the node's addresses and the subscription.
                    addresses_changed = true;
                }
            }
            Decision::Busy => tokio::task::yield_now().await,
            Decision::WaitUntil(_) if repair_started.is_some() => {
                // Nothing else to do now: the next slice of the full sync's repair.
                repair_step(
                    proxier,
                    &mut repair_started,
                    &mut scheduler,
                    observer,
                    &commands,
                )
                .await;
                tokio::task::yield_now().await;
            }
            Decision::WaitUntil(at) => {
                let at = proxier
                    .next_deadline()
                    .map_or(at, |deadline| deadline.min(at));
                if !open {
                    // Every handle is gone: nothing can change any more.
                    return;
                }
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = netfilter_update_ended.notified(), if proxier.netfilter_updating() => {}
                    answer = SpawnedRead::answer(&mut full_read) => {
                        repair_started =
                            start_repair(proxier, answer, &mut scheduler, observer, &commands).await;
                    }
                    command = commands.rx.recv() => match command {
                        Some(command) => handle(
                            command,
                            proxier,
                            &mut scheduler,
                            observer,
                            &mut addresses_changed,
                        ),
                        None => open = false,
                    },
                    changed = shutdown.changed() => {
                        if changed.is_err() || *shutdown.borrow() {
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// The name of the thread a full sync's kernel read runs on.
const READ_THREAD: &str = "full-sync-read";

/// Its nice value: low enough that incremental syncs take the CPUs first, not the lowest,
/// so that on a node whose pods keep every CPU busy the read (and the repair that waits
/// for it) still gets about a tenth of a CPU.
const READ_NICE: i32 = 10;

/// A full sync's kernel read spawned on a background thread, its answer awaited by a task
/// of the runtime; aborted (and the read cancelled) when dropped, the driver stopping
/// mid-read.
struct SpawnedRead {
    task: tokio::task::JoinHandle<(KernelRead, Instant)>,
    started: Instant,
}

impl SpawnedRead {
    /// Starts the read on a background thread at a low CPU priority ([`READ_NICE`]):
    /// incremental syncs go on meanwhile and must not share the CPUs with it as equals (the
    /// read takes both for seconds at 10,000 Services). A thread
    /// that cannot start fails the read (the full sync is retried).
    fn start(read: FullSyncRead) -> SpawnedRead {
        let task = read.spawn_in_background(READ_THREAD, READ_NICE);
        SpawnedRead {
            task,
            started: Instant::now(),
        }
    }

    fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits for the answer of the read in `slot` (forever when there is none), then empties
    /// the slot. Cancel-safe: dropped before the answer, it leaves the read in the slot.
    async fn answer(slot: &mut Option<SpawnedRead>) -> (KernelRead, Instant) {
        let Some(read) = slot else {
            return std::future::pending().await;
        };
        let answer = match (&mut read.task).await {
            Ok((answer, _ended)) => answer,
            Err(error) => KernelRead::failed(format!("the kernel read task failed: {error}")),
        };
        let started = read.started;
        *slot = None;
        (answer, started)
    }
}

impl Drop for SpawnedRead {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts the repair of a full sync with its kernel read (its answer and when it
/// started); reports the full sync when nothing is left to repair, else returns when it
/// started, for [`repair_step`].
async fn start_repair<I, A, N, C, O>(
    proxier: &mut Proxier<I, A, N, C>,
    (read, started): (KernelRead, Instant),
    scheduler: &mut SyncScheduler,
    observer: &mut O,
    commands: &Commands,
) -> Option<Instant>
where
    I: IpvsBackend,
    A: AddressBackend,
    N: NetfilterBackend,
    C: ConntrackBackend + Send + 'static,
    O: SyncObserver<Proxier<I, A, N, C>>,
{
    tracing::info!(waited = ?started.elapsed(), "full sync: kernel read, repairing");
    let result = match proxier.start_repair(read).await {
        Ok(None) => return Some(started),
        Ok(Some(report)) => Ok(report),
        Err(error) => Err(error),
    };
    report(
        proxier,
        scheduler,
        observer,
        commands,
        SyncKind::Full,
        started,
        result,
    );
    None
}

/// Repairs the next slice of the full sync that started at `started`; reports the full
/// sync after its last slice and empties `started`.
async fn repair_step<I, A, N, C, O>(
    proxier: &mut Proxier<I, A, N, C>,
    started: &mut Option<Instant>,
    scheduler: &mut SyncScheduler,
    observer: &mut O,
    commands: &Commands,
) where
    I: IpvsBackend,
    A: AddressBackend,
    N: NetfilterBackend,
    C: ConntrackBackend + Send + 'static,
    O: SyncObserver<Proxier<I, A, N, C>>,
{
    let Some(at) = *started else {
        return;
    };
    match proxier.repair_step().await {
        Some(result) => {
            *started = None;
            report(
                proxier,
                scheduler,
                observer,
                commands,
                SyncKind::Full,
                at,
                result,
            );
        }
        None if !proxier.repairing() => {
            // Not expected: the repair ended without its report. Retry the full sync.
            tracing::warn!("full sync's repair ended without a report; retrying it");
            *started = None;
            scheduler.finished(Instant::now(), SyncKind::Full, false);
        }
        None => {}
    }
}

/// Records a finished sync with the scheduler and tells the observer.
fn report<I, A, N, C, O>(
    proxier: &Proxier<I, A, N, C>,
    scheduler: &mut SyncScheduler,
    observer: &mut O,
    commands: &Commands,
    kind: SyncKind,
    started: Instant,
    result: Result<SyncReport, EngineError>,
) where
    I: IpvsBackend,
    A: AddressBackend,
    N: NetfilterBackend,
    C: ConntrackBackend + Send + 'static,
    O: SyncObserver<Proxier<I, A, N, C>>,
{
    let succeeded = result
        .as_ref()
        .is_ok_and(|report| report.netfilter_error.is_none());
    let kind = result.as_ref().map_or(kind, |report| report.kind);
    if let Err(error) = &result {
        tracing::error!(?kind, %error, "sync failed; will retry with a full sync");
    }
    scheduler.finished(Instant::now(), kind, succeeded);
    tracing::debug!(?kind, took = ?started.elapsed(), succeeded, "sync done");
    let outcome = SyncOutcome {
        kind,
        took: started.elapsed(),
        result: &result,
        succeeded,
        changes_pending: scheduler.changes_pending() || !commands.rx.is_empty(),
    };
    observer.synced(proxier, &outcome);
}

fn handle<P, O: SyncObserver<P>, I, A, N, C>(
    command: Command,
    proxier: &mut Proxier<I, A, N, C>,
    scheduler: &mut SyncScheduler,
    observer: &mut O,
    addresses_changed: &mut bool,
) where
    I: IpvsBackend,
    A: AddressBackend,
    N: NetfilterBackend,
    C: ConntrackBackend + Send + 'static,
{
    match command {
        Command::Apply(changes) => {
            let mut changed = false;
            for change in changes {
                changed |= proxier.apply(change);
            }
            if changed {
                scheduler.request_sync();
                observer.queued();
            }
        }
        Command::NodeAddresses => *addresses_changed = true,
        Command::Full => scheduler.request_full(Instant::now()),
    }
}

/// Starts the address watch of a proxier that reads node addresses from the kernel; a watch
/// that cannot start leaves NodePorts to follow address changes at full resyncs.
fn watch_node_addresses<I, A, N, C>(
    proxier: &Proxier<I, A, N, C>,
    commands: mpsc::WeakUnboundedSender<Command>,
) where
    I: IpvsBackend,
    A: AddressBackend,
    N: NetfilterBackend,
    C: ConntrackBackend + Send + 'static,
{
    let link = proxier
        .reconciler()
        .address_backend()
        .link_name()
        .to_owned();
    let watched = crate::backend::address::watch_node_addresses(link, move || {
        if let Some(tx) = commands.upgrade() {
            let _ = tx.send(Command::NodeAddresses);
        }
    });
    if let Err(error) = watched {
        tracing::warn!(%error, "cannot watch address changes; NodePorts follow them at full resyncs only");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(min_ms: u64, period_s: u64, burst: u32) -> DriverConfig {
        DriverConfig {
            min_sync_period: Duration::from_millis(min_ms),
            sync_period: Duration::from_secs(period_s),
            burst,
            retry_initial: Duration::from_secs(1),
        }
    }

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn first_sync_is_full_and_immediate() {
        let t0 = Instant::now();
        let mut s = SyncScheduler::new(cfg(1000, 30, 2), t0);
        assert_eq!(s.poll(t0), Decision::Run(SyncKind::Full));
        assert_eq!(s.poll(t0), Decision::Busy);
        s.finished(t0, SyncKind::Full, true);
        // Nothing pending: wait for the next full resync.
        assert_eq!(
            s.poll(t0),
            Decision::WaitUntil(t0 + Duration::from_secs(30))
        );
    }

    #[test]
    fn burst_then_min_sync_period() {
        let t0 = Instant::now();
        let mut s = SyncScheduler::new(cfg(1000, 30, 2), t0);
        assert_eq!(s.poll(t0), Decision::Run(SyncKind::Full)); // token 1
        s.finished(t0, SyncKind::Full, true);
        s.request_sync();
        assert_eq!(s.poll(t0), Decision::Run(SyncKind::Incremental)); // token 2
        s.finished(t0, SyncKind::Incremental, true);
        s.request_sync();
        // Burst spent: the next token comes after min_sync_period.
        assert_eq!(s.poll(t0), Decision::WaitUntil(t0 + ms(1000)));
        assert_eq!(s.poll(t0 + ms(400)), Decision::WaitUntil(t0 + ms(1000)));
        assert_eq!(s.poll(t0 + ms(1000)), Decision::Run(SyncKind::Incremental));
        s.finished(t0 + ms(1000), SyncKind::Incremental, true);
        // Several changes while waiting collapse into one sync.
        s.request_sync();
        s.request_sync();
        s.request_sync();
        assert_eq!(s.poll(t0 + ms(1500)), Decision::WaitUntil(t0 + ms(2000)));
        assert_eq!(s.poll(t0 + ms(2000)), Decision::Run(SyncKind::Incremental));
        s.finished(t0 + ms(2000), SyncKind::Incremental, true);
        assert_eq!(
            s.poll(t0 + ms(2000)),
            Decision::WaitUntil(t0 + Duration::from_secs(30))
        );
    }

    #[test]
    fn tokens_refill_up_to_burst_only() {
        let t0 = Instant::now();
        let mut s = SyncScheduler::new(cfg(1000, 300, 3), t0);
        for _ in 0..3 {
            s.request_sync();
            let d = s.poll(t0);
            assert!(matches!(d, Decision::Run(_)), "{d:?}");
            s.finished(t0, SyncKind::Full, true);
        }
        // After a long quiet time, at most `burst` syncs run back to back.
        let later = t0 + Duration::from_secs(100);
        for _ in 0..3 {
            s.request_sync();
            assert_eq!(s.poll(later), Decision::Run(SyncKind::Incremental));
            s.finished(later, SyncKind::Incremental, true);
        }
        s.request_sync();
        assert_eq!(s.poll(later), Decision::WaitUntil(later + ms(1000)));
    }

    #[test]
    fn zero_min_sync_period_never_waits() {
        let t0 = Instant::now();
        let mut s = SyncScheduler::new(cfg(0, 30, 1), t0);
        assert_eq!(s.poll(t0), Decision::Run(SyncKind::Full));
        s.finished(t0, SyncKind::Full, true);
        for _ in 0..10 {
            s.request_sync();
            assert_eq!(s.poll(t0), Decision::Run(SyncKind::Incremental));
            s.finished(t0, SyncKind::Incremental, true);
        }
    }

    #[test]
    fn full_resync_comes_every_sync_period_even_when_busy() {
        let t0 = Instant::now();
        let mut s = SyncScheduler::new(cfg(0, 30, 2), t0);
        assert_eq!(s.poll(t0), Decision::Run(SyncKind::Full));
        s.finished(t0, SyncKind::Full, true);
        let mut t = t0;
        // Changes every second do not postpone the full resync.
        for _ in 0..29 {
            t += Duration::from_secs(1);
            s.request_sync();
            assert_eq!(s.poll(t), Decision::Run(SyncKind::Incremental));
            s.finished(t, SyncKind::Incremental, true);
        }
        t += Duration::from_secs(1);
        s.request_sync();
        assert_eq!(
            s.poll(t),
            Decision::Run(SyncKind::Full),
            "full covers pending changes too"
        );
        s.finished(t, SyncKind::Full, true);
        assert_eq!(s.poll(t), Decision::WaitUntil(t + Duration::from_secs(30)));
    }

    #[test]
    fn changes_arriving_during_a_sync_are_not_lost() {
        let t0 = Instant::now();
        let mut s = SyncScheduler::new(cfg(0, 30, 2), t0);
        assert_eq!(s.poll(t0), Decision::Run(SyncKind::Full));
        s.request_sync(); // arrives while the sync runs
        s.finished(t0, SyncKind::Full, true);
        assert!(s.changes_pending());
        assert_eq!(s.poll(t0), Decision::Run(SyncKind::Incremental));
    }

    #[test]
    fn changes_sync_while_a_full_resyncs_read_is_in_flight() {
        let t0 = Instant::now();
        let mut s = SyncScheduler::new(cfg(0, 30, 2), t0);
        assert_eq!(s.poll(t0), Decision::Run(SyncKind::Full));
        s.finished(t0, SyncKind::Full, true);
        let t1 = t0 + Duration::from_secs(30);
        assert_eq!(s.poll(t1), Decision::Run(SyncKind::Full));
        s.reading();
        // The read runs: nothing is due, and the wait is not a spin on a past deadline.
        match s.poll(t1) {
            Decision::WaitUntil(at) => assert!(at > t1, "{at:?} is not after {t1:?}"),
            other => panic!("expected a wait, got {other:?}"),
        }
        // A change during the read syncs at once, and again for the next one.
        for step in 1..=3 {
            let t = t1 + ms(10 * step);
            s.request_sync();
            assert_eq!(s.poll(t), Decision::Run(SyncKind::Incremental));
            s.finished(t, SyncKind::Incremental, true);
        }
        // The read's end finishes the full sync: the next one is a period later.
        let t2 = t1 + Duration::from_secs(4);
        s.finished(t2, SyncKind::Full, true);
        assert_eq!(
            s.poll(t2),
            Decision::WaitUntil(t2 + Duration::from_secs(30))
        );
    }

    #[test]
    fn failures_retry_fully_with_backoff_capped_at_sync_period() {
        let t0 = Instant::now();
        let mut s = SyncScheduler::new(cfg(0, 5, 1), t0);
        assert_eq!(s.poll(t0), Decision::Run(SyncKind::Full));
        s.finished(t0, SyncKind::Full, false);
        let mut t = t0;
        for delay in [1, 2, 4, 5, 5] {
            let retry = t + Duration::from_secs(delay);
            assert_eq!(s.poll(t), Decision::WaitUntil(retry), "backoff {delay}s");
            s.request_sync();
            assert_eq!(
                s.poll(t),
                Decision::WaitUntil(retry),
                "changes wait for the retry"
            );
            t = retry;
            assert_eq!(s.poll(t), Decision::Run(SyncKind::Full));
            s.finished(t, SyncKind::Full, false);
        }
        // A success resets the backoff and the full resync schedule.
        t += Duration::from_secs(5);
        assert_eq!(s.poll(t), Decision::Run(SyncKind::Full));
        s.finished(t, SyncKind::Full, true);
        assert_eq!(s.poll(t), Decision::WaitUntil(t + Duration::from_secs(5)));
        s.request_sync();
        assert_eq!(s.poll(t), Decision::Run(SyncKind::Incremental));
        s.finished(t, SyncKind::Incremental, false);
        s.request_sync();
        assert_eq!(s.poll(t), Decision::WaitUntil(t + Duration::from_secs(1)));
        assert_eq!(
            s.poll(t + Duration::from_secs(1)),
            Decision::Run(SyncKind::Full)
        );
    }
}
