//! The node's netfilter plan kept current one Service at a time.
//!
//! Each Service contributes set elements ([`super::plan_of_service`]); several Services
//! may contribute the same element (a shared ExternalIP, an endpoint in two Services), so
//! every element carries a count and stays in the tables while any Service needs it. Changing
//! one Service costs the size of that Service, and the elements that came or went since the
//! last [`NetfilterTracker::take_changes`] are exactly what an incremental nftables update
//! must add and delete.
//!
//! Memory: the combined plan holds each element once; a Service's contribution is kept as
//! one compact list (what its next change must take back), and a count is kept only
//! for the few elements more than one Service contributes (an element in the combined plan
//! with no count has exactly one contributor).

use std::net::IpAddr;

use foldhash::{HashMap, HashMapExt};
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
            node_pod_cidrs: IpNet,
        }
    };
}

macro_rules! family_elements {
    ($($field:ident: $ty:ty,)*) => {
        /// One element of one set of a family's table (the variant names the set).
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        enum Element {
            $($field($ty),)*
        }

        /// Appends every element of `plan`, tagged with its family, to `out`.
        fn elements_of(plan: &FamilyPlan, out: &mut Vec<(AddressFamily, Element)>) {
            $(out.extend(plan.$field.iter().map(|e| (plan.family, Element::$field(*e))));)*
        }

        /// Adds `element` to `plan`; returns whether it was not there yet.
        fn insert(plan: &mut FamilyPlan, element: Element) -> bool {
            match element {
                $(Element::$field(e) => plan.$field.insert(e),)*
            }
        }

        /// Removes `element` from `plan`; returns whether it was there.
        fn remove(plan: &mut FamilyPlan, element: &Element) -> bool {
            match element {
                $(Element::$field(e) => plan.$field.remove(e),)*
            }
        }

        /// Whether a family plan holds no element at all.
        fn family_is_empty(plan: &FamilyPlan) -> bool {
            true $(&& plan.$field.is_empty())*
        }
    };
}

with_family_sets!(family_elements);

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
    /// Every element some Service needs, once.
    combined: NetfilterPlan,
    /// How many Services contribute each element that more than one Service contributes
    /// (always 2 or more; an element of `combined` missing here has one contributor).
    shared: HashMap<(AddressFamily, Element), u32>,
    /// Each Service's contribution (families the tables do not have left out); every
    /// element appears once, as each set of a plan holds it at most once.
    services: HashMap<ServiceName, Box<[(AddressFamily, Element)]>>,
    changes: PlanChanges,
    /// Whether elements coming and going are kept in `changes` (see
    /// [`NetfilterTracker::record_changes`]).
    recording: bool,
}

impl NetfilterTracker {
    /// A tracker with no Service, for the families and rules of `empty`
    /// ([`super::empty_plan`]).
    pub fn new(empty: NetfilterPlan) -> Self {
        NetfilterTracker {
            combined: empty.clone(),
            shared: HashMap::new(),
            services: HashMap::new(),
            changes: PlanChanges {
                added: empty.clone(),
                removed: empty.clone(),
            },
            recording: true,
            empty,
        }
    }

    /// Whether the elements that come and go are kept for the next
    /// [`NetfilterTracker::take_changes`] (the default). Off while no incremental update
    /// can follow (the tables are to be written whole from [`NetfilterTracker::plan`]: at a
    /// start, after a failure), so that a first picture of 10,000 Services does not also
    /// build a second copy of every element as `added`; turning it off forgets what was kept.
    pub fn record_changes(&mut self, on: bool) {
        if !on && self.recording {
            self.take_changes();
        }
        self.recording = on;
    }

    /// The whole plan: every element some Service needs.
    pub fn plan(&self) -> &NetfilterPlan {
        &self.combined
    }

    /// Sets the contribution of `service` (`None`: it has none any more).
    pub fn set_service(&mut self, service: &ServiceName, plan: Option<NetfilterPlan>) {
        let old = match plan {
            Some(plan) => {
                let mut elements = Vec::new();
                for family in AddressFamily::ALL {
                    // A family the tables do not have cannot take elements.
                    if let (Some(part), Some(_)) =
                        (plan.family(family), self.combined.family(family))
                    {
                        elements_of(part, &mut elements);
                    }
                }
                for (family, element) in &elements {
                    self.count_up(*family, *element);
                }
                let elements = elements.into_boxed_slice();
                if elements.is_empty() {
                    self.services.remove(service)
                } else {
                    match self.services.get_mut(service) {
                        Some(slot) => Some(std::mem::replace(slot, elements)),
                        None => self.services.insert(service.clone(), elements),
                    }
                }
            }
            None => self.services.remove(service),
        };
        if let Some(old) = old {
            for (family, element) in old.iter() {
                self.count_down(*family, element);
            }
        }
    }

