//! The second half of a full sync: the kernel's read becomes the cache and the plan is
//! applied over it.
//!
//! The first full sync (nothing is cached yet) compares the whole plan with the whole read
//! at once. Every later one repairs in slices ([`Reconciler::repair_slice`]): the links'
//! addresses and routes are taken from the read at once, then the virtual servers, a slice
//! of them at a time in key order, each merged into the cache and converged as an
//! incremental sync converges the virtual servers of a changed service port. Incremental
//! syncs run between slices, so no change waits for the whole table to be compared. A
//! virtual server an incremental sync touched since the read began keeps its cached
//! state, which is newer than the read, until the repair ends.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::ops::Bound;

use foldhash::{HashSet, HashSetExt};
use ipnet::IpNet;
use tokio::time::Instant;

use super::{FullRead, RETIRED_LISTINGS, ReconcileError, ReconcileReport, Reconciler};
use crate::backend::{AddressBackend, IpvsBackend, TableRead};
use crate::desired::{Desired, ServicePortName, VirtualServerKey, VirtualServerRole};
use crate::diff::{self, Changes, Rejection};
use crate::observed::{Observed, ObservedVirtualServer};

/// At most this many planned virtual servers missing from the first full sync's
/// best-effort read are looked up one by one; more, and the table is read again, verified.
const CONFIRM_ONE_BY_ONE: usize = 256;

/// A full sync's repair in progress.
#[derive(Debug)]
pub(super) struct Repair {
    /// The virtual servers as read, those not merged into the cache yet.
    read: BTreeMap<VirtualServerKey, ObservedVirtualServer>,
    /// The last virtual server looked at: the next slice starts after it.
    after: Option<VirtualServerKey>,
    /// The routes wanted when the repair started; the others through the link go when it
    /// ends, once the addresses they covered are bound.
    wanted_routes: BTreeSet<IpNet>,
    /// The routes configured when the repair started.
    configured_routes: Vec<IpNet>,
    /// Objects found changed behind the proxier's back so far.
    drift: usize,
    /// The full sync's report so far.
    report: ReconcileReport,
}

/// The read, with the links' addresses and routes merged with what the cache knows newer.
struct LinkState {
    bound_addresses: BTreeSet<IpAddr>,
    wanted_routes: BTreeSet<IpNet>,
    report: ReconcileReport,
}

impl<I: IpvsBackend, A: AddressBackend> Reconciler<I, A> {
    /// Whether a full sync's repair is left for [`Reconciler::repair_slice`].
    pub fn repairing(&self) -> bool {
        self.repair.is_some()
    }

    /// Starts the second half of a full sync begun with [`Reconciler::begin_full_sync`],
    /// given its read, to be ended in slices: the dummy link is ensured and its addresses
    /// and routes are taken from the read (those bound, unbound, added or removed since it
    /// began from the cache). The first full sync then compares the whole plan with the
    /// read and returns its report; a later one leaves the virtual servers to
    /// [`Reconciler::repair_slice`] and returns `None`.
    ///
    /// The slices compare with the plan the last sync converged on: `desired` is that plan
    /// but for service ports passed to [`Reconciler::sync_services`] right after this (or
    /// between slices). [`Reconciler::finish_full_sync`] takes any plan.
    pub async fn start_repair(
        &mut self,
        desired: &Desired,
        read: FullRead,
    ) -> Result<Option<ReconcileReport>, ReconcileError> {
        self.start_full_repair(desired, read, true).await
    }

