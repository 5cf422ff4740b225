//! The node's netfilter plan kept current one Service at a time.
//!
//! Each Service contributes set elements ([`super::plan_of_service`]); several Services
//! may contribute the same element (a shared ExternalIP, an endpoint in two Services), so
//! every element carries a count and stays in the tables while any Service needs it. Changing
//! one Service costs the size of that Service, and the elements that came or went since the
//! last [`NetfilterTracker::take_changes`] are exactly what an incremental nftables update
//! must add and delete.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use ipnet::IpNet;

use super::plan::{AddrPort, FamilyPlan, NetfilterPlan, ProtoPort, SourceRange};
use crate::model::{AddressFamily, ServiceName};

/// Calls `$m!` with every set field of [`FamilyPlan`] and its element type.
macro_rules! with_family_sets {
    ($m:ident) => {
        $m! {
            cluster_ips: AddrPort,
            external_ips: AddrPort,
            external_ips_local: AddrPort,
            load_balancer_ips: AddrPort,
            load_balancer_ips_local: AddrPort,
            node_ports: ProtoPort,
            node_ports_local: ProtoPort,
            firewalled: AddrPort,
            source_ranges: SourceRange,
            node_allowed: AddrPort,
            hairpin: AddrPort,
            health_check_node_ports: u16,
            bound_ips: IpAddr,
            service_ports: AddrPort,
            node_pod_cidrs: IpNet,
        }
    };
}

macro_rules! family_counts {
    ($($field:ident: $ty:ty,)*) => {
        /// How many Services need each element of one family's sets.
        #[derive(Debug, Default)]
        struct FamilyCounts {
            $($field: BTreeMap<$ty, u32>,)*
        }

        impl FamilyCounts {
            /// Adds (`up`) or removes one Service's elements; records in `added` / `removed`
            /// the elements that appeared in or left `combined`.
            fn adjust(
                &mut self,
                fragment: &FamilyPlan,
                up: bool,
                combined: &mut FamilyPlan,
                added: &mut FamilyPlan,
                removed: &mut FamilyPlan,
            ) {
                $(
                    for element in &fragment.$field {
                        count(
                            &mut self.$field,
                            element,
                            up,
                            &mut combined.$field,
                            &mut added.$field,
                            &mut removed.$field,
                        );
                    }
                )*
            }
        }

        /// Whether a family plan holds no element at all.
        fn family_is_empty(plan: &FamilyPlan) -> bool {
            true $(&& plan.$field.is_empty())*
        }
    };
}

with_family_sets!(family_counts);

/// Counts one element up or down and keeps `combined` and the pending change sets in step.
fn count<T: Ord + Clone>(
    counts: &mut BTreeMap<T, u32>,
    element: &T,
    up: bool,
    combined: &mut BTreeSet<T>,
    added: &mut BTreeSet<T>,
    removed: &mut BTreeSet<T>,
) {
    if up {
        let n = counts.entry(element.clone()).or_insert(0);
        *n += 1;
        if *n == 1 {
            combined.insert(element.clone());
            if !removed.remove(element) {
                added.insert(element.clone());
            }
        }
    } else if let Some(n) = counts.get_mut(element) {
        *n -= 1;
        if *n == 0 {
            counts.remove(element);
            combined.remove(element);
            if !added.remove(element) {
                removed.insert(element.clone());
            }
        }
    }
}

/// The elements added to and removed from the tables since the last
/// [`NetfilterTracker::take_changes`], as two plans of the same families.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanChanges {
    /// Elements that are new in the tables.
    pub added: NetfilterPlan,
    /// Elements no Service needs any more.
    pub removed: NetfilterPlan,
}

impl PlanChanges {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        let empty = |plan: &NetfilterPlan| {
            plan.v4.as_ref().is_none_or(family_is_empty)
                && plan.v6.as_ref().is_none_or(family_is_empty)
        };
        empty(&self.added) && empty(&self.removed)
    }
}

/// The node's netfilter plan, built from per-Service contributions.
#[derive(Debug)]
pub struct NetfilterTracker {
    /// Families and rules with no element (what a new `added`/`removed` starts from).
    empty: NetfilterPlan,
    combined: NetfilterPlan,
    counts: HashMap<AddressFamily, FamilyCounts>,
    services: HashMap<ServiceName, NetfilterPlan>,
    changes: PlanChanges,
}

impl NetfilterTracker {
    /// A tracker with no Service, for the families and rules of `empty`
    /// ([`super::empty_plan`]).
    pub fn new(empty: NetfilterPlan) -> Self {
        NetfilterTracker {
            combined: empty.clone(),
            counts: HashMap::new(),
            services: HashMap::new(),
            changes: PlanChanges {
                added: empty.clone(),
                removed: empty.clone(),
            },
            empty,
        }
    }

