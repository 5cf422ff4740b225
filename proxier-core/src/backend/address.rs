//! The kernel address backend: the dummy link (`kube-ipvs0`) and the service
//! addresses bound on it, over rtnetlink.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::future::{BoxFuture, FutureExt};
use futures::{StreamExt, TryStreamExt};
use ipnet::IpNet;
use netlink_packet_route::route::{RouteMessage, RouteProtocol, RouteScope, RouteType};
use rtnetlink::{AddressMessageBuilder, Handle, LinkDummy, LinkUnspec, RouteMessageBuilder};

use super::link_dump;
use super::{AddressBackend, AddressChanges, BackendError, LinkRead, PendingBind, PendingLinkRead};

/// Maps an rtnetlink error to a [`BackendError`] by its errno.
fn map_error(error: rtnetlink::Error) -> BackendError {
    if let rtnetlink::Error::NetlinkError(message) = &error {
        return errno_error(-message.raw_code(), error.to_string());
    }
    BackendError::Other(error.to_string())
}

/// A kernel refusal (`errno`, described by `detail`) as the backend reports it.
fn errno_error(errno: i32, detail: String) -> BackendError {
    match errno {
        libc::EEXIST => BackendError::Exists,
        libc::ENODEV | libc::ENOENT | libc::ESRCH | libc::EADDRNOTAVAIL => BackendError::NotFound,
        libc::EPERM | libc::EACCES => BackendError::Permission,
        libc::EOPNOTSUPP | libc::EAFNOSUPPORT => BackendError::Unavailable(detail),
        _ => BackendError::Other(detail),
    }
}

/// An error of a read on a [`link_dump`] socket (a kernel refusal carries its errno).
fn io_error(error: std::io::Error) -> BackendError {
    match error.raw_os_error() {
        Some(errno) => errno_error(errno, error.to_string()),
        None => BackendError::Other(error.to_string()),
    }
}

