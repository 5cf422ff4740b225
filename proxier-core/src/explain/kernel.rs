//! What [`super::explain`] compares the plan with: the kernel's IPVS table, the dummy link,
//! the proxier's nftables sets, the scheduler modules and the health checks' answers, each
//! read on its own so that one that cannot be read does not hide the others.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use crate::backend::{AddressBackend, IpvsBackend, KernelAddressBackend, KernelIpvsBackend};
use crate::desired::VirtualServerKey;
use crate::kernel_modules::{ModuleFiles, ModuleStatus, module_status, scheduler_module};
use crate::netfilter::NetfilterBackend;
use crate::netfilter::render::{nft_family, parse_set_elements};
use crate::observed::ObservedVirtualServer;

/// One health check's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthAnswer {
    /// HTTP status.
    pub status: u16,
}

/// The elements of one set as read, or why it could not be read.
pub type NetfilterSetRead = Result<BTreeSet<String>, String>;

/// The kernel's side of an explanation. Every read that failed holds its error as text.
#[derive(Debug, Clone)]
pub struct KernelFacts {
    /// The dummy link's name (`kube-ipvs0`).
    pub link: String,
    /// Every tuple virtual server with its real servers and connection counts.
    pub virtual_servers: Result<BTreeMap<VirtualServerKey, ObservedVirtualServer>, String>,
    /// Addresses bound on the dummy link.
    pub link_addresses: Result<BTreeSet<IpAddr>, String>,
    /// Local routes through the dummy link (Service CIDRs taken whole).
    pub local_routes: Result<BTreeSet<IpNet>, String>,
    /// The proxier's nftables tables that hold the Service's elements, missing from the
    /// kernel (each as `family name`, `ip ipvs-proxier`); or why the tables could not be
    /// listed.
    pub missing_tables: Result<BTreeSet<String>, String>,
    /// Why the running kernel refuses the proxier's tables as the node's `nft` writes them
    /// (a start stops on it: [`crate::engine::EngineError::NetfilterRefused`]); `None` when
    /// it takes them or was not asked.
    pub netfilter_refused: Option<String>,
    /// Sets of the proxier's tables, by (`ip`/`ip6`, set name); sets of a missing table are
    /// not read.
    pub netfilter_sets: BTreeMap<(String, String), NetfilterSetRead>,
    /// What the module files say of each scheduler asked about, by scheduler name.
    pub scheduler_modules: BTreeMap<String, ModuleStatus>,
    /// Each health-check node port probed, with its answer.
    pub health_checks: BTreeMap<u16, Result<HealthAnswer, String>>,
}

/// What [`read`] looks at.
#[derive(Debug, Clone)]
pub struct KernelQuery {
    /// The dummy link.
    pub link: String,
    /// The proxier's nftables table name (`ipvs-proxier`).
    pub table_name: String,
    /// Sets to read, as (`ip`/`ip6`, set name).
    pub sets: BTreeSet<(String, String)>,
    /// Schedulers whose modules to look up.
    pub schedulers: BTreeSet<String>,
    /// Where the module facts are read from.
    pub module_files: ModuleFiles,
    /// Health-check node ports to probe (the caller's job: [`read`] does not).
    pub health_check_ports: BTreeSet<u16>,
}

impl KernelQuery {
    /// What to read to explain `name`: the sets its plan puts elements in, the schedulers
    /// of its virtual servers, its health check's node port.
    pub fn for_service(
        picture: super::EnginePicture<'_>,
        name: &crate::model::ServiceName,
        link: impl Into<String>,
        table_name: impl Into<String>,
        module_files: ModuleFiles,
    ) -> Self {
        let mut query = KernelQuery {
            link: link.into(),
            table_name: table_name.into(),
            sets: BTreeSet::new(),
            schedulers: BTreeSet::new(),
            module_files,
            health_check_ports: BTreeSet::new(),
        };
        if let Some(service) = picture.state.service(name) {
            let plan = crate::planner::Planner::new(picture.node, picture.config)
                .plan_service(picture.state, service);
            query.sets = sets_of(&plan.netfilter);
            query.schedulers = plan
                .ports
                .values()
                .flat_map(|port| port.virtual_servers.iter())
                .map(|(_, vs)| vs.scheduler.name().to_owned())
                .collect();
            query.health_check_ports = plan.health_check.map(|c| c.node_port).into_iter().collect();
        }
        query
    }
}

/// Reads what `query` asks of the kernel, each part on its own (the health checks are the
/// caller's: they need an HTTP client). Needs CAP_NET_ADMIN for IPVS and nftables.
pub async fn read<N: NetfilterBackend>(query: &KernelQuery, netfilter: &N) -> KernelFacts {
    let virtual_servers = match KernelIpvsBackend::connect().await {
        Ok(mut ipvs) => ipvs.list_virtual_servers().await.map_err(|e| e.to_string()),
        Err(error) => Err(error.to_string()),
    };
    let (link_addresses, local_routes) = match KernelAddressBackend::connect(query.link.clone()) {
        Ok(mut link) => (
            link.list_addresses().await.map_err(|e| e.to_string()),
            link.list_local_routes().await.map_err(|e| e.to_string()),
        ),
        Err(error) => (Err(error.to_string()), Err(error.to_string())),
    };
    let tables = match netfilter.list_tables() {
        Some(listing) => listing.await.map_err(|e| e.to_string()),
        None => Err("this netfilter backend cannot list tables".to_owned()),
    };
    let missing_tables = tables.as_ref().map_err(Clone::clone).map(|tables| {
        query
            .sets
            .iter()
            .map(|(family, _)| format!("{family} {}", query.table_name))
            .filter(|table| !tables.contains(table))
            .collect::<BTreeSet<String>>()
    });
    let mut netfilter_sets = BTreeMap::new();
    for (family, set) in &query.sets {
        let table = format!("{family} {}", query.table_name);
        if missing_tables
            .as_ref()
            .is_ok_and(|missing| missing.contains(&table))
        {
            continue; // its absence is the finding
        }
        let read = match netfilter.list_set(&table, set) {
            Some(listing) => listing
                .await
                .map(|text| parse_set_elements(&text))
                .map_err(|e| e.to_string()),
            None => Err("this netfilter backend cannot list sets".to_owned()),
        };
        netfilter_sets.insert((family.clone(), set.clone()), read);
    }
    let scheduler_modules = query
        .schedulers
        .iter()
        .map(|name| {
            let status = module_status(&query.module_files, &scheduler_module(name));
            (name.clone(), status)
        })
        .collect();
    KernelFacts {
        link: query.link.clone(),
        virtual_servers,
        link_addresses,
        local_routes,
        missing_tables,
        netfilter_refused: None,
        netfilter_sets,
        scheduler_modules,
        health_checks: BTreeMap::new(),
    }
}

/// The (`ip`/`ip6`, set) pairs [`super::explain`] looks for a Service's elements in.
pub fn sets_of(plan: &crate::desired::netfilter::NetfilterPlan) -> BTreeSet<(String, String)> {
    crate::netfilter::render::set_elements(plan)
        .into_iter()
        .map(|(family, set, _)| (nft_family(family).to_owned(), set.to_owned()))
        .collect()
}
