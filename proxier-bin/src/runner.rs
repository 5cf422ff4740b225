//! The sync runner: decides when to sync and whether incrementally or fully, and drives a
//! [`SyncTarget`].
//!
//! [`SyncScheduler`] is pure (time is passed in): changes are synced as soon as a token is
//! available (a bucket of `burst` tokens refilled one per `min_sync_period`, as kube-proxy's
//! bounded-frequency runner); a full resync runs every `sync_period`; a failed sync is retried
//! as a full one after a backoff that doubles up to `sync_period`. [`run`] is the async loop.

use std::future::Future;
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::health::ProxyHealth;
use crate::metrics::{SyncScope, record_sync};

/// What a sync covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncKind {
    /// Re-plan and apply only what changed since the last sync.
    Incremental,
    /// Re-read the kernel, re-plan everything and repair drift.
    Full,
}

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
pub struct RunnerConfig {
    /// Minimum time between syncs once the burst is spent (0: no limit).
    pub min_sync_period: Duration,
    /// Time between full resyncs.
    pub sync_period: Duration,
    /// Syncs allowed back to back (at least 1).
    pub burst: u32,
    /// First retry delay after a failed sync.
    pub retry_initial: Duration,
}

impl RunnerConfig {
    /// From the daemon's settings; the first retry comes after 1 s (at most the sync period).
    pub fn from_settings(ipvs: &crate::settings::IpvsSettings) -> RunnerConfig {
        RunnerConfig {
            min_sync_period: ipvs.min_sync_period,
            sync_period: ipvs.sync_period,
            burst: ipvs.sync_burst,
            retry_initial: Duration::from_secs(1).min(ipvs.sync_period),
        }
    }
}

/// The pure scheduling state.
#[derive(Debug, Clone)]
pub struct SyncScheduler {
    config: RunnerConfig,
    tokens: f64,
    refilled_at: Instant,
    changes_pending: bool,
    full_due_at: Instant,
    retry_at: Option<Instant>,
    retry_delay: Duration,
    running: bool,
}