fn host_prefix(address: IpAddr) -> u8 {
    match address {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// Follows the node's addresses: calls `on_change` for every rtnetlink address event (IPv4
/// and IPv6, added or removed) of a link other than the dummy link `link`, whose VIPs are
/// not the node's (they change by the thousand at a sync). The driver loop
/// ([`crate::engine::driver::run`]) starts one for a proxier that reads the node's addresses
/// from the kernel, so NodePorts move with the node's interfaces as kube-proxy's do. Listens in the caller's network namespace on a task
/// of the current tokio runtime until the process ends; fails when the socket cannot be
/// opened or cannot join the address groups.
pub fn watch_node_addresses(
    link: impl Into<String>,
    on_change: impl Fn() + Send + 'static,
) -> Result<(), BackendError> {
    use netlink_packet_core::NetlinkPayload;
    use netlink_packet_route::RouteNetlinkMessage;
    use netlink_sys::{AsyncSocket, SocketAddr};
    use rtnetlink::constants::{RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR};

    let link = link.into();
    let (mut connection, handle, mut messages) = rtnetlink::new_connection()
        .map_err(|err| BackendError::Other(format!("opening rtnetlink socket: {err}")))?;
    let groups = SocketAddr::new(0, RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR);
    connection
        .socket_mut()
        .socket_mut()
        .bind(&groups)
        .map_err(|err| {
            BackendError::Other(format!("joining the rtnetlink address groups: {err}"))
        })?;
    tokio::spawn(connection);
    tokio::spawn(async move {
        let mut dummy: Option<u32> = None;
        while let Some((message, _)) = messages.next().await {
            let index = match &message.payload {
                NetlinkPayload::InnerMessage(
                    RouteNetlinkMessage::NewAddress(address)
                    | RouteNetlinkMessage::DelAddress(address),
                ) => address.header.index,
                // The socket's buffer overflowed (thousands of ClusterIPs bound or unbound at
                // once): events were dropped, a node address change among them perhaps, so
                // the caller reads the addresses again.
                NetlinkPayload::Overrun(_) => {
                    on_change();
                    continue;
                }
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
                on_change();
            }
        }
    });
    Ok(())
}

/// The dummy link and its addresses in the network namespace the backend was
/// created in (rtnetlink sockets belong to the namespace of the thread that opens them).
#[derive(Debug, Clone)]
pub struct KernelAddressBackend {
    handle: Handle,
    link: String,
    /// The link's index as last looked up (refreshed by `ensure_link` and when absent).
    index: Option<u32>,
}

impl KernelAddressBackend {
    /// Opens an rtnetlink connection and spawns its driver on the current tokio runtime.
    ///
    /// Must be called from within a tokio runtime.
    pub fn connect(link: impl Into<String>) -> Result<Self, BackendError> {
        let (connection, handle, _) = rtnetlink::new_connection()
            .map_err(|err| BackendError::Other(format!("opening rtnetlink socket: {err}")))?;
        tokio::spawn(connection);
        Ok(KernelAddressBackend {
            handle,
            link: link.into(),
            index: None,
        })
    }

    /// The link's interface index, `None` when it does not exist.
    async fn link_index(&self) -> Result<Option<u32>, BackendError> {
        link_index(&self.handle, &self.link).await
    }

    async fn read_node_addresses(&self) -> Result<BTreeSet<IpAddr>, BackendError> {
        let link = self.link.clone();
        on_link_socket(move |socket| {
            let dummy = socket.link_index(&link)?;
            socket.node_addresses(dummy)
        })
        .await
    }

    /// Sends one request per address on the dummy link (the binds of `bind`, then the
    /// removals of `unbind`), up to [`PIPELINE_DEPTH`] in flight on one socket; one result
    /// per address of each, in order.
    ///
    /// The requests go over a connection of their own, driven in the same task as they are
    /// (not spawned): every answer then wakes the task that is already running instead of a
    /// task on another thread. Measured in the VM, 2,000 binds from a multi-thread runtime
    /// took 2.6 times as long over a spawned connection as on a current-thread runtime. The
    /// socket is opened in the calling thread's network namespace, as [`Self::connect`]'s.
    async fn pipelined(&mut self, bind: &[IpAddr], unbind: &[IpAddr]) -> AddressChanges {
        let total = bind.len() + unbind.len();
        if total == 0 {
            return (Vec::new(), Vec::new());
        }
        let split = |mut results: Vec<Result<(), BackendError>>| {
            let unbound = results.split_off(bind.len());
            (results, unbound)
        };
        let index = match self.require_index().await {
            Ok(index) => index,
            Err(error) => return split(vec![Err(error); total]),
        };
        let (connection, handle, _) = match rtnetlink::new_connection() {
            Ok(parts) => parts,
            Err(err) => {
                let error = BackendError::Other(format!("opening rtnetlink socket: {err}"));
                return split(vec![Err(error); total]);
            }
        };
        // The binds first, then the removals, in one stream: the kernel answers them in the
        // order they were sent.
        let mut requests: Vec<(IpAddr, bool)> = Vec::with_capacity(total);
        requests.extend(bind.iter().map(|&address| (address, true)));
        requests.extend(unbind.iter().map(|&address| (address, false)));
        let requests = futures::stream::iter(requests)
            .map(|(address, add)| {
                let sent: BoxFuture<'_, Result<(), rtnetlink::Error>> = if add {
                    handle
                        .address()
                        .add(index, address, host_prefix(address))
                        .execute()
                        .boxed()
                } else {
                    handle
                        .address()
                        .del(host_address_message(index, address))
                        .execute()
                        .boxed()
                };
                async move { sent.await.map_err(map_error) }
            })
            .buffered(PIPELINE_DEPTH)
            .collect::<Vec<Result<(), BackendError>>>();
        let results = tokio::select! {
            results = requests => results,
            () = connection => {
                let error = BackendError::Other("the rtnetlink connection ended".into());
                vec![Err(error); total]
            }
        };
        if results.contains(&Err(BackendError::NotFound)) {
            // The link went away behind our back: look its index up again next time.
            self.index = None;
        }
        split(results)
    }

    async fn require_index(&mut self) -> Result<u32, BackendError> {
        if let Some(index) = self.index {
            return Ok(index);
        }
        let index = self.link_index().await?.ok_or(BackendError::NotFound)?;
        self.index = Some(index);
        Ok(index)
    }
}

impl AddressBackend for KernelAddressBackend {
    fn link_name(&self) -> &str {
        &self.link
    }

    async fn node_addresses(&mut self) -> Result<BTreeSet<IpAddr>, BackendError> {
        self.read_node_addresses().await
    }

    async fn delete_link(&mut self) -> Result<bool, BackendError> {
        self.index = None;
        let Some(index) = self.link_index().await? else {
            return Ok(false);
        };
        match self
            .handle
            .link()
            .del(index)
            .execute()
            .await
            .map_err(map_error)
        {
            Ok(()) => Ok(true),
            Err(BackendError::NotFound) => Ok(false),
            Err(other) => Err(other),
        }
    }

    async fn ensure_link(&mut self) -> Result<(), BackendError> {
        self.index = None;
        let index = match self.link_index().await? {
            Some(index) => index,
            None => {
                match self
                    .handle
                    .link()
                    .add(LinkDummy::new(&self.link).build())
                    .execute()
                    .await
                    .map_err(map_error)
                {
                    Ok(()) | Err(BackendError::Exists) => {}
                    Err(other) => return Err(other),
                }
                tracing::info!(link = %self.link, "created dummy link");
                self.require_index().await?
            }
        };
        self.index = Some(index);
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(index).up().build())
            .execute()
            .await
            .map_err(map_error)
    }

    async fn list_addresses(&mut self) -> Result<BTreeSet<IpAddr>, BackendError> {
        self.index = self.link_index().await?;
        match self.index {
            Some(index) => on_link_socket(move |socket| socket.link_addresses(index)).await,
            None => Ok(BTreeSet::new()),
        }
    }

    /// On a socket of its own whose address dump the kernel filters by link, closed at the
    /// first address: the kernel stops the dump there, instead of sending a link full of
    /// ClusterIPs (10,000 at a restart) to be decoded and dropped
    /// (`backend/link_dump.rs`). Blocking, for one short exchange.
    async fn holds_addresses(&mut self) -> Result<bool, BackendError> {
        link_dump::holds_address(&self.link).map_err(io_error)
    }

    async fn add_address(&mut self, address: IpAddr) -> Result<(), BackendError> {
        let index = self.require_index().await?;
        let result = self
            .handle
            .address()
            .add(index, address, host_prefix(address))
            .execute()
            .await
            .map_err(map_error);
        if result == Err(BackendError::NotFound) {
            self.index = None;
        }
        result
    }

    async fn add_addresses(&mut self, addresses: &[IpAddr]) -> Vec<Result<(), BackendError>> {
        self.pipelined(addresses, &[]).await.0
    }

    async fn remove_addresses(&mut self, addresses: &[IpAddr]) -> Vec<Result<(), BackendError>> {
        self.pipelined(&[], addresses).await.1
    }

    async fn change_addresses(&mut self, bind: &[IpAddr], unbind: &[IpAddr]) -> AddressChanges {
        self.pipelined(bind, unbind).await
    }

    async fn remove_address(&mut self, address: IpAddr) -> Result<(), BackendError> {
        let index = self.require_index().await?;
        self.handle
            .address()
            .del(host_address_message(index, address))
            .execute()
            .await
            .map_err(map_error)
    }

    async fn list_local_routes(&mut self) -> Result<BTreeSet<IpNet>, BackendError> {
        self.index = self.link_index().await?;
        match self.index {
            Some(index) => on_link_socket(move |socket| socket.local_routes(index)).await,
            None => Ok(BTreeSet::new()),
        }
    }

    /// Binds on a connection of its own, opened here (in this thread's network namespace),
    /// pipelined as [`AddressBackend::add_addresses`]. `None` when the socket cannot be
    /// opened.
    fn bind_detached(&self, addresses: Vec<IpAddr>) -> Option<PendingBind> {
        let mut backend = match KernelAddressBackend::connect(self.link.clone()) {
            Ok(backend) => backend,
            Err(error) => {
                tracing::warn!(%error, "cannot open an rtnetlink socket to bind addresses ahead");
                return None;
            }
        };
        Some(Box::pin(
            async move { backend.add_addresses(&addresses).await },
        ))
    }

    /// Reads on a blocking socket of its own (`backend/link_dump.rs`), opened here (in this thread's
    /// network namespace, as [`KernelAddressBackend::connect`]'s) and read on a blocking
    /// thread, so its dumps neither interleave with the incremental syncs' writes on the
    /// backend's socket nor hold a runtime worker. `None` when the socket cannot be opened:
    /// the full sync then reads at its end, on the backend's socket.
    fn read_link(&self) -> Option<PendingLinkRead> {
        let socket = match link_dump::LinkSocket::open() {
            Ok(socket) => socket,
            Err(error) => {
                tracing::warn!(%error, "cannot open an rtnetlink socket for the full sync's read");
                return None;
            }
        };
        let link = self.link.clone();
        Some(Box::pin(read_blocking(socket, move |socket| {
            let dummy = socket.link_index(&link)?;
            let (addresses, routes) = match dummy {
                Some(index) => (socket.link_addresses(index)?, socket.local_routes(index)?),
                None => (BTreeSet::new(), BTreeSet::new()),
            };
            Ok(LinkRead {
                addresses,
                routes,
                node_addresses: socket.node_addresses(dummy)?,
            })
        })))
    }

    async fn add_local_route(&mut self, net: IpNet) -> Result<(), BackendError> {
        let index = self.require_index().await?;
        let result = self
            .handle
            .route()
            .add(local_route_message(index, net))
            .execute()
            .await
            .map_err(map_error);
        if result == Err(BackendError::NotFound) {
            self.index = None;
        }
        result
    }

    async fn remove_local_route(&mut self, net: IpNet) -> Result<(), BackendError> {
        let index = self.require_index().await?;
        // As `ip route del`: any protocol, any scope.
        let mut message = local_route_message(index, net);
        message.header.protocol = RouteProtocol::Unspec;
        message.header.scope = RouteScope::NoWhere;
        let result = self
            .handle
            .route()
            .del(message)
            .execute()
            .await
            .map_err(map_error);
        if result == Err(BackendError::NotFound) {
            // Also what a stale index gets: look it up again next time.
            self.index = None;
        }
        result
    }
}

