//! Follows the node's addresses: rtnetlink address events (IPv4 and IPv6) tell the engine's
//! driver to re-read them, so NodePorts move with the node's interfaces as kube-proxy's do.

use futures::StreamExt;
use netlink_sys::{AsyncSocket, SocketAddr};
use proxier_core::engine::ProxierHandle;
use rtnetlink::constants::{RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR};

/// Starts listening for address changes in the process's network namespace; each one asks
/// `engine` to re-read the node's addresses. Returns `false` (logged) when the socket cannot
/// be opened: full resyncs still pick changes up.
pub fn spawn(engine: ProxierHandle) -> bool {
    let (mut connection, _handle, mut messages) = match rtnetlink::new_connection() {
        Ok(parts) => parts,
        Err(error) => {
            tracing::warn!(%error, "cannot watch address changes; NodePorts follow them at full resyncs only");
            return false;
        }
    };
    let groups = SocketAddr::new(0, RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR);
    if let Err(error) = connection.socket_mut().socket_mut().bind(&groups) {
        tracing::warn!(%error, "cannot join the rtnetlink address groups; NodePorts follow address changes at full resyncs only");
        return false;
    }
    tokio::spawn(connection);
    tokio::spawn(async move {
        while messages.next().await.is_some() {
            engine.node_addresses_changed();
        }
    });
    true
}
