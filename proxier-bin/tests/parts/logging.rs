//! Tests of `proxier_bin::logging`.

use proxier_bin::logging::*;
use tracing_subscriber::filter::LevelFilter;

#[test]
fn klog_verbosity_maps_to_levels() {
    assert_eq!(level_for_verbosity(0), LevelFilter::INFO);
    assert_eq!(level_for_verbosity(1), LevelFilter::INFO);
    assert_eq!(level_for_verbosity(2), LevelFilter::DEBUG);
    assert_eq!(level_for_verbosity(4), LevelFilter::DEBUG);
    assert_eq!(level_for_verbosity(5), LevelFilter::TRACE);
    assert_eq!(level_for_verbosity(10), LevelFilter::TRACE);
}

#[test]
fn colours_only_on_a_terminal_without_no_color() {
    use std::ffi::OsStr;
    assert!(use_colours(true, None));
    assert!(use_colours(true, Some(OsStr::new(""))));
    assert!(!use_colours(true, Some(OsStr::new("1"))));
    assert!(!use_colours(false, None));
}