    /// Sets the Service CIDRs routed to the node ([`FamilyPlan::routed_service_cidrs`]) of
    /// each family the tables have. That changes a rule, not set elements: the tables must
    /// then be rewritten whole ([`super::Netfilter::invalidate`]).
    pub fn set_routed_service_cidrs(&mut self, routed: &[IpNet]) {
        for family in AddressFamily::ALL {
            let of_family: Vec<IpNet> = routed
                .iter()
                .filter(|net| AddressFamily::of(net.addr()) == family)
                .copied()
                .collect();
            for plan in [
                &mut self.empty,
                &mut self.combined,
                &mut self.changes.added,
                &mut self.changes.removed,
            ] {
                if let Some(family_plan) = plan.family_mut(family) {
                    family_plan.routed_service_cidrs.clone_from(&of_family);
                }
            }
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

    /// One more Service contributes `element`.
    fn count_up(&mut self, family: AddressFamily, element: Element) {
        let Some((combined, added, removed)) =
            family_sets(&mut self.combined, &mut self.changes, family)
        else {
            return;
        };
        if !insert(combined, element) {
            *self.shared.entry((family, element)).or_insert(1) += 1;
            return;
        }
        if self.recording && !remove(removed, &element) {
            insert(added, element);
        }
    }

    /// One Service fewer contributes `element`.
    fn count_down(&mut self, family: AddressFamily, element: &Element) {
        let Some((combined, added, removed)) =
            family_sets(&mut self.combined, &mut self.changes, family)
        else {
            return;
        };
        if let Some(count) = self.shared.get_mut(&(family, *element)) {
            *count -= 1;
            if *count < 2 {
                self.shared.remove(&(family, *element));
            }
            return;
        }
        if remove(combined, element) && self.recording && !remove(added, element) {
            insert(removed, *element);
        }
    }
}

/// The combined plan's, the added and the removed elements' part of `family`; `None` when the
/// tables do not have the family.
fn family_sets<'a>(
    combined: &'a mut NetfilterPlan,
    changes: &'a mut PlanChanges,
    family: AddressFamily,
) -> Option<(&'a mut FamilyPlan, &'a mut FamilyPlan, &'a mut FamilyPlan)> {
    Some((
        combined.family_mut(family)?,
        changes.added.family_mut(family)?,
        changes.removed.family_mut(family)?,
    ))
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
    fn an_element_of_three_services_leaves_with_the_last_of_them() {
        let names: Vec<ServiceName> = (0..3)
            .map(|i| ServiceName::new("ns", format!("s{i}")))
            .collect();
        let mut tracker = NetfilterTracker::new(empty());
        for name in &names {
            tracker.set_service(name, Some(with_ips(&["10.0.0.9"])));
        }
        assert_eq!(bound(&tracker.take_changes().added), ["10.0.0.9"]);
        for name in &names[..2] {
            tracker.set_service(name, None);
            assert!(tracker.take_changes().is_empty());
            assert_eq!(bound(tracker.plan()), ["10.0.0.9"]);
        }
        // Back to three, then all gone: removed once, when the last one leaves.
        tracker.set_service(&names[0], Some(with_ips(&["10.0.0.9"])));
        tracker.set_service(&names[1], Some(with_ips(&["10.0.0.9"])));
        assert!(tracker.take_changes().is_empty());
        for name in &names {
            tracker.set_service(name, None);
        }
        let changes = tracker.take_changes();
        assert_eq!(bound(&changes.removed), ["10.0.0.9"]);
        assert!(bound(tracker.plan()).is_empty());
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
    fn while_not_recording_the_plan_moves_and_changes_count_from_when_it_resumes() {
        let (a, b) = (ServiceName::new("ns", "a"), ServiceName::new("ns", "b"));
        let mut tracker = NetfilterTracker::new(empty());
        tracker.set_service(&a, Some(with_ips(&["10.0.0.1"])));
        // Off: what was kept is forgotten, and nothing more is kept; the plan still moves.
        tracker.record_changes(false);
        tracker.set_service(&b, Some(with_ips(&["10.0.0.2"])));
        tracker.set_service(&a, None);
        assert!(tracker.take_changes().is_empty());
        assert_eq!(bound(tracker.plan()), ["10.0.0.2"]);

        // On again: changes against the plan as it was when recording resumed.
        tracker.record_changes(true);
        tracker.set_service(&a, Some(with_ips(&["10.0.0.1"])));
        tracker.set_service(&b, None);
        let changes = tracker.take_changes();
        assert_eq!(bound(&changes.added), ["10.0.0.1"]);
        assert_eq!(bound(&changes.removed), ["10.0.0.2"]);
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
