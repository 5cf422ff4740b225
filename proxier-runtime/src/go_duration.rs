//! Durations written the way Go's `time.ParseDuration` reads them (`30s`, `1m30s`, `500ms`, `2h`),
//! as Kubernetes components spell them in their flags and config files (`metav1.Duration`):
//! for a program that takes kube-proxy's settings, as the `ipvs-proxier` daemon does with its
//! flags and `KubeProxyConfiguration`.

use std::time::Duration;

/// A duration string that is not a valid non-negative Go duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason}")]
pub struct DurationParseError {
    /// The text that was given.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

const NANOS_PER_UNIT: [(&str, u128); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("μs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60 * 1_000_000_000),
    ("h", 3600 * 1_000_000_000),
];

/// Parses a Go duration: a sequence of decimal numbers, each with an optional fraction and a
/// unit (`ns`, `us`/`µs`, `ms`, `s`, `m`, `h`), e.g. `1h2m3.5s`. A bare `0` is allowed.
/// Negative durations are refused (no kube-proxy setting accepts one).
pub fn parse_go_duration(input: &str) -> Result<Duration, DurationParseError> {
    let err = |reason| DurationParseError {
        input: input.to_owned(),
        reason,
    };
    let mut rest = input.trim();
    if let Some(stripped) = rest.strip_prefix('+') {
        rest = stripped;
    } else if rest.starts_with('-') {
        return Err(err("negative durations are not allowed"));
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(err("empty duration"));
    }
    let mut total_nanos: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let int_part = &rest[..int_len];
        rest = &rest[int_len..];
        let mut frac_part = "";
        if let Some(after_dot) = rest.strip_prefix('.') {
            let frac_len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
            frac_part = &after_dot[..frac_len];
            rest = &after_dot[frac_len..];
        }
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(err("expected a number"));
        }
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        if unit.is_empty() {
            return Err(err("missing unit (use ns, us, ms, s, m or h)"));
        }
        let Some(&(_, scale)) = NANOS_PER_UNIT.iter().find(|(name, _)| *name == unit) else {
            return Err(err("unknown unit (use ns, us, ms, s, m or h)"));
        };
        let whole: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| err("number too large"))?
        };
        let mut nanos = whole
            .checked_mul(scale)
            .ok_or_else(|| err("duration too large"))?;
        // Fraction: digits beyond nanosecond precision are dropped, as Go does.
        let mut place = scale;
        for digit in frac_part.bytes() {
            place /= 10;
            if place == 0 {
                break;
            }
            nanos += u128::from(digit - b'0') * place;
        }
        total_nanos = total_nanos
            .checked_add(nanos)
            .ok_or_else(|| err("duration too large"))?;
    }
    // Go durations are int64 nanoseconds.
    if total_nanos > i64::MAX as u128 {
        return Err(err("duration too large"));
    }
    let secs = (total_nanos / 1_000_000_000) as u64;
    let sub = (total_nanos % 1_000_000_000) as u32;
    Ok(Duration::new(secs, sub))
}

/// Formats a duration the way Go prints one (`1m30s`, `500ms`, `0s`), for messages and `--help`.
pub fn format_go_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".to_owned();
    }
    let nanos = d.as_nanos();
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", trim_fraction(nanos, 1_000));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", trim_fraction(nanos, 1_000_000));
    }
    let hours = nanos / 3_600_000_000_000;
    let minutes = (nanos / 60_000_000_000) % 60;
    let sec_nanos = nanos % 60_000_000_000;
    let mut out = String::new();
    if hours > 0 {
        out.push_str(&format!("{hours}h"));
    }
    if hours > 0 || minutes > 0 {
        out.push_str(&format!("{minutes}m"));
    }
    out.push_str(&format!("{}s", trim_fraction(sec_nanos, 1_000_000_000)));
    out
}

fn trim_fraction(value: u128, unit: u128) -> String {
    let whole = value / unit;
    let frac = value % unit;
    if frac == 0 {
        return whole.to_string();
    }
    let width = unit.ilog10() as usize;
    let digits = format!("{frac:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}
