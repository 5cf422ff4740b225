//! The daemon's structured log (`--log-format json`, one JSON object per line) read by each
//! event's message and fields, never by its target (the module that logged it): how long
//! the source took to deliver its first picture, applying it, and each step of a sync (plan,
//! kernel read, diff, address writes, IPVS writes, nftables, conntrack).

use std::fmt;
use std::time::{Duration, SystemTime};

use serde_json::{Map, Value};

/// Message of the event the daemon logs after each complete sync.
pub const SYNC_DONE: &str = "sync done";
/// Message prefix of the event it logs after a sync with failed service ports.
pub const SYNC_WITH_ERRORS: &str = "sync finished with errors";

/// One event of the daemon's JSON log: `message` and the event's fields, flattened
/// (tracing-subscriber's `json().flatten_event(true)`).
#[derive(Debug, Clone, PartialEq)]
pub struct LogEvent {
    fields: Map<String, Value>,
}

/// Keys every event carries that say nothing about what happened.
const ENVELOPE: [&str; 4] = ["timestamp", "level", "target", "message"];

impl LogEvent {
    /// Parses one log line; `None` for a line that is not a JSON object (e.g. a panic
    /// message on stderr).
    pub fn parse(line: &str) -> Option<LogEvent> {
        match serde_json::from_str(line.trim()).ok()? {
            Value::Object(fields) => Some(LogEvent { fields }),
            _ => None,
        }
    }

    /// The event's message.
    pub fn message(&self) -> &str {
        self.str("message").unwrap_or_default()
    }

    /// The event's level (`INFO`, `WARN`, ...).
    pub fn level(&self) -> &str {
        self.str("level").unwrap_or_default()
    }

    /// A text field.
    pub fn str(&self, name: &str) -> Option<&str> {
        self.fields.get(name)?.as_str()
    }

    /// An unsigned number field.
    pub fn u64(&self, name: &str) -> Option<u64> {
        self.fields.get(name)?.as_u64()
    }

    /// A boolean field.
    pub fn bool(&self, name: &str) -> Option<bool> {
        self.fields.get(name)?.as_bool()
    }

    /// A duration field: a number of seconds, or a `Debug`-formatted [`Duration`] (the
    /// daemon's `took = ?elapsed` fields).
    pub fn duration(&self, name: &str) -> Option<Duration> {
        match self.fields.get(name)? {
            Value::Number(n) => Duration::try_from_secs_f64(n.as_f64()?).ok(),
            Value::String(s) => parse_duration(s),
            _ => None,
        }
    }

    /// When the event was logged: its `timestamp`, RFC 3339 in UTC
    /// (`2026-12-06T19:48:16.372207Z`, as tracing-subscriber writes it).
    pub fn logged_at(&self) -> Option<SystemTime> {
        parse_utc_timestamp(self.str("timestamp")?)
    }

    /// Removes a field (tests build older event shapes from real ones).
    pub fn without(mut self, name: &str) -> LogEvent {
        self.fields.remove(name);
        self
    }
}

impl fmt::Display for LogEvent {
    /// `message key=value ...`, without timestamp, level and target.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())?;
        for (key, value) in &self.fields {
            if ENVELOPE.contains(&key.as_str()) {
                continue;
            }
            match value {
                Value::String(s) => write!(f, " {key}={s}")?,
                other => write!(f, " {key}={other}")?,
            }
        }
        Ok(())
    }
}

/// Every JSON event of `log`, in order.
pub fn events(log: &str) -> impl Iterator<Item = LogEvent> + '_ {
    log.lines().filter_map(LogEvent::parse)
}

/// The `sync done` events of `log`, in order.
pub fn syncs(log: &str) -> Vec<LogEvent> {
    events(log).filter(|e| e.message() == SYNC_DONE).collect()
}

/// Parses an RFC 3339 time in UTC with a `Z` (`YYYY-MM-DDTHH:MM:SS[.fraction]Z`).
pub fn parse_utc_timestamp(text: &str) -> Option<SystemTime> {
    let (date, time) = text.strip_suffix('Z')?.split_once('T')?;
    let mut date = date.splitn(3, '-').map(str::parse::<i64>);
    let (year, month, day) = (date.next()?.ok()?, date.next()?.ok()?, date.next()?.ok()?);
    let mut time = time.splitn(3, ':');
    let (hour, minute) = (
        time.next()?.parse::<u64>().ok()?,
        time.next()?.parse::<u64>().ok()?,
    );
    let seconds: f64 = time.next()?.parse().ok()?;
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    // Days from 1970-01-01 to the date, by the proleptic Gregorian calendar (years counted
    // from March, so that the leap day ends a year).
    let (y, m) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * m + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = u64::try_from(era * 146_097 + day_of_era - 719_468).ok()?;
    let whole = days * 86_400 + hour * 3_600 + minute * 60;
    SystemTime::UNIX_EPOCH
        .checked_add(Duration::from_secs(whole))?
        .checked_add(Duration::try_from_secs_f64(seconds).ok()?)
}

