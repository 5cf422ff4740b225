//! Follows the node's addresses: rtnetlink address events (IPv4 and IPv6) tell the engine's
//! driver to re-read them, so NodePorts move with the node's interfaces as kube-proxy's do.
//! Events of the proxier's own dummy link (the VIPs it binds, thousands at a time) are
//! ignored: those addresses are not the node's.

use futures::{StreamExt, TryStreamExt};
use netlink_packet_core::NetlinkPayload;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{AsyncSocket, SocketAddr};
use proxier_core::engine::ProxierHandle;
use rtnetlink::constants::{RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR};

/// Starts listening for address changes in the process's network namespace; each change of
/// an address outside the dummy link `link` asks `engine` to re-read the node's addresses
/// (the driver folds a burst of them into one read). Returns `false` (logged) when the socket
/// cannot be opened: full resyncs still pick changes up.
pub fn spawn(engine: ProxierHandle, link: String) -> bool {
    let (mut connection, handle, mut messages) = match rtnetlink::new_connection() {
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
        let mut dummy: Option<u32> = None;
        while let Some((message, _)) = messages.next().await {
            let index = match &message.payload {
                NetlinkPayload::InnerMessage(
                    RouteNetlinkMessage::NewAddress(address)
                    | RouteNetlinkMessage::DelAddress(address),
                ) => address.header.index,
                _ => continue,
            };
            if dummy.is_none() {
                // Looked up when first needed (the engine creates the link at its first sync).
                dummy = handle
                    .link()
                    .get()
                    .match_name(link.clone())
                    .execute()
                    .try_next()
                    .await
                    .ok()
                    .flatten()
                    .map(|l| l.header.index);
            }
            if Some(index) != dummy {
                engine.node_addresses_changed();
            }
        }
    });
    true
}