    /// [`Reconciler::start_repair`]; with `sliced` false, the whole plan is compared with
    /// the whole read at once, as at the first full sync.
    pub(super) async fn start_full_repair(
        &mut self,
        desired: &Desired,
        read: FullRead,
        sliced: bool,
    ) -> Result<Option<ReconcileReport>, ReconcileError> {
        self.repair = None;
        let now = Instant::now();
        self.drains_checked_at = now;
        let mut table = read
            .table
            .map_err(|source| ReconcileError::ListVirtualServers { source })?;
        self.ipvs.record_read(&table);
        if table.best_effort {
            table = self.confirm_best_effort(desired, table).await?;
        }
        self.stats.table_reads = self.ipvs.table_reads();
        let read_started = std::time::Instant::now();
        let links = self.merge_links(read.link).await?;
        let read_time = table.took + read_started.elapsed();
        if !self.synced || !sliced {
            let mut report = self
                .repair_whole(desired, table.virtual_servers, links, now)
                .await;
            report.timings.read = read_time;
            return Ok(Some(report));
        }

        let mut report = links.report;
        report.timings.read = read_time;
        let drift = self
            .kernel
            .bound_addresses
            .symmetric_difference(&links.bound_addresses)
            .count();
        self.kernel.bound_addresses = links.bound_addresses;
        let virtual_servers = table.virtual_servers;
        // A retired virtual server missing from several listings in a row is gone for good
        // (one missing listing may be a dump that skipped it).
        self.retired.retain(|key, misses| {
            if virtual_servers.contains_key(key) {
                *misses = 0;
            } else {
                *misses += 1;
            }
            *misses < RETIRED_LISTINGS
        });
        // Draining real servers that are gone: as read, or as cached when touched since.
        let touched = self.touched_since_read.get_or_insert_with(HashSet::new);
        let cache = &self.kernel.virtual_servers;
        self.drains.retain(|vs, rs| {
            let view = if touched.contains(vs) {
                cache.get(vs)
            } else {
                virtual_servers.get(vs)
            };
            view.is_some_and(|v| v.real_servers.contains_key(rs))
        });
        self.failures
            .retain(|service, _| desired.services.contains_key(service));
        self.repair = Some(Repair {
            read: virtual_servers,
            after: None,
            wanted_routes: links.wanted_routes,
            configured_routes: self.config.service_cidr_routes.clone(),
            drift,
            report,
        });
        Ok(None)
    }

    /// Completes a best-effort read ([`IpvsBackend::read_table_best_effort`]) where it
    /// lacks a planned virtual server, which a disturbed dump may have skipped: creating
    /// one that exists would fail. Up to [`CONFIRM_ONE_BY_ONE`] missing ones are read alone
    /// (an exact lookup each); more (a first start, most of the plan missing), or a lookup
    /// failing, and the table is read again, verified. A virtual server the read skipped
    /// that no one plans is deleted by the next full sync, whose read is verified.
    async fn confirm_best_effort(
        &mut self,
        desired: &Desired,
        mut table: TableRead,
    ) -> Result<TableRead, ReconcileError> {
        let missing: BTreeSet<VirtualServerKey> = desired
            .virtual_servers()
            .map(|(_, key, _)| *key)
            .filter(|key| !table.virtual_servers.contains_key(key))
            .collect();
        if missing.is_empty() {
            return Ok(table);
        }
        if missing.len() <= CONFIRM_ONE_BY_ONE {
            let mut confirmed = true;
            for key in missing {
                match self.ipvs.get_virtual_server(&key).await {
                    Ok(Some(vs)) => {
                        table.virtual_servers.insert(key, vs);
                    }
                    Ok(None) => {}
                    Err(_) => {
                        confirmed = false;
                        break;
                    }
                }
            }
            if confirmed {
                return Ok(table);
            }
        }
        let started = std::time::Instant::now();
        let mut verified = self
            .ipvs
            .read_table()
            .await
            .map_err(|source| ReconcileError::ListVirtualServers { source })?;
        self.ipvs.record_read(&verified);
        verified.took = table.took + started.elapsed();
        Ok(verified)
    }