/// Where the time of one change timed to the kernel went, by the daemon's syncs that started
/// while it was on its way (from [`change_parts`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChangeParts {
    /// From the change made (the API call) to the start of the first of those syncs: the
    /// event's delivery and the wait for a sync already running.
    pub until_first_sync: Duration,
    /// How many syncs started while the change was on its way.
    pub syncs: usize,
    /// Their time, added up.
    pub sync_time: Duration,
    /// Their address writes (binds and unbinds on the dummy link), added up.
    pub address_writes: Duration,
}

/// When a sync started and what it took, from its `sync done` event (see [`sync_spans`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SyncSpan {
    /// Its logged time less its `total_s`.
    pub started: SystemTime,
    /// Its `total_s`.
    pub total: Duration,
    /// Its `address_writes_s` (zero when absent).
    pub address_writes: Duration,
}

/// The spans of `syncs` (`sync done` events), read once for every change set against them;
/// events without a time or a total are left out.
pub fn sync_spans(syncs: &[LogEvent]) -> Vec<SyncSpan> {
    syncs
        .iter()
        .filter_map(|sync| {
            let total = sync.duration("total_s")?;
            Some(SyncSpan {
                started: sync.logged_at()?.checked_sub(total)?,
                total,
                address_writes: sync.duration("address_writes_s").unwrap_or_default(),
            })
        })
        .collect()
}

/// Sets the change made at `made`, in the kernel `took` later, against the syncs that
/// started meanwhile; `None` when none did.
pub fn change_parts(made: SystemTime, took: Duration, syncs: &[SyncSpan]) -> Option<ChangeParts> {
    let seen = made + took;
    let mut parts: Option<ChangeParts> = None;
    for sync in syncs {
        let Ok(into) = sync.started.duration_since(made) else {
            continue;
        };
        if sync.started > seen {
            continue;
        }
        let parts = parts.get_or_insert(ChangeParts {
            until_first_sync: into,
            syncs: 0,
            sync_time: Duration::ZERO,
            address_writes: Duration::ZERO,
        });
        parts.until_first_sync = parts.until_first_sync.min(into);
        parts.syncs += 1;
        parts.sync_time += sync.total;
        parts.address_writes += sync.address_writes;
    }
    parts
}

/// Phases of one sync and of the start-up before it (absent ones are `None`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Phases {
    /// Sysctls and IPVS timeouts at start.
    pub sysctls: Option<Duration>,
    /// The source's first picture: reading and parsing the file, or listing the API.
    pub source: Option<Duration>,
    /// Converting the first picture into the engine's changes and applying them to its state.
    pub apply: Option<Duration>,
    /// Re-planning.
    pub plan: Option<Duration>,
    /// Reading the kernel (IPVS table, link addresses).
    pub kernel_read: Option<Duration>,
    /// Diffing plan and kernel.
    pub diff: Option<Duration>,
    /// Binding and unbinding addresses.
    pub address_writes: Option<Duration>,
    /// IPVS writes.
    pub ipvs_writes: Option<Duration>,
    /// The nftables transaction.
    pub nftables: Option<Duration>,
    /// UDP conntrack cleanup.
    pub conntrack: Option<Duration>,
    /// The whole sync.
    pub total: Option<Duration>,
}

/// Parses a `Debug`-formatted [`Duration`] (`1.5s`, `20.1ms`, `3µs`, `7ns`).
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().ok()?;
    let scale = match unit {
        "s" => 1.0,
        "ms" => 1e-3,
        "µs" | "us" => 1e-6,
        "ns" => 1e-9,
        _ => return None,
    };
    Some(Duration::from_secs_f64(value * scale))
}

/// The duration after `label ` in a `phases` text (`plan 1s, ipvs+addresses 4s (kernel read
/// 1.5s, ...), ...`), up to `,` or `)`.
fn phase(phases: &str, label: &str) -> Option<Duration> {
    let at = phases.find(&format!("{label} "))? + label.len() + 1;
    let rest = &phases[at..];
    let end = rest.find([',', ')', ' ']).unwrap_or(rest.len());
    parse_duration(&rest[..end])
}

