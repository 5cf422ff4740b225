//! Tests of `proxier_runtime::go_duration`.

use proxier_runtime::go_duration::*;
use std::time::Duration;

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

#[test]
fn parses_go_examples() {
    assert_eq!(parse_go_duration("30s"), Ok(Duration::from_secs(30)));
    assert_eq!(parse_go_duration("1m30s"), Ok(Duration::from_secs(90)));
    assert_eq!(parse_go_duration("500ms"), Ok(ms(500)));
    assert_eq!(parse_go_duration("2h"), Ok(Duration::from_secs(7200)));
    assert_eq!(
        parse_go_duration("2h22m"),
        Ok(Duration::from_secs(2 * 3600 + 22 * 60))
    );
    assert_eq!(parse_go_duration("1.5s"), Ok(ms(1500)));
    assert_eq!(parse_go_duration(".5s"), Ok(ms(500)));
    assert_eq!(parse_go_duration("1h0m0s"), Ok(Duration::from_secs(3600)));
    assert_eq!(parse_go_duration("10us"), Ok(Duration::from_micros(10)));
    assert_eq!(parse_go_duration("10µs"), Ok(Duration::from_micros(10)));
    assert_eq!(parse_go_duration("7ns"), Ok(Duration::from_nanos(7)));
    assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
    assert_eq!(parse_go_duration("0s"), Ok(Duration::ZERO));
    assert_eq!(parse_go_duration("+5s"), Ok(Duration::from_secs(5)));
}

#[test]
fn refuses_bad_input() {
    for bad in [
        "", "30", "5x", "-1s", "s", "1.s.", "1m30", "ms5", "1e3s", " ",
    ] {
        assert!(parse_go_duration(bad).is_err(), "{bad:?} should be refused");
    }
    // Larger than Go's int64 nanoseconds (about 292 years).
    assert!(parse_go_duration("3000000h").is_err());
}

#[test]
fn formats_like_go() {
    assert_eq!(format_go_duration(Duration::ZERO), "0s");
    assert_eq!(format_go_duration(Duration::from_secs(30)), "30s");
    assert_eq!(format_go_duration(Duration::from_secs(90)), "1m30s");
    assert_eq!(format_go_duration(Duration::from_secs(7200)), "2h0m0s");
    assert_eq!(format_go_duration(ms(500)), "500ms");
    assert_eq!(format_go_duration(ms(1500)), "1.5s");
    assert_eq!(format_go_duration(Duration::from_micros(1500)), "1.5ms");
}

#[test]
fn format_then_parse_round_trips() {
    for d in [
        ms(1),
        ms(250),
        Duration::from_secs(61),
        Duration::new(3725, 5_000_000),
    ] {
        assert_eq!(parse_go_duration(&format_go_duration(d)), Ok(d));
    }
}
