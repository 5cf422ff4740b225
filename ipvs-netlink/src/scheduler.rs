//! IPVS scheduling algorithms.

use std::fmt;
use std::str::FromStr;

/// Longest scheduler name the kernel accepts (`IP_VS_SCHEDNAME_MAXLEN` is 16, including the NUL).
pub const SCHEDULER_NAME_MAX: usize = 15;

/// A scheduler, named as the kernel names its `ip_vs_*` modules.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Scheduler {
    /// Round robin (`rr`), the kernel's and kube-proxy's default.
    #[default]
    RoundRobin,
    /// Weighted round robin (`wrr`).
    WeightedRoundRobin,
    /// Least connection (`lc`).
    LeastConnection,
    /// Weighted least connection (`wlc`).
    WeightedLeastConnection,
    /// Locality-based least connection (`lblc`).
    LocalityLeastConnection,
    /// Locality-based least connection with replication (`lblcr`).
    LocalityLeastConnectionReplication,
    /// Destination hashing (`dh`).
    DestinationHashing,
    /// Source hashing (`sh`).
    SourceHashing,
    /// Shortest expected delay (`sed`).
    ShortestExpectedDelay,
    /// Never queue (`nq`).
    NeverQueue,
    /// Maglev hashing (`mh`).
    MaglevHashing,
    /// Weighted failover (`fo`).
    WeightedFailover,
    /// Weighted overflow (`ovf`).
    WeightedOverflow,
    /// Any other scheduler module, by name.
    Other(String),
}

/// A scheduler name that the kernel would refuse before looking it up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedulerNameError {
    /// The name is empty.
    #[error("scheduler name is empty")]
    Empty,
    /// The name is longer than [`SCHEDULER_NAME_MAX`] bytes.
    #[error("scheduler name {0:?} is longer than {SCHEDULER_NAME_MAX} bytes")]
    TooLong(String),
    /// The name contains a NUL byte.
    #[error("scheduler name {0:?} contains a NUL byte")]
    Nul(String),
}

impl Scheduler {
    /// The kernel's name for this scheduler.
    pub fn name(&self) -> &str {
        match self {
            Scheduler::RoundRobin => "rr",
            Scheduler::WeightedRoundRobin => "wrr",
            Scheduler::LeastConnection => "lc",
            Scheduler::WeightedLeastConnection => "wlc",
            Scheduler::LocalityLeastConnection => "lblc",
            Scheduler::LocalityLeastConnectionReplication => "lblcr",
            Scheduler::DestinationHashing => "dh",
            Scheduler::SourceHashing => "sh",
            Scheduler::ShortestExpectedDelay => "sed",
            Scheduler::NeverQueue => "nq",
            Scheduler::MaglevHashing => "mh",
            Scheduler::WeightedFailover => "fo",
            Scheduler::WeightedOverflow => "ovf",
            Scheduler::Other(name) => name,
        }
    }

    /// Checks the name against the kernel's limits (non-empty, at most 15 bytes, no NUL).
    pub fn validate(&self) -> Result<(), SchedulerNameError> {
        let name = self.name();
        if name.is_empty() {
            Err(SchedulerNameError::Empty)
        } else if name.len() > SCHEDULER_NAME_MAX {
            Err(SchedulerNameError::TooLong(name.to_owned()))
        } else if name.contains('\0') {
            Err(SchedulerNameError::Nul(name.to_owned()))
        } else {
            Ok(())
        }
    }
}

impl fmt::Display for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scheduler {
    type Err = SchedulerNameError;

    /// Parses a kernel scheduler name; unknown names become [`Scheduler::Other`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let sched = match s {
            "rr" => Scheduler::RoundRobin,
            "wrr" => Scheduler::WeightedRoundRobin,
            "lc" => Scheduler::LeastConnection,
            "wlc" => Scheduler::WeightedLeastConnection,
            "lblc" => Scheduler::LocalityLeastConnection,
            "lblcr" => Scheduler::LocalityLeastConnectionReplication,
            "dh" => Scheduler::DestinationHashing,
            "sh" => Scheduler::SourceHashing,
            "sed" => Scheduler::ShortestExpectedDelay,
            "nq" => Scheduler::NeverQueue,
            "mh" => Scheduler::MaglevHashing,
            "fo" => Scheduler::WeightedFailover,
            "ovf" => Scheduler::WeightedOverflow,
            other => Scheduler::Other(other.to_owned()),
        };
        sched.validate()?;
        Ok(sched)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_names_round_trip() {
        for name in [
            "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh", "fo", "ovf",
        ] {
            let s: Scheduler = name.parse().expect("known scheduler parses");
            assert!(
                !matches!(s, Scheduler::Other(_)),
                "{name} should be a known variant"
            );
            assert_eq!(s.name(), name);
        }
    }

    #[test]
    fn limits_are_checked() {
        assert_eq!("".parse::<Scheduler>(), Err(SchedulerNameError::Empty));
        assert!(matches!(
            "a-very-long-name".parse::<Scheduler>(),
            Err(SchedulerNameError::TooLong(_))
        ));
        assert_eq!(
            "exactly15bytes_".parse::<Scheduler>(),
            Ok(Scheduler::Other("exactly15bytes_".into()))
        );
        assert!(matches!(
            "r\0r".parse::<Scheduler>(),
            Err(SchedulerNameError::Nul(_))
        ));
    }
}