impl Phases {
    /// The phases of the `n`-th (1-based) `sync done` event of `log`, with the start-up
    /// events (sysctls, source, first picture) logged before it.
    pub fn from_log(log: &str, n: usize) -> Phases {
        let mut phases = Phases::default();
        let mut seen = 0;
        for event in events(log) {
            match event.message() {
                "sysctls and IPVS timeouts set" => phases.sysctls = event.duration("took"),
                "source file loaded" | "Services and EndpointSlices synced"
                    if phases.source.is_none() =>
                {
                    phases.source = event.duration("took");
                }
                "first picture applied" => phases.apply = event.duration("took"),
                SYNC_DONE => {
                    seen += 1;
                    if seen == n {
                        phases.set_sync(&event);
                        break;
                    }
                }
                _ => {}
            }
        }
        phases
    }

    /// The sync's own phases: its numeric `*_s` fields, or (a daemon that logs only the
    /// text) its `phases` field.
    fn set_sync(&mut self, event: &LogEvent) {
        let text = event.str("phases").unwrap_or_default();
        let get = |field: &str, label: &str| event.duration(field).or_else(|| phase(text, label));
        self.plan = get("plan_s", "plan");
        self.kernel_read = get("kernel_read_s", "kernel read");
        self.diff = get("diff_s", "diff");
        self.address_writes = get("address_writes_s", "address writes");
        self.ipvs_writes = get("ipvs_writes_s", "ipvs writes");
        self.nftables = get("nftables_s", "nftables");
        self.conntrack = get("conntrack_s", "conntrack");
        self.total = get("total_s", "total");
    }