/// The interface index of link `link`, `None` when it does not exist.
async fn link_index(handle: &Handle, link: &str) -> Result<Option<u32>, BackendError> {
    let mut links = handle.link().get().match_name(link.to_owned()).execute();
    match links.try_next().await {
        Ok(Some(link)) => Ok(Some(link.header.index)),
        Ok(None) => Ok(None),
        Err(error) => match map_error(error) {
            BackendError::NotFound => Ok(None),
            other => Err(other),
        },
    }
}

/// Runs `read` on a [`link_dump::LinkSocket`] opened here, in the calling thread's network
/// namespace, on a blocking thread (a dump of the dummy link's 10,000 addresses is
/// milliseconds of blocking reads).
async fn on_link_socket<T: Send + 'static>(
    read: impl FnOnce(&mut link_dump::LinkSocket) -> std::io::Result<T> + Send + 'static,
) -> Result<T, BackendError> {
    let socket = link_dump::LinkSocket::open().map_err(io_error)?;
    read_blocking(socket, read).await
}

/// Runs `read` on `socket` on a blocking thread.
async fn read_blocking<T: Send + 'static>(
    mut socket: link_dump::LinkSocket,
    read: impl FnOnce(&mut link_dump::LinkSocket) -> std::io::Result<T> + Send + 'static,
) -> Result<T, BackendError> {
    match tokio::task::spawn_blocking(move || read(&mut socket)).await {
        Ok(read) => read.map_err(io_error),
        Err(error) => Err(BackendError::Other(format!(
            "the link read failed: {error}"
        ))),
    }
}

