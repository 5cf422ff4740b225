//! The phase timings the daemon logs: how long the source took to deliver its first picture,
//! converting and applying it, and each step of a sync (plan, kernel read, diff, address
//! writes, IPVS writes, nftables, conntrack).

use std::fmt;
use std::time::Duration;

/// Phases of one sync and of the start-up before it (absent ones are `None`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Phases {
    /// Sysctls and IPVS timeouts at start.
    pub sysctls: Option<Duration>,
    /// The source's first picture: reading and parsing the file, or listing the API.
    pub source: Option<Duration>,
    /// Converting the first picture into the engine's changes.
    pub convert: Option<Duration>,
    /// Applying them to the engine's state.
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

/// The value of ` NAME=` in a log line, up to the next space.
fn field<'l>(line: &'l str, name: &str) -> Option<&'l str> {
    let at = line.find(&format!(" {name}="))? + name.len() + 2;
    line[at..].split_whitespace().next()
}

/// The duration after `label ` in a `phases=` text, up to `,` or `)`.
fn phase(phases: &str, label: &str) -> Option<Duration> {
    let at = phases.find(&format!("{label} "))? + label.len() + 1;
    let rest = &phases[at..];
    let end = rest.find([',', ')', ' ']).unwrap_or(rest.len());
    parse_duration(&rest[..end])
}

impl Phases {
    /// The phases of the `n`-th (1-based) `sync done` line of `log`, with the start-up lines
    /// (sysctls, source, conversion) logged before it.
    pub fn from_log(log: &str, n: usize) -> Phases {
        let mut phases = Phases::default();
        let mut seen = 0;
        for line in log.lines() {
            if line.contains("sysctls and IPVS timeouts set") {
                phases.sysctls = field(line, "took").and_then(parse_duration);
            } else if line.contains("source file loaded")
                || line.contains("Services and EndpointSlices synced")
            {
                if phases.source.is_none() {
                    phases.source = field(line, "took").and_then(parse_duration);
                }
            } else if line.contains("first picture applied") {
                phases.convert = field(line, "convert").and_then(parse_duration);
                phases.apply = field(line, "apply").and_then(parse_duration);
            } else if line.contains("sync done")
                && let Some(at) = line.find("phases=")
            {
                seen += 1;
                if seen == n {
                    let p = &line[at + "phases=".len()..];
                    phases.plan = phase(p, "plan");
                    phases.kernel_read = phase(p, "kernel read");
                    phases.diff = phase(p, "diff");
                    phases.address_writes = phase(p, "address writes");
                    phases.ipvs_writes = phase(p, "ipvs writes");
                    phases.nftables = phase(p, "nftables");
                    phases.conntrack = phase(p, "conntrack");
                    phases.total = phase(p, "total");
                    break;
                }
            }
        }
        phases
    }
}

impl fmt::Display for Phases {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows = [
            ("sysctls", self.sysctls),
            ("source read+parse", self.source),
            ("conversion", self.convert),
            ("state apply", self.apply),
            ("planning", self.plan),
            ("kernel read (dumps)", self.kernel_read),
            ("diff", self.diff),
            ("address ops", self.address_writes),
            ("IPVS ops", self.ipvs_writes),
            ("nftables", self.nftables),
            ("conntrack", self.conntrack),
            ("sync total", self.total),
        ];
        let parts: Vec<String> = rows
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

    #[test]
    fn durations_in_debug_format_parse() {
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(parse_duration("3µs"), Some(Duration::from_micros(3)));
        assert_eq!(parse_duration("7ns"), Some(Duration::from_nanos(7)));
        assert_eq!(parse_duration("7 parsecs"), None);
    }

    #[test]
    fn phases_come_from_the_nth_sync_and_the_start_up_lines() {
        let log = "\
2026-12-01T00:00:00Z  INFO proxier_core::engine: sysctls and IPVS timeouts set took=2ms
2026-12-01T00:00:01Z  INFO proxier_bin::source::file: source file loaded path=/tmp/x changes=3 took=1.25s
2026-12-01T00:00:02Z  INFO proxier_bin::daemon: first picture applied changes=3 convert=10ms apply=5ms
2026-12-01T00:00:03Z  INFO proxier_bin::sync_observer: sync done kind=Full report=1 writes (0 deletes, 0 failed) phases=plan 1s, ipvs+addresses 4s (kernel read 1.5s, diff 0.5s, address writes 1ms, ipvs writes 2s), nftables 3s, conntrack 0ns, total 8s
2026-12-01T00:00:04Z  INFO proxier_bin::sync_observer: sync done kind=Incremental report=2 writes (0 deletes, 0 failed) phases=plan 9ms, ipvs+addresses 4ms (kernel read 1ms, diff 1ms, address writes 0ns, ipvs writes 2ms), nftables 3ms, conntrack 0ns, total 17ms
";
        let first = Phases::from_log(log, 1);
        assert_eq!(first.sysctls, Some(Duration::from_millis(2)));
        assert_eq!(first.source, Some(Duration::from_millis(1250)));
        assert_eq!(first.convert, Some(Duration::from_millis(10)));
        assert_eq!(first.kernel_read, Some(Duration::from_millis(1500)));
        assert_eq!(first.diff, Some(Duration::from_millis(500)));
        assert_eq!(first.address_writes, Some(Duration::from_millis(1)));
        assert_eq!(first.ipvs_writes, Some(Duration::from_secs(2)));
        assert_eq!(first.nftables, Some(Duration::from_secs(3)));
        assert_eq!(first.total, Some(Duration::from_secs(8)));
        let second = Phases::from_log(log, 2);
        assert_eq!(second.plan, Some(Duration::from_millis(9)));
        assert_eq!(second.total, Some(Duration::from_millis(17)));
    }
}