    /// Rows of the breakdown: name and duration.
    pub fn rows(&self) -> [(&'static str, Option<Duration>); 11] {
        [
            ("sysctls", self.sysctls),
            ("source read+parse", self.source),
            ("first picture applied", self.apply),
            ("planning", self.plan),
            ("kernel read (dumps)", self.kernel_read),
            ("diff", self.diff),
            ("address ops", self.address_writes),
            ("IPVS ops", self.ipvs_writes),
            ("nftables", self.nftables),
            ("conntrack", self.conntrack),
            ("sync total", self.total),
        ]
    }

    /// As a JSON object of seconds (`null` when absent), keyed by the row names.
    pub fn to_json(&self) -> Value {
        let map: Map<String, Value> = self
            .rows()
            .iter()
            .map(|(name, d)| {
                let value = d.map_or(Value::Null, |d| Value::from(d.as_secs_f64()));
                ((*name).to_owned(), value)
            })
            .collect();
        Value::Object(map)
    }
}

impl fmt::Display for Phases {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .rows()
            .iter()
            .map(|(name, d)| match d {
                Some(d) => format!("{name} {:.3} s", d.as_secs_f64()),
                None => format!("{name} ?"),
            })
            .collect();
        f.write_str(&parts.join(" | "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines of a real run: `ipvs-proxier --source-file c.yaml --hostname-override node-a
    /// --dry-run --watch --log-format json` (on examples/cluster.yaml; one endpoint changed in
    /// the file after the first sync), a line of plain text added in between.
    const LOG: &str = r#"{"timestamp":"2026-12-02T01:42:12.857909Z","level":"INFO","message":"source file loaded","path":"/tmp/c.yaml","changes":22,"took":"2.367414ms","target":"proxier_bin::source::file"}
{"timestamp":"2026-12-02T01:42:12.858077Z","level":"INFO","message":"first picture applied","changes":22,"took":"66.319µs","target":"proxier_bin::daemon"}
{"timestamp":"2026-12-02T01:42:12.876113Z","level":"INFO","message":"sync done","kind":"Full","report":"60 writes (0 deletes, 0 failed), nftables table written, 0 UDP conntrack entries deleted","phases":"plan 169.432µs, ipvs+addresses 114.06µs (kernel read 1.732µs, diff 60.88µs, address writes 2.133µs, ipvs writes 11.788µs), nftables 56.945µs, conntrack 15.644781ms, total 15.990945ms","writes":60,"deletes":0,"failed":0,"plan_s":0.000169432,"kernel_read_s":1.732e-6,"diff_s":0.00006088,"address_writes_s":2.133e-6,"ipvs_writes_s":0.000011788,"nftables_s":0.000056945,"conntrack_s":0.015644781,"total_s":0.015990945,"target":"proxier_bin::sync_observer"}
thread 'main' panicked at src/main.rs:1:1: not JSON
{"timestamp":"2026-12-02T01:42:16.093959Z","level":"INFO","message":"source file loaded","path":"/tmp/c.yaml","changes":10,"took":"1.954178ms","target":"proxier_bin::source::file"}
{"timestamp":"2026-12-02T01:42:16.094433Z","level":"INFO","message":"sync done","kind":"Incremental","report":"6 writes (3 deletes, 0 failed), nftables table written, 0 UDP conntrack entries deleted","phases":"plan 59.569µs, ipvs+addresses 64.086µs (kernel read 5.508µs, diff 10.957µs, address writes 260ns, ipvs writes 21.152µs), nftables 33.731µs, conntrack 43.024µs, total 205.065µs","writes":6,"deletes":3,"failed":0,"plan_s":0.000059569,"kernel_read_s":5.508e-6,"diff_s":0.000010957,"address_writes_s":2.6e-7,"ipvs_writes_s":0.000021152,"nftables_s":0.000033731,"conntrack_s":0.000043024,"total_s":0.000205065,"target":"proxier_bin::sync_observer"}
"#;

    /// The start-up of a real daemon on the kernel and the kube source, in the VM
    /// (`cargo xtask vm-bench proxier --services 300 --endpoints 3`).
    const KUBE_LOG: &str = r#"{"timestamp":"2026-12-02T02:19:44.593975Z","level":"INFO","message":"sysctls and IPVS timeouts set","took":"38.60911ms","target":"proxier_core::engine"}
{"timestamp":"2026-12-02T02:19:45.146798Z","level":"INFO","message":"Services and EndpointSlices synced","services":300,"endpoint_slices":300,"took":"423.25535ms","target":"proxier_bin::source::kube"}
{"timestamp":"2026-12-02T02:19:45.240568Z","level":"INFO","message":"first picture applied","changes":601,"took":"94.61046ms","target":"proxier_bin::daemon"}
{"timestamp":"2026-12-02T02:19:46.266402Z","level":"INFO","message":"sync done","kind":"Full","report":"1500 writes (0 deletes, 0 failed), nftables table written, 0 UDP conntrack entries deleted","phases":"plan 143.67873ms, ipvs+addresses 799.36057ms (kernel read 113.92537ms, diff 188.04884ms, address writes 362.88013ms, ipvs writes 461.98121ms), nftables 838.43758ms, conntrack 891.08µs, total 988.88282ms","writes":1500,"deletes":0,"failed":0,"plan_s":0.14367873,"kernel_read_s":0.11392537,"diff_s":0.18804884,"address_writes_s":0.36288013,"ipvs_writes_s":0.46198121,"nftables_s":0.83843758,"conntrack_s":0.00089108,"total_s":0.98888282,"target":"proxier_bin::sync_observer"}
"#;

    fn us(micros: f64) -> Option<Duration> {
        Some(Duration::from_secs_f64(micros * 1e-6))
    }

    fn close(a: Option<Duration>, b: Option<Duration>) -> bool {
        match (a, b) {
            (Some(a), Some(b)) => a.abs_diff(b) < Duration::from_nanos(2),
            _ => false,
        }
    }

    #[test]
    fn durations_in_debug_format_parse() {
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(parse_duration("3µs"), Some(Duration::from_micros(3)));
        assert_eq!(parse_duration("7ns"), Some(Duration::from_nanos(7)));
        assert_eq!(parse_duration("7 parsecs"), None);
    }

    #[test]
    fn events_are_read_by_message_and_fields_and_other_lines_are_skipped() {
        let events: Vec<LogEvent> = events(LOG).collect();
        assert_eq!(events.len(), 5);
        let syncs = syncs(LOG);
        assert_eq!(syncs.len(), 2);
        assert_eq!(syncs[0].str("kind"), Some("Full"));
        assert_eq!(syncs[0].u64("writes"), Some(60));
        assert_eq!(syncs[1].str("kind"), Some("Incremental"));
        assert_eq!(syncs[1].u64("deletes"), Some(3));
        assert_eq!(syncs[1].level(), "INFO");
        let shown = syncs[1].to_string();
        assert!(shown.starts_with("sync done "), "{shown}");
        assert!(shown.contains(" kind=Incremental "), "{shown}");
        assert!(
            !shown.contains("target") && !shown.contains("timestamp"),
            "{shown}"
        );
    }

    #[test]
    fn phases_come_from_the_nth_sync_and_the_start_up_events() {
        let first = Phases::from_log(LOG, 1);
        assert_eq!(first.sysctls, None);
        assert!(close(first.source, us(2367.414)));
        assert!(close(first.apply, us(66.319)));
        assert!(close(first.plan, us(169.432)));
        assert!(close(first.kernel_read, us(1.732)));
        assert!(close(first.conntrack, us(15644.781)));
        assert!(close(first.total, us(15990.945)));
        let second = Phases::from_log(LOG, 2);
        // The source's first picture, not the later reload.
        assert!(close(second.source, us(2367.414)));
        assert!(close(second.address_writes, us(0.26)));
        assert!(close(second.total, us(205.065)));
        assert_eq!(Phases::from_log(LOG, 3).total, None);
    }

    #[test]
    fn the_kernel_daemon_on_the_kube_source_logs_every_start_up_phase() {
        let phases = Phases::from_log(KUBE_LOG, 1);
        assert!(close(phases.sysctls, us(38609.11)));
        assert!(close(phases.source, us(423255.35)));
        assert!(close(phases.apply, us(94610.46)));
        assert!(close(phases.address_writes, us(362880.13)));
        assert!(close(phases.total, us(988882.82)));
        assert_eq!(syncs(KUBE_LOG)[0].u64("writes"), Some(1500));
    }

    #[test]
    fn without_numeric_fields_the_phases_text_is_read() {
        let full = syncs(LOG).remove(0);
        let mut text_only = full.clone();
        for field in [
            "plan_s",
            "kernel_read_s",
            "diff_s",
            "address_writes_s",
            "ipvs_writes_s",
            "nftables_s",
            "conntrack_s",
            "total_s",
        ] {
            text_only = text_only.without(field);
        }
        let mut from_text = Phases::default();
        from_text.set_sync(&text_only);
        let mut from_numbers = Phases::default();
        from_numbers.set_sync(&full);
        for ((name, a), (_, b)) in from_text.rows().iter().zip(from_numbers.rows()) {
            assert!(a.is_none() == b.is_none(), "{name}");
            if a.is_some() {
                assert!(close(*a, b), "{name}: {a:?} vs {b:?}");
            }
        }
        assert!(close(from_text.ipvs_writes, us(11.788)));
    }

    #[test]
    fn phases_as_json_are_seconds_or_null() {
        let json = Phases::from_log(LOG, 2).to_json();
        assert_eq!(json["sysctls"], Value::Null);
        assert_eq!(json["sync total"].as_f64(), Some(0.000205065));
    }

    #[test]
    fn utc_timestamps_parse_to_the_epoch_seconds_python_gives() {
        // Oracle: Python's datetime(..., tzinfo=timezone.utc).timestamp().
        let at = |text: &str| {
            parse_utc_timestamp(text).map(|t| {
                t.duration_since(SystemTime::UNIX_EPOCH)
                    .expect("after 1970")
                    .as_secs_f64()
            })
        };
        assert_eq!(at("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(at("2000-02-29T23:59:59Z"), Some(951_868_799.0));
        let t = at("2026-12-06T19:48:16.372207Z").expect("a real daemon's timestamp");
        assert!((t - 1_796_586_496.372_207).abs() < 1e-6, "{t}");
        for bad in [
            "2026-12-06T19:48:16.372207",
            "2026-13-06T19:48:16Z",
            "2026-12-06 19:48:16Z",
            "yesterday",
        ] {
            assert_eq!(at(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_change_is_set_against_the_syncs_that_started_while_it_was_on_its_way() {
        let syncs = sync_spans(&syncs(LOG));
        let at = |text: &str| parse_utc_timestamp(text).expect("a valid time");
        let ms = Duration::from_millis;
        // The second sync started 205.065 µs before it was logged at 16.094433.
        let parts = change_parts(at("2026-12-02T01:42:16.090Z"), ms(10), &syncs)
            .expect("the second sync started 4.2 ms after the change");
        assert_eq!(parts.syncs, 1);
        let until = parts.until_first_sync.as_secs_f64();
        assert!((until - 0.004_227_935).abs() < 1e-6, "{until}");
        assert!(close(Some(parts.sync_time), us(205.065)));
        assert!(close(Some(parts.address_writes), us(0.26)));
        // Both syncs: the first started 15.990945 ms before 12.876113.
        let both = change_parts(at("2026-12-02T01:42:12.000Z"), ms(5_000), &syncs)
            .expect("both syncs started during the change");
        assert_eq!(both.syncs, 2);
        assert!(close(Some(both.address_writes), us(2.133 + 0.26)));
        assert!(close(Some(both.sync_time), us(15_990.945 + 205.065)));
        // A sync that started before the change did not take it; none after it either.
        assert_eq!(
            change_parts(at("2026-12-02T01:42:16.0943Z"), ms(10), &syncs),
            None
        );
        assert_eq!(
            change_parts(at("2026-12-02T01:42:13.000Z"), ms(10), &syncs),
            None
        );
    }
}
