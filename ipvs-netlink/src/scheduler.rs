//! IPVS scheduling algorithms.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

/// Longest scheduler name the kernel accepts (`IP_VS_SCHEDNAME_MAXLEN` is 16, including the NUL).
pub const SCHEDULER_NAME_MAX: usize = 15;

/// A scheduler, named as the kernel names its `ip_vs_*` modules.
///
/// Equality, hashing and ordering go by the kernel name, so `Other("rr")` equals
/// [`Scheduler::RoundRobin`] (the kernel reports both as `rr`). Build schedulers from names
/// with [`Scheduler::from_name`] or [`str::parse`], which map known names to their variants.
#[derive(Debug, Clone, Default)]
pub enum Scheduler {
    /// Round robin (`rr`), kube-proxy's default and this crate's. (The kernel has none: a
    /// service always names one; ipvsadm's is `wlc`.)
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
    /// Any other scheduler module, by name. Prefer [`Scheduler::from_name`], which never
    /// wraps a known name here; a known name wrapped by hand still compares equal to its
    /// variant.
    Other(String),
}

/// The schedulers with a variant of their own, with their kernel names, in variant order.
const KNOWN: [(Scheduler, &str); 13] = [
    (Scheduler::RoundRobin, "rr"),
    (Scheduler::WeightedRoundRobin, "wrr"),
    (Scheduler::LeastConnection, "lc"),
    (Scheduler::WeightedLeastConnection, "wlc"),
    (Scheduler::LocalityLeastConnection, "lblc"),
    (Scheduler::LocalityLeastConnectionReplication, "lblcr"),
    (Scheduler::DestinationHashing, "dh"),
    (Scheduler::SourceHashing, "sh"),
    (Scheduler::ShortestExpectedDelay, "sed"),
    (Scheduler::NeverQueue, "nq"),
    (Scheduler::MaglevHashing, "mh"),
    (Scheduler::WeightedFailover, "fo"),
    (Scheduler::WeightedOverflow, "ovf"),
];

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
            Scheduler::Other(name) => name,
            known => KNOWN
                .iter()
                .find(|(s, _)| std::mem::discriminant(s) == std::mem::discriminant(known))
                .map_or("", |(_, n)| n),
        }
    }

    /// The scheduler with this kernel name: a known name gives its variant, any other
    /// name [`Scheduler::Other`]. Does not check the name (see [`Scheduler::validate`];
    /// [`str::parse`] does both).
    pub fn from_name(name: &str) -> Scheduler {
        KNOWN
            .iter()
            .find(|(_, n)| *n == name)
            .map_or_else(|| Scheduler::Other(name.to_owned()), |(s, _)| s.clone())
    }

    /// The same scheduler in its canonical form: `Other` holding a known name becomes that
    /// name's variant.
    pub fn normalized(self) -> Scheduler {
        match self {
            Scheduler::Other(name) => Scheduler::from_name(&name),
            known => known,
        }
    }

    /// Position for ordering: known schedulers in variant order, then the others.
    fn rank(&self) -> usize {
        let name = self.name();
        KNOWN
            .iter()
            .position(|(_, n)| *n == name)
            .unwrap_or(KNOWN.len())
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
        let sched = Scheduler::from_name(s);
        sched.validate()?;
        Ok(sched)
    }
}

impl PartialEq for Scheduler {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Scheduler {}

impl Hash for Scheduler {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.name().hash(state);
    }
}

impl PartialOrd for Scheduler {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Scheduler {
    /// Known schedulers in variant order, then other names alphabetically.
    fn cmp(&self, other: &Self) -> Ordering {
        (self.rank(), self.name()).cmp(&(other.rank(), other.name()))
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

    fn hash_of(s: &Scheduler) -> u64 {
        use std::collections::hash_map::DefaultHasher;
        let mut h = DefaultHasher::new();
        s.hash(&mut h);
        h.finish()
    }

    #[test]
    fn other_with_a_known_name_equals_its_variant() {
        let by_hand = Scheduler::Other("rr".into());
        assert_eq!(by_hand, Scheduler::RoundRobin);
        assert_eq!(Scheduler::RoundRobin, by_hand);
        assert_eq!(hash_of(&by_hand), hash_of(&Scheduler::RoundRobin));
        assert_eq!(by_hand.cmp(&Scheduler::RoundRobin), Ordering::Equal);
        assert_eq!(by_hand.clone().normalized(), Scheduler::RoundRobin);
        assert!(matches!(by_hand.normalized(), Scheduler::RoundRobin));
        assert!(matches!(
            Scheduler::from_name("mh"),
            Scheduler::MaglevHashing
        ));
        assert_ne!(Scheduler::Other("rr".into()), Scheduler::WeightedRoundRobin);
        assert_ne!(
            Scheduler::Other("foo".into()),
            Scheduler::Other("bar".into())
        );
        assert_eq!(Scheduler::Other("foo".into()), Scheduler::from_name("foo"));
    }

    #[test]
    fn ordering_keeps_variant_order_then_other_names() {
        let mut v = [
            Scheduler::Other("zz".into()),
            Scheduler::WeightedOverflow,
            Scheduler::Other("aa".into()),
            Scheduler::Other("wrr".into()),
            Scheduler::RoundRobin,
        ];
        v.sort();
        assert_eq!(
            v.iter().map(Scheduler::name).collect::<Vec<_>>(),
            ["rr", "wrr", "ovf", "aa", "zz"]
        );
        let set: std::collections::BTreeSet<_> =
            [Scheduler::Other("lc".into()), Scheduler::LeastConnection].into();
        assert_eq!(set.len(), 1);
    }
}
