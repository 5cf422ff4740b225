//! The kernel address backend: the dummy link (`kube-ipvs0`) and the service
//! addresses bound on it, over rtnetlink.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::{StreamExt, TryStreamExt};
use ipnet::IpNet;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use rtnetlink::{AddressMessageBuilder, Handle, LinkDummy, LinkUnspec, RouteMessageBuilder};

use super::{AddressBackend, BackendError, LinkRead, PendingBind, PendingLinkRead};

/// Maps an rtnetlink error to a [`BackendError`] by its errno.
fn map_error(error: rtnetlink::Error) -> BackendError {
    if let rtnetlink::Error::NetlinkError(message) = &error {
        let errno = -message.raw_code();
        return match errno {
            libc::EEXIST => BackendError::Exists,
            libc::ENODEV | libc::ENOENT | libc::ESRCH | libc::EADDRNOTAVAIL => {
                BackendError::NotFound
            }
            libc::EPERM | libc::EACCES => BackendError::Permission,
            libc::EOPNOTSUPP | libc::EAFNOSUPPORT => BackendError::Unavailable(error.to_string()),
            _ => BackendError::Other(error.to_string()),
        };
    }
    BackendError::Other(error.to_string())
}

/// The node's own address in an address message: `IFA_LOCAL` when the message has one, else
/// `IFA_ADDRESS`. On a point-to-point link (`ip addr add 10.9.0.1 peer 10.9.0.2`)
/// `IFA_ADDRESS` is the peer's; elsewhere the two are equal (and IPv6 sends only
/// `IFA_ADDRESS`). Go's `net.Interface.Addrs`, which kube-proxy reads, makes the same choice.
fn local_address(message: &netlink_packet_route::address::AddressMessage) -> Option<IpAddr> {
    let mut address = None;
    for attribute in &message.attributes {
        match attribute {
            AddressAttribute::Local(local) => return Some(*local),
            AddressAttribute::Address(a) => address = Some(*a),
            _ => {}
        }
    }
    address
}