    /// The whole plan: every element some Service needs.
    pub fn plan(&self) -> &NetfilterPlan {
        &self.combined
    }

    /// Sets the contribution of `service` (`None`: it has none any more).
    pub fn set_service(&mut self, service: &ServiceName, plan: Option<NetfilterPlan>) {
        let old = match plan {
            Some(plan) => {
                let old = self.services.remove(service);
                self.adjust(&plan, true);
                self.services.insert(service.clone(), plan);
                old
            }
            None => self.services.remove(service),
        };
        if let Some(old) = old {
            self.adjust(&old, false);
        }
    }

    /// Returns and forgets the elements added and removed since the last call.
    pub fn take_changes(&mut self) -> PlanChanges {
        let fresh = PlanChanges {
            added: self.empty.clone(),
            removed: self.empty.clone(),
        };
        std::mem::replace(&mut self.changes, fresh)
    }

    fn adjust(&mut self, fragment: &NetfilterPlan, up: bool) {
        for family in AddressFamily::ALL {
            let (Some(part), Some(combined), Some(added), Some(removed)) = (
                fragment.family(family),
                self.combined.family_mut(family),
                self.changes.added.family_mut(family),
                self.changes.removed.family_mut(family),
            ) else {
                continue;
            };
            self.counts
                .entry(family)
                .or_default()
                .adjust(part, up, combined, added, removed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::Protocol;
    use crate::netfilter::ClusterIpMasquerade;

    fn empty() -> NetfilterPlan {
        NetfilterPlan {
            v4: Some(FamilyPlan::new(
                AddressFamily::V4,
                ClusterIpMasquerade::NodeFromVip,
            )),
            v6: None,
        }
    }

    fn with_ips(ips: &[&str]) -> NetfilterPlan {
        let mut plan = empty();
        let family = plan.v4.as_mut().expect("v4");
        for ip in ips {
            let address: IpAddr = ip.parse().expect("ip");
            family.bound_ips.insert(address);
            family.cluster_ips.insert(AddrPort {
                address,
                protocol: Protocol::Tcp,
                port: 80,
            });
        }
        plan
    }

    fn bound(plan: &NetfilterPlan) -> Vec<String> {
        plan.v4
            .as_ref()
            .map(|f| f.bound_ips.iter().map(ToString::to_string).collect())
            .unwrap_or_default()
    }

    #[test]
    fn shared_elements_stay_while_any_service_needs_them() {
        let a = ServiceName::new("ns", "a");
        let b = ServiceName::new("ns", "b");
        let mut tracker = NetfilterTracker::new(empty());
        tracker.set_service(&a, Some(with_ips(&["10.0.0.1", "10.0.0.9"])));
        tracker.set_service(&b, Some(with_ips(&["10.0.0.2", "10.0.0.9"])));
        let changes = tracker.take_changes();
        assert_eq!(bound(&changes.added), ["10.0.0.1", "10.0.0.2", "10.0.0.9"]);
        assert!(bound(&changes.removed).is_empty());

        // a goes: only its own address leaves; the shared one stays for b.
        tracker.set_service(&a, None);
        let changes = tracker.take_changes();
        assert!(bound(&changes.added).is_empty());
        assert_eq!(bound(&changes.removed), ["10.0.0.1"]);
        assert_eq!(bound(tracker.plan()), ["10.0.0.2", "10.0.0.9"]);
        assert!(tracker.take_changes().is_empty());
    }

    #[test]
    fn an_element_removed_and_added_back_before_a_sync_is_no_change() {
        let a = ServiceName::new("ns", "a");
        let mut tracker = NetfilterTracker::new(empty());
        tracker.set_service(&a, Some(with_ips(&["10.0.0.1"])));
        tracker.take_changes();
        tracker.set_service(&a, Some(with_ips(&["10.0.0.3"])));
        tracker.set_service(&a, Some(with_ips(&["10.0.0.1"])));
        assert!(tracker.take_changes().is_empty());
        assert_eq!(bound(tracker.plan()), ["10.0.0.1"]);
    }

    #[test]
    fn the_combined_plan_equals_the_union_of_the_services() {
        let mut tracker = NetfilterTracker::new(empty());
        let names: Vec<ServiceName> = (0..5)
            .map(|i| ServiceName::new("ns", format!("s{i}")))
            .collect();
        for (i, name) in names.iter().enumerate() {
            let ip = format!("10.0.0.{}", i % 3);
            tracker.set_service(name, Some(with_ips(&[&ip])));
        }
        tracker.set_service(&names[0], None);
        tracker.set_service(&names[3], None);
        // Left: s1 (.1), s2 (.2), s4 (.1).
        assert_eq!(bound(tracker.plan()), ["10.0.0.1", "10.0.0.2"]);
    }
}