impl SyncScheduler {
    /// A scheduler whose first sync is a full one, due at once.
    pub fn new(config: RunnerConfig, now: Instant) -> SyncScheduler {
        let burst = config.burst.max(1);
        SyncScheduler {
            config: RunnerConfig { burst, ..config },
            tokens: f64::from(burst),
            refilled_at: now,
            changes_pending: false,
            full_due_at: now,
            retry_at: None,
            retry_delay: config.retry_initial,
            running: false,
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
        // After a failure, the retry time (not the missed schedule) says when the full sync runs.
        let full_due = match self.retry_at {
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

    /// Records the end of the running sync.
    pub fn finished(&mut self, now: Instant, kind: SyncKind, succeeded: bool) {
        self.running = false;
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

/// A sync failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SyncError(pub String);

/// What the runner drives: proxier-core's reconciler (or, until it is wired, the dry run).
pub trait SyncTarget: Send {
    /// Performs one sync.
    fn sync(&mut self, kind: SyncKind) -> impl Future<Output = Result<(), SyncError>> + Send;
}

/// A request to the runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// Something changed.
    Changes,
    /// Resync everything.
    Full,
}

/// How to reach a running runner.
#[derive(Debug, Clone)]
pub struct RunnerHandle {
    tx: mpsc::UnboundedSender<Trigger>,
}

impl RunnerHandle {
    /// A new handle and the receiving end for [`run`].
    pub fn new() -> (RunnerHandle, mpsc::UnboundedReceiver<Trigger>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (RunnerHandle { tx }, rx)
    }

    /// Asks for a sync of changes (ignored once the runner stopped).
    pub fn request_sync(&self) {
        let _ = self.tx.send(Trigger::Changes);
    }

    /// Asks for a full resync.
    pub fn request_full(&self) {
        let _ = self.tx.send(Trigger::Full);
    }
}

/// Runs syncs on `target` as `scheduler` decides, until `shutdown` turns true or every
/// [`RunnerHandle`] is dropped. Reports queued changes and finished syncs to `health` and to
/// the metrics. With `once`, returns after the first successful sync.
pub async fn run<T: SyncTarget>(
    mut scheduler: SyncScheduler,
    mut triggers: mpsc::UnboundedReceiver<Trigger>,
    target: &mut T,
    health: Option<ProxyHealth>,
    mut shutdown: watch::Receiver<bool>,
    once: bool,
) -> Result<(), SyncError> {
    let mut last_error = None;
    loop {
        if *shutdown.borrow() {
            return Ok(());
        }
        match scheduler.poll(Instant::now()) {
            Decision::Run(kind) => {
                let started = Instant::now();
                tracing::debug!(?kind, "sync starting");
                let result = target.sync(kind).await;
                let took = started.elapsed();
                let ok = result.is_ok();
                scheduler.finished(Instant::now(), kind, ok);
                let scope = match kind {
                    SyncKind::Full => SyncScope::Full,
                    SyncKind::Incremental => SyncScope::Partial,
                };
                record_sync(scope, took, ok, SystemTime::now());
                match result {
                    Ok(()) => {
                        tracing::debug!(?kind, ?took, "sync done");
                        if let Some(h) = &health
                            && !scheduler.changes_pending()
                        {
                            h.updated(SystemTime::now());
                        }
                        if once {
                            return Ok(());
                        }
                    }
                    Err(error) => {
                        tracing::error!(?kind, %error, "sync failed; will retry with a full sync");
                        last_error = Some(error);
                    }
                }
            }
            Decision::Busy => {
                // Unreachable in this loop (syncs are awaited inline); be safe.
                tokio::task::yield_now().await;
            }
            Decision::WaitUntil(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    trigger = triggers.recv() => match trigger {
                        Some(Trigger::Changes) => {
                            scheduler.request_sync();
                            if let Some(h) = &health {
                                h.queued_update(SystemTime::now());
                            }
                        }
                        Some(Trigger::Full) => scheduler.request_full(Instant::now()),
                        None => return last_error.map_or(Ok(()), Err),
                    },
                    changed = shutdown.changed() => {
                        if changed.is_err() || *shutdown.borrow() {
                            return Ok(());
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(min_ms: u64, period_s: u64, burst: u32) -> RunnerConfig {
        RunnerConfig {
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

    struct Recorder {
        calls: Vec<(Duration, SyncKind)>,
        start: Instant,
        fail_first: bool,
    }

    impl SyncTarget for Recorder {
        fn sync(&mut self, kind: SyncKind) -> impl Future<Output = Result<(), SyncError>> + Send {
            self.calls.push((self.start.elapsed(), kind));
            let fail = std::mem::take(&mut self.fail_first);
            async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                if fail {
                    Err(SyncError("boom".into()))
                } else {
                    Ok(())
                }
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn runner_drives_the_target_on_schedule() {
        let start = Instant::now();
        let (handle, triggers) = RunnerHandle::new();
        let (stop_tx, stop_rx) = watch::channel(false);
        let health = ProxyHealth::new(Duration::from_secs(60));
        let scheduler = SyncScheduler::new(cfg(1000, 30, 1), start);
        let mut target = Recorder {
            calls: Vec::new(),
            start,
            fail_first: true,
        };
        let driver = {
            let health = health.clone();
            async move {
                run(
                    scheduler,
                    triggers,
                    &mut target,
                    Some(health),
                    stop_rx,
                    false,
                )
                .await
                .expect("runner ends cleanly");
                target
            }
        };
        let feeder = async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            handle.request_sync();
            handle.request_sync();
            tokio::time::sleep(Duration::from_millis(100)).await;
            handle.request_sync();
            tokio::time::sleep(Duration::from_secs(40)).await;
            stop_tx.send_replace(true);
            handle
        };
        let (target, _handle) = tokio::join!(driver, feeder);
        let calls: Vec<(u128, SyncKind)> = target
            .calls
            .iter()
            .map(|(d, k)| (d.as_millis(), *k))
            .collect();
        // t=0 full fails; retry at 1.01 s (1 s backoff after the 10 ms sync) succeeds; changes
        // at 1.5 s wait for the next token (1 per second after the one taken at 1.01 s) ->
        // 2.01 s; then the full resync 30 s after the successful one (finished at 1.02 s).
        assert_eq!(
            calls,
            vec![
                (0, SyncKind::Full),
                (1010, SyncKind::Full),
                (2010, SyncKind::Incremental),
                (31020, SyncKind::Full),
            ]
        );
        let (healthy, last) = health.is_healthy(SystemTime::now());
        assert!(healthy && last.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn once_returns_after_the_first_successful_sync() {
        let start = Instant::now();
        let (_handle, triggers) = RunnerHandle::new();
        let (_stop_tx, stop_rx) = watch::channel(false);
        let mut target = Recorder {
            calls: Vec::new(),
            start,
            fail_first: false,
        };
        run(
            SyncScheduler::new(cfg(1000, 30, 1), start),
            triggers,
            &mut target,
            None,
            stop_rx,
            true,
        )
        .await
        .expect("ok");
        assert_eq!(target.calls.len(), 1);
    }
}