/// Link-local addresses are the kernel's own (an IPv6 one appears when the link goes
/// up), never service addresses: they are not reported, so never unbound.
fn is_link_local(address: &IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
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
        read_node_addresses(&self.link).await
    }

    /// Sends one request per address on the dummy link, up to [`PIPELINE_DEPTH`] in flight
    /// on one socket; one result per address, in order.
    ///
    /// The requests go over a connection of their own, driven in the same task as they are
    /// (not spawned): every answer then wakes the task that is already running instead of a
    /// task on another thread. Measured in the VM, 2,000 binds from a multi-thread runtime
    /// took 2.6 times as long over a spawned connection as on a current-thread runtime. The
    /// socket is opened in the calling thread's network namespace, as [`Self::connect`]'s.
    async fn pipelined<F, Fut>(
        &mut self,
        addresses: &[IpAddr],
        request: F,
    ) -> Vec<Result<(), BackendError>>
    where
        F: Fn(&Handle, u32, IpAddr) -> Fut,
        Fut: Future<Output = Result<(), rtnetlink::Error>>,
    {
        if addresses.is_empty() {
            return Vec::new();
        }
        let index = match self.require_index().await {
            Ok(index) => index,
            Err(error) => return vec![Err(error); addresses.len()],
        };
        let (connection, handle, _) = match rtnetlink::new_connection() {
            Ok(parts) => parts,
            Err(err) => {
                let error = BackendError::Other(format!("opening rtnetlink socket: {err}"));
                return vec![Err(error); addresses.len()];
            }
        };
        let requests = futures::stream::iter(addresses.iter().copied())
            .map(|address| {
                let sent = request(&handle, index, address);
                async move { sent.await.map_err(map_error) }
            })
            .buffered(PIPELINE_DEPTH)
            .collect::<Vec<Result<(), BackendError>>>();
        let results = tokio::select! {
            results = requests => results,
            () = connection => {
                let error = BackendError::Other("the rtnetlink connection ended".into());
                vec![Err(error); addresses.len()]
            }
        };
        if results.contains(&Err(BackendError::NotFound)) {
            // The link went away behind our back: look its index up again next time.
            self.index = None;
        }
        results
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
            Some(index) => link_addresses(&self.handle, index).await,
            None => Ok(BTreeSet::new()),
        }
    }

    /// On a connection of its own whose address dump the kernel filters by link, closed at
    /// the first address: the kernel stops the dump there, instead of sending a link full of
    /// ClusterIPs (10,000 at a restart) to be decoded and dropped.
    async fn holds_addresses(&mut self) -> Result<bool, BackendError> {
        let (connection, handle, _) = filtering_connection()?;
        let link = self.link.clone();
        driven(connection, async move {
            let Some(index) = link_index(&handle, &link).await? else {
                return Ok(false);
            };
            let mut messages = addresses_of_link(&handle, index).execute();
            while let Some(message) = messages.try_next().await.map_err(map_error)? {
                if bound_address(&message, index).is_some() {
                    return Ok(true);
                }
            }
            Ok(false)
        })
        .await
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
        self.pipelined(addresses, |handle, index, address| {
            handle
                .address()
                .add(index, address, host_prefix(address))
                .execute()
        })
        .await
    }

    async fn remove_addresses(&mut self, addresses: &[IpAddr]) -> Vec<Result<(), BackendError>> {
        self.pipelined(addresses, |handle, index, address| {
            handle
                .address()
                .del(host_address_message(index, address))
                .execute()
        })
        .await
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
            Some(index) => local_routes(&self.handle, index).await,
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

    /// Reads on a socket of its own, opened here (in this thread's network namespace, as
    /// [`KernelAddressBackend::connect`]) and driven by the read itself, so its dumps do not
    /// interleave with the incremental syncs' writes on the backend's socket. `None` when
    /// the socket cannot be opened: the full sync then reads at its end, on the backend's
    /// socket.
    fn read_link(&self) -> Option<PendingLinkRead> {
        let (connection, handle, _) = match rtnetlink::new_connection() {
            Ok(opened) => opened,
            Err(error) => {
                tracing::warn!(%error, "cannot open an rtnetlink socket for the full sync's read");
                return None;
            }
        };
        // The link's and the node's addresses on a socket whose dumps the kernel filters (the
        // routes' dump is left unfiltered on the other: strict checking reads its header as
        // filters).
        let (filtering, filtered, strict) = match filtering_connection() {
            Ok(opened) => opened,
            Err(error) => {
                tracing::warn!(%error, "cannot open an rtnetlink socket for the full sync's read");
                return None;
            }
        };
        let link = self.link.clone();
        Some(Box::pin(async move {
            let read = async {
                let dummy = link_index(&handle, &link).await?;
                let (addresses, routes) = match dummy {
                    Some(index) => (
                        link_addresses(&filtered, index).await?,
                        local_routes(&handle, index).await?,
                    ),
                    None => (BTreeSet::new(), BTreeSet::new()),
                };
                Ok(LinkRead {
                    addresses,
                    routes,
                    node_addresses: node_addresses_on(&filtered, strict, dummy).await?,
                })
            };
            driven(connection, driven(filtering, read)).await
        }))
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

/// An rtnetlink connection of its own whose dumps the kernel filters by the request's
/// header (strict checking, `NETLINK_GET_STRICT_CHK`, Linux 5.0 and later): an address dump
/// asking for one link index then carries that link's addresses alone. The dummy link holds
/// one address per ClusterIP (10,000 at 10,000 Services), which every unfiltered address dump
/// sends, and the reader decodes, whatever it wants (about 0.2 s in the test VM). The
/// connection is to be driven by the caller, in its own task. Also answers whether strict
/// checking is on (a kernel without it ignores the filter and the reader filters alone).
fn filtering_connection() -> Result<(RtnetlinkConnection, Handle, bool), BackendError> {
    use rtnetlink::sys::AsyncSocket;

    let (mut connection, handle, _) = rtnetlink::new_connection()
        .map_err(|err| BackendError::Other(format!("opening rtnetlink socket: {err}")))?;
    let strict = connection
        .socket_mut()
        .socket_mut()
        .set_netlink_get_strict_chk(true)
        .is_ok();
    Ok((connection, handle, strict))
}

/// An rtnetlink connection as [`rtnetlink::new_connection`] opens it.
type RtnetlinkConnection = rtnetlink::proto::Connection<netlink_packet_route::RouteNetlinkMessage>;

/// Runs `read` beside the connection it uses (driven in the same task), failing when the
/// connection ends first.
async fn driven<T>(
    connection: RtnetlinkConnection,
    read: impl Future<Output = Result<T, BackendError>>,
) -> Result<T, BackendError> {
    tokio::select! {
        read = read => read,
        () = connection => Err(BackendError::Other("the rtnetlink connection ended".to_owned())),
    }
}

/// The node's own addresses: every interface's but `link`'s, loopback and IPv6 link-local,
/// read on a [`filtering_connection`] of their own ([`node_addresses_on`]).
async fn read_node_addresses(link: &str) -> Result<BTreeSet<IpAddr>, BackendError> {
    let (connection, handle, strict) = filtering_connection()?;
    driven(connection, async {
        let dummy = link_index(&handle, link).await?;
        node_addresses_on(&handle, strict, dummy).await
    })
    .await
}

/// The node's own addresses, read link by link on `handle`, a [`filtering_connection`]
/// (`strict`: the kernel filters), so that the addresses of the dummy link (index `dummy`)
/// are neither sent nor decoded; in one dump of every address where the kernel cannot filter.
async fn node_addresses_on(
    handle: &Handle,
    strict: bool,
    dummy: Option<u32>,
) -> Result<BTreeSet<IpAddr>, BackendError> {
    if !strict {
        return node_addresses_of(handle, None, dummy).await;
    }
    let links: Vec<u32> = handle
        .link()
        .get()
        .execute()
        .map_ok(|link| link.header.index)
        .try_collect()
        .await
        .map_err(map_error)?;
    let mut addresses = BTreeSet::new();
    for index in links.into_iter().filter(|index| Some(*index) != dummy) {
        match node_addresses_of(handle, Some(index), dummy).await {
            Ok(found) => addresses.extend(found),
            // The link went away since the links were listed: it has none.
            Err(BackendError::NotFound) => {}
            Err(other) => return Err(other),
        }
    }
    Ok(addresses)
}

/// The node addresses of one address dump: of link `index` (when the kernel filters, that
/// link's alone), or of every link (`None`), the dummy link's (`dummy`) left out.
async fn node_addresses_of(
    handle: &Handle,
    index: Option<u32>,
    dummy: Option<u32>,
) -> Result<BTreeSet<IpAddr>, BackendError> {
    let mut messages = match index {
        Some(index) => addresses_of_link(handle, index),
        None => handle.address().get(),
    }
    .execute();
    let mut addresses = BTreeSet::new();
    while let Some(message) = messages.try_next().await.map_err(map_error)? {
        if Some(message.header.index) == dummy {
            continue;
        }
        // As kube-proxy: IPv4 link-local addresses can serve NodePorts, IPv6
        // link-local ones cannot.
        if let Some(address) = local_address(&message)
            && !matches!(address, IpAddr::V6(v6) if v6.is_unicast_link_local())
            && !address.is_loopback()
        {
            addresses.insert(address);
        }
    }
    Ok(addresses)
}

/// An address dump asking for the addresses of link `index` alone: a
/// [`filtering_connection`] gets only those from the kernel, another socket gets every
/// address and the request skips the other links' as they come.
fn addresses_of_link(handle: &Handle, index: u32) -> rtnetlink::AddressGetRequest {
    let mut request = handle.address().get().set_link_index_filter(index);
    request.message_mut().header.index = index;
    request
}

/// The addresses bound on the link with index `index`, link-local ones left out.
async fn link_addresses(handle: &Handle, index: u32) -> Result<BTreeSet<IpAddr>, BackendError> {
    let mut messages = addresses_of_link(handle, index).execute();
    let mut addresses = BTreeSet::new();
    while let Some(message) = messages.try_next().await.map_err(map_error)? {
        addresses.extend(bound_address(&message, index));
    }
    Ok(addresses)
}

/// The address `message` reports bound on the link with index `index`: none for another
/// link's (a kernel that does not filter dumps sends every link's) or a link-local one.
fn bound_address(
    message: &netlink_packet_route::address::AddressMessage,
    index: u32,
) -> Option<IpAddr> {
    if message.header.index != index {
        return None;
    }
    local_address(message).filter(|address| !is_link_local(address))
}

/// The `local` routes through the link with index `index` but those for its own addresses.
async fn local_routes(handle: &Handle, index: u32) -> Result<BTreeSet<IpNet>, BackendError> {
    let mut routes = BTreeSet::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut request = RouteMessage::default();
        request.header.address_family = family;
        request.header.table = LOCAL_TABLE;
        let mut messages = handle.route().get(request).execute();
        while let Some(message) = messages.try_next().await.map_err(map_error)? {
            routes.extend(own_local_route(&message, index));
        }
    }
    Ok(routes)
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

/// The destination of a dumped route when it is a `local` route of the `local` table
/// through link `index` that the kernel did not make itself (for an address of the link).
fn own_local_route(message: &RouteMessage, index: u32) -> Option<IpNet> {
    let header = &message.header;
    if header.kind != RouteType::Local || header.protocol == RouteProtocol::Kernel {
        return None;
    }
    let mut table = u32::from(header.table);
    let mut oif = None;
    let mut destination = match header.address_family {
        AddressFamily::Inet => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        AddressFamily::Inet6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        _ => return None,
    };
    for attribute in &message.attributes {
        match attribute {
            RouteAttribute::Table(id) => table = *id,
            RouteAttribute::Oif(link) => oif = Some(*link),
            RouteAttribute::Destination(RouteAddress::Inet(v4)) => destination = (*v4).into(),
            RouteAttribute::Destination(RouteAddress::Inet6(v6)) => destination = (*v6).into(),
            _ => {}
        }
    }
    if table != u32::from(LOCAL_TABLE) || oif != Some(index) {
        return None;
    }
    IpNet::new(destination, header.destination_prefix_length).ok()
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