    /// Repairs the next slice of a full sync's virtual servers (at most `max` of them, in
    /// key order): each is merged from the read into the cache (unless an incremental sync
    /// touched it since the read began: the cache is newer) and, when it is the proxier's,
    /// converged on the plan as [`Reconciler::sync_services`] converges a changed service
    /// port's; service ports waiting for a retry are left to it. The last slice also binds
    /// and unbinds the addresses no virtual server accounted for and removes the routes no
    /// longer wanted. Returns the full sync's report once the repair is done; `None` while
    /// slices remain (or when no repair is in progress, see [`Reconciler::repairing`]).
    pub async fn repair_slice(&mut self, desired: &Desired, max: usize) -> Option<ReconcileReport> {
        let max = max.max(1);
        let mut repair = self.repair.take()?;
        let now = Instant::now();
        let lower = match &repair.after {
            Some(key) => Bound::Excluded(*key),
            None => Bound::Unbounded,
        };
        let mut slice: Vec<VirtualServerKey> = repair
            .read
            .range((lower, Bound::Unbounded))
            .map(|(key, _)| *key)
            .take(max)
            .chain(
                self.kernel
                    .virtual_servers
                    .range((lower, Bound::Unbounded))
                    .map(|(key, _)| *key)
                    .take(max),
            )
            .collect();
        slice.sort_unstable();
        slice.dedup();
        // Fewer than `max` keys from both listings together: both are exhausted.
        let last = slice.len() < max;
        slice.truncate(max);
        repair.after = slice.last().copied().or(repair.after);

        let diff_started = std::time::Instant::now();
        let touched = self.touched_since_read.take().unwrap_or_default();
        let mut keys: BTreeMap<VirtualServerKey, Option<ServicePortName>> = BTreeMap::new();
        let mut attempted = BTreeSet::new();
        for key in slice {
            let fresh = repair.read.remove(&key);
            if touched.contains(&key) {
                // An incremental sync converged it since the read began.
                continue;
            }
            let claimed = self
                .claimants
                .get(&key)
                .and_then(|set| set.first())
                .cloned();
            let owned = claimed.is_some() || self.owns_unplanned(&key);
            if owned {
                repair.drift += ObservedVirtualServer::differences(
                    self.kernel.virtual_servers.get(&key),
                    fresh.as_ref(),
                );
            }
            match fresh {
                Some(vs) => {
                    let refreshed = (self.kernel.virtual_servers.get_mut(&key))
                        .is_some_and(|cached| cached.refresh_from(&vs));
                    if refreshed {
                        None
                    } else {
                        self.kernel.virtual_servers.insert(key, vs.clone())
                    }
                }
                None => {
                    self.drains.stop_virtual_server(&key);
                    self.kernel.virtual_servers.remove(&key)
                }
            };
            self.suspect.remove(&key);
            if !owned {
                continue;
            }
            if let Some(winner) = &claimed {
                if self
                    .failures
                    .get(winner)
                    .is_some_and(|failure| failure.retry_at > now)
                {
                    continue;
                }
                attempted.insert(winner.clone());
            }
            keys.insert(key, None);
        }
        self.touched_since_read = Some(touched);
        let diff = diff_started.elapsed();
        let mut report = self.sync_keys(desired, keys, &attempted, now).await;
        report.timings.diff += diff;
        repair.report += report;
        self.repair = Some(repair);
        if !last {
            return None;
        }
        Some(self.end_repair(desired, now).await)
    }

    /// Whether a virtual server no service port plans is the proxier's to delete (the one
    /// ownership rule, [`crate::diff::Scope::owns`]).
    fn owns_unplanned(&self, key: &VirtualServerKey) -> bool {
        let retired: std::collections::HashSet<VirtualServerKey> = self
            .retired
            .contains_key(key)
            .then_some(*key)
            .into_iter()
            .collect();
        self.scope(&self.kernel.bound_addresses, &retired).owns(key)
    }

    /// The last step of a sliced repair: the addresses no virtual server accounted for,
    /// the routes no longer wanted, the counters.
    async fn end_repair(&mut self, desired: &Desired, now: Instant) -> ReconcileReport {
        let Some(mut repair) = self.repair.take() else {
            return ReconcileReport::default();
        };
        self.touched_since_read = None;
        let mut bind = Vec::new();
        let mut unbind = Vec::new();
        for (address, keys) in &self.binders {
            if !keys.is_empty() && !self.kernel.bound_addresses.contains(address) {
                bind.push(*address);
            }
        }
        for address in &self.kernel.bound_addresses {
            let needed = self.binders.get(address).is_some_and(|set| !set.is_empty());
            if !needed && !self.is_excluded(*address) {
                unbind.push(*address);
            }
        }
        if !bind.is_empty() || !unbind.is_empty() {
            repair.report += self
                .apply(
                    desired,
                    Changes::default(),
                    bind,
                    unbind,
                    &BTreeSet::new(),
                    now,
                    Vec::new(),
                )
                .await;
        }
        // Routes that go only now: the addresses under them were bound by the slices. A
        // change of the configured routes since the repair began (synced or not) is the
        // incremental syncs' to apply.
        let mut routes = ReconcileReport::default();
        if !self.routes_changed && repair.configured_routes == self.config.service_cidr_routes {
            let link = self.addresses.link_name().to_owned();
            self.remove_unwanted_routes(&link, &repair.wanted_routes, &mut routes)
                .await;
        }
        repair.report += routes;
        repair.report.drift = Some(repair.drift);
        self.stats.full_syncs += 1;
        self.stats.last_full_sync_drift = Some(repair.drift);
        self.refresh_stats();
        repair.report
    }

