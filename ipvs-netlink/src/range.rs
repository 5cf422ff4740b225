//! Value ranges the kernel accepts, checked before anything is sent.

use std::ops::RangeInclusive;

/// A numeric field whose value the kernel cannot hold (it would refuse it, or store a
/// different value). Found before anything is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {value} is outside the range the kernel accepts ({}..={})", range.start(), range.end())]
pub struct RangeError {
    /// The field, e.g. `"persistence timeout"`.
    pub field: &'static str,
    /// The value that was given.
    pub value: u64,
    /// The values the kernel accepts.
    pub range: RangeInclusive<u64>,
}

impl RangeError {
    /// `Ok` when `value` lies in `range`, else the error naming `field`.
    pub fn check(
        field: &'static str,
        value: impl Into<u64>,
        range: RangeInclusive<u64>,
    ) -> Result<(), RangeError> {
        let value = value.into();
        if range.contains(&value) {
            Ok(())
        } else {
            Err(RangeError {
                field,
                value,
                range,
            })
        }
    }
}