/// The kernel's `local` routing table (`RT_TABLE_LOCAL`).
const LOCAL_TABLE: u8 = 255;

/// `local <net> dev <index> table local proto static scope host`.
fn local_route_message(index: u32, net: IpNet) -> RouteMessage {
    fn local<T>(builder: RouteMessageBuilder<T>, index: u32) -> RouteMessage {
        builder
            .output_interface(index)
            .table_id(u32::from(LOCAL_TABLE))
            .kind(RouteType::Local)
            .scope(RouteScope::Host)
            .protocol(RouteProtocol::Static)
            .build()
    }
    match net.trunc() {
        IpNet::V4(v4) => local(
            RouteMessageBuilder::<Ipv4Addr>::new().destination_prefix(v4.addr(), v4.prefix_len()),
            index,
        ),
        IpNet::V6(v6) => local(
            RouteMessageBuilder::<Ipv6Addr>::new().destination_prefix(v6.addr(), v6.prefix_len()),
            index,
        ),
    }
}

/// Requests in flight at once on the rtnetlink socket when binding or removing many
/// addresses (the kernel answers each in order; the socket buffer bounds the useful depth).
const PIPELINE_DEPTH: usize = 256;

/// The message naming `address` as a host address (/32 or /128) on link `index`.
fn host_address_message(
    index: u32,
    address: IpAddr,
) -> netlink_packet_route::address::AddressMessage {
    match address {
        IpAddr::V4(v4) => AddressMessageBuilder::<std::net::Ipv4Addr>::new()
            .index(index)
            .address(v4, 32)
            .build(),
        IpAddr::V6(v6) => AddressMessageBuilder::<std::net::Ipv6Addr>::new()
            .index(index)
            .address(v6, 128)
            .build(),
    }
}