    /// Ensures the dummy link and merges its addresses and routes as read with what
    /// changed since the read began (the cache is newer), adding the configured routes that
    /// are missing.
    async fn merge_links(
        &mut self,
        read: Option<Result<crate::backend::LinkRead, crate::backend::BackendError>>,
    ) -> Result<LinkState, ReconcileError> {
        let touched_addresses = self.addresses_touched_since_read.take().unwrap_or_default();
        let touched_routes = self.routes_touched_since_read.take().unwrap_or_default();
        let link = self.addresses.link_name().to_owned();
        self.addresses
            .ensure_link()
            .await
            .map_err(|source| ReconcileError::Link {
                link: link.clone(),
                source,
            })?;
        let (bound_addresses, routes) = match read {
            Some(Ok(read)) => {
                // Bound or unbound after the read started: the cache is newer.
                let mut bound = read.addresses;
                for address in touched_addresses {
                    if self.kernel.bound_addresses.contains(&address) {
                        bound.insert(address);
                    } else {
                        bound.remove(&address);
                    }
                }
                (bound, read.routes)
            }
            _ => {
                let bound = self.addresses.list_addresses().await.map_err(|source| {
                    ReconcileError::ListAddresses {
                        link: link.clone(),
                        source,
                    }
                })?;
                let routes = self.addresses.list_local_routes().await.map_err(|source| {
                    ReconcileError::ListRoutes {
                        link: link.clone(),
                        source,
                    }
                })?;
                (bound, routes)
            }
        };
        // Routes added or removed after the read started: the cache is newer.
        let mut routes = routes;
        for net in touched_routes {
            if self.routed.contains(&net) {
                routes.insert(net);
            } else {
                routes.remove(&net);
            }
        }
        let mut report = ReconcileReport::default();
        let wanted_routes = self.add_routes(&link, &routes, &mut report).await;
        Ok(LinkState {
            bound_addresses,
            wanted_routes,
            report,
        })
    }

