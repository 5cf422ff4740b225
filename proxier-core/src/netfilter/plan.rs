//! The netfilter intent: the contents of one nftables table per address family.
//!
//! Every set stands where kube-proxy's IPVS mode keeps an ipset; the rules that use them
//! are fixed and live in [`super::render`]. The planner decides the elements in the pass
//! that plans a Service's IPVS virtual servers ([`Planner::plan_service`]), so both follow
//! the same families, node-owned addresses and endpoints; the functions here are that pass
//! seen from netfilter.

pub use crate::desired::netfilter::{
    AddrPort, ClusterIpMasquerade, FamilyPlan, NetfilterPlan, ProtoPort, SourceRange,
};
pub use crate::planner::netfilter::empty_plan;

use crate::model::{Config, NodeContext, Service};
use crate::planner::Planner;
use crate::state::ClusterState;

/// Plans the netfilter tables of the node.
pub fn plan(state: &ClusterState, node: &NodeContext, config: &Config) -> NetfilterPlan {
    Planner::new(node, config).plan_netfilter(state)
}

/// The set elements one Service contributes (an [`empty_plan`] holding only them): the
/// incremental path re-plans only the Services that changed and merges the results
/// ([`super::NetfilterTracker`]).
pub fn plan_of_service(
    state: &ClusterState,
    service: &Service,
    node: &NodeContext,
    config: &Config,
) -> NetfilterPlan {
    Planner::new(node, config)
        .plan_service(state, service)
        .netfilter
}

#[cfg(test)]
mod tests;