    /// The first full sync's repair: the whole plan against the whole read, at once.
    async fn repair_whole(
        &mut self,
        desired: &Desired,
        virtual_servers: BTreeMap<VirtualServerKey, ObservedVirtualServer>,
        links: LinkState,
        now: Instant,
    ) -> ReconcileReport {
        let touched = self.touched_since_read.take().unwrap_or_default();
        // Copied, not kept: the read's entries sit among the read's transient buffers in
        // the reading thread's pages (see `ObservedVirtualServer::refresh_from`); the copy
        // is made here, and the read is freed whole.
        let mut virtual_servers = virtual_servers.clone();
        // Written (or re-read) after the read started: the cache is newer. One whose last
        // write failed is read again, alone.
        let mut still_suspect = Vec::new();
        for key in touched {
            let newer = if self.suspect.contains(&key) {
                match self.ipvs.get_virtual_server(&key).await {
                    Ok(fresh) => fresh,
                    Err(_) => {
                        still_suspect.push(key);
                        self.kernel.virtual_servers.get(&key).cloned()
                    }
                }
            } else {
                self.kernel.virtual_servers.get(&key).cloned()
            };
            match newer {
                Some(vs) => virtual_servers.insert(key, vs),
                None => virtual_servers.remove(&key),
            };
        }
        let mut bound_addresses = links.bound_addresses;
        // Being bound ahead of this (first) sync: taken as bound, answered by its writes.
        if let Some(ahead) = &self.binding_ahead {
            bound_addresses.extend(ahead.addresses.iter().copied());
        }
        let fresh = Observed {
            virtual_servers,
            bound_addresses,
        };
        let mut route_report = links.report;
        let diff_started = std::time::Instant::now();

        for (_, key, vs) in desired.virtual_servers() {
            if vs.role == VirtualServerRole::NodePort {
                self.node_port_addresses.insert(key.address);
            }
        }

        // Planned before, or retired and not yet seen deleted: still the proxier's.
        let previously_planned: std::collections::HashSet<VirtualServerKey> = self
            .claimants
            .keys()
            .chain(self.retired.keys())
            .copied()
            .collect();
        self.retired.retain(|key, misses| {
            if fresh.virtual_servers.contains_key(key) {
                *misses = 0;
            } else {
                *misses += 1;
            }
            *misses < RETIRED_LISTINGS
        });
        let drift = if self.synced {
            let link_addresses: BTreeSet<IpAddr> = self
                .kernel
                .bound_addresses
                .union(&fresh.bound_addresses)
                .copied()
                .collect();
            let scope = self.scope(&link_addresses, &previously_planned);
            Some(self.kernel.count_differences(&fresh, |key| scope.owns(key)))
        } else {
            None
        };
        self.kernel = fresh;
        self.suspect.clear();
        self.suspect.extend(still_suspect);
        let kernel = &self.kernel;
        self.drains.retain(|vs, rs| {
            kernel
                .virtual_servers
                .get(vs)
                .is_some_and(|v| v.real_servers.contains_key(rs))
        });

        self.failures
            .retain(|service, _| desired.services.contains_key(service));
        let held: HashSet<ServicePortName> = self
            .failures
            .iter()
            .filter(|(_, failure)| failure.retry_at > now)
            .map(|(service, _)| service.clone())
            .collect();
        let attempted: BTreeSet<ServicePortName> = desired
            .services
            .keys()
            .filter(|service| !held.contains(*service))
            .cloned()
            .collect();

        // Who plans what is rebuilt on a second thread while the diff runs (it finds the
        // winners itself): a start's first sync waits for both, the other CPU idle.
        let (mut claims, mut claimants, mut binders) = (
            std::mem::take(&mut self.claims),
            std::mem::take(&mut self.claimants),
            std::mem::take(&mut self.binders),
        );
        let policy = self.drain_policy(now);
        let scope = self.scope(&self.kernel.bound_addresses, &previously_planned);
        let plan = std::thread::scope(|threads| {
            let rebuild = threads.spawn(|| {
                super::rebuild_claims(desired, &mut claims, &mut claimants, &mut binders);
            });
            let plan = diff::diff(desired, &self.kernel, &scope, &self.drains, &policy, |s| {
                held.contains(s)
            });
            // A panic there is a bug: it goes on here as it would on one thread.
            if let Err(panic) = rebuild.join() {
                std::panic::resume_unwind(panic);
            }
            plan
        });
        (self.claims, self.claimants, self.binders) = (claims, claimants, binders);
        for key in &previously_planned {
            if !self.claimants.contains_key(key) {
                self.retired.entry(*key).or_insert(0);
            }
        }
        self.rejections.clear();
        for rejection in plan.rejected {
            let key = match &rejection {
                Rejection::Conflict { key, .. } => *key,
            };
            self.rejections.entry(key).or_default().push(rejection);
        }
        let diff = diff_started.elapsed();
        let mut report = self
            .apply(
                desired,
                plan.changes,
                plan.bind,
                plan.unbind,
                &attempted,
                now,
                Vec::new(),
            )
            .await;
        // Routes that go only now: the addresses under them were bound by the writes above.
        let link = self.addresses.link_name().to_owned();
        self.remove_unwanted_routes(&link, &links.wanted_routes, &mut route_report)
            .await;
        self.routes_changed = false;
        report.drift = drift;
        report.timings.diff = diff;
        report.writes += route_report.writes;
        report.deletes += route_report.deletes;
        report.failed += route_report.failed;
        report.errors.extend(route_report.errors);
        self.synced = true;
        self.stats.full_syncs += 1;
        self.stats.last_full_sync_drift = drift;
        self.refresh_stats();
        report
    }
}
