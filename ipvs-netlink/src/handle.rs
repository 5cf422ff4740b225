//! The async handle.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::stream::{self, BoxStream, StreamExt};
use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_generic::GenlMessage;
use netlink_proto::ConnectionHandle;
use netlink_proto::sys::{AsyncSocket, SocketAddr, TokioSocket, protocols::NETLINK_GENERIC};

use crate::batch::{self, Op};
use crate::destination::{Destination, DestinationEntry, DestinationKey};
use crate::error::{Error, Object, Operation};
use crate::message::{self, IpvsMessage, WireError};
use crate::netns::{self, NetnsTarget};
use crate::service::{Service, ServiceEntry, ServiceKey};
use crate::sync_daemon::{SyncDaemon, SyncState};
use crate::transport::{self, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, RawIpvs, SyncSocket};
use crate::{Info, Timeouts};

type Msg = GenlMessage<RawIpvs>;

/// Most worker threads (each with its own socket) used by [`IpvsHandle::table`].
const MAX_DUMP_WORKERS: usize = 4;

/// Most service dumps [`IpvsHandle::table_verified`] makes before giving up.
pub const MAX_TABLE_ATTEMPTS: u32 = 8;

/// The netlink connection behind an [`IpvsHandle`]: a future that moves requests and
/// replies between the handle and the kernel. Spawn it (or poll it) for the handle's
/// single requests and dumps to make progress; it ends when every handle is dropped.
/// [`batch`](IpvsHandle::batch) and [`table`](IpvsHandle::table) use sockets of their own
/// and do not depend on it.
#[must_use = "the connection does nothing unless it is spawned or polled"]
pub struct IpvsConnection {
    inner: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

impl std::fmt::Debug for IpvsConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpvsConnection").finish_non_exhaustive()
    }
}

impl std::future::Future for IpvsConnection {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        self.inner.as_mut().poll(cx)
    }
}

/// Connects in the caller's network namespace without spawning anything, as rtnetlink's
/// `new_connection` does: returns the connection, which the caller spawns on the runtime
/// of its choice, and the handle. Must be called within a tokio runtime (the socket is a
/// tokio socket).
///
/// ```no_run
/// # async fn example() -> Result<(), ipvs_netlink::Error> {
/// let (connection, ipvs) = ipvs_netlink::new_connection().await?;
/// tokio::spawn(connection);
/// println!("{}", ipvs.info().await?);
/// # Ok(())
/// # }
/// ```
pub async fn new_connection() -> Result<(IpvsConnection, IpvsHandle), Error> {
    IpvsHandle::build(None).await
}

/// [`new_connection`] inside the given network namespace (path or fd), without moving the
/// caller's thread.
pub async fn new_connection_in_netns(
    target: impl Into<NetnsTarget>,
) -> Result<(IpvsConnection, IpvsHandle), Error> {
    let fd = target
        .into()
        .open()
        .map_err(|e| Error::io(Operation::Connect, e))?;
    IpvsHandle::build(Some(Arc::new(fd))).await
}

/// Every service with its destinations, as [`IpvsHandle::table`] returns it.
pub type Table = Vec<(ServiceEntry, Vec<DestinationEntry>)>;

/// A table read by [`IpvsHandle::table_verified`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifiedTable {
    /// Every service with its destinations, sorted by service key.
    pub table: Table,
    /// How many service dumps were made.
    pub attempts: u32,
    /// Whether two service dumps in a row agreed with the earlier ones (brought no key and
    /// no configuration they had not shown). `false` when that did not happen within
    /// [`MAX_TABLE_ATTEMPTS`] dumps, and for a single dump ([`IpvsHandle::table_best_effort`]).
    pub verified: bool,
}

/// An async client of the kernel's IPVS family. Cheap to clone (an `Arc`); every clone
/// shares one netlink connection and may be used from many tasks at once.
///
/// Dumps on the shared connection are serialised (the kernel allows one dump per socket at
/// a time); [`batch`](IpvsHandle::batch) and [`table`](IpvsHandle::table) use dedicated
/// sockets from a small pool, opened in the handle's network namespace.
#[derive(Clone)]
pub struct IpvsHandle {
    inner: Arc<Inner>,
}

struct Inner {
    conn: ConnectionHandle<Msg>,
    family: u16,
    dump_lock: Arc<tokio::sync::Mutex<()>>,
    netns: Option<Arc<OwnedFd>>,
    pool: Mutex<Vec<SyncSocket>>,
}

impl std::fmt::Debug for IpvsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpvsHandle")
            .field("family", &self.inner.family)
            .field("in_netns", &self.inner.netns.is_some())
            .finish()
    }
}

impl IpvsHandle {
    /// Connects in the caller's network namespace and spawns the connection task on the
    /// current tokio runtime (see [`new_connection`] to drive it yourself). Must be called
    /// within a tokio runtime.
    pub async fn new() -> Result<IpvsHandle, Error> {
        let (conn, handle) = Self::build(None).await?;
        tokio::spawn(conn);
        Ok(handle)
    }

    /// Connects inside the given network namespace (path or fd) without moving the
    /// caller's thread.
    pub async fn new_in_netns(target: impl Into<NetnsTarget>) -> Result<IpvsHandle, Error> {
        let fd = target
            .into()
            .open()
            .map_err(|e| Error::io(Operation::Connect, e))?;
        let (conn, handle) = Self::build(Some(Arc::new(fd))).await?;
        tokio::spawn(conn);
        Ok(handle)
    }

    async fn build(netns: Option<Arc<OwnedFd>>) -> Result<(IpvsConnection, IpvsHandle), Error> {
        let rt = tokio::runtime::Handle::current();
        let (sync_socket, family, socket) = netns::run_in(netns.clone(), move || {
            let _guard = rt.enter();
            let mut sync_socket = SyncSocket::open()?;
            let family = sync_socket.resolve_family(message::FAMILY_NAME)?;
            let mut socket = TokioSocket::new(NETLINK_GENERIC)?;
            socket.socket_mut().bind_auto()?;
            transport::tune_rcvbuf(socket.socket_ref());
            Ok((sync_socket, family, socket))
        })
        .await
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EPROTONOSUPPORT) | Some(libc::EAFNOSUPPORT) => Error::IpvsUnavailable {
                reason: format!("generic netlink unavailable: {e}"),
            },
            Some(libc::EPERM) | Some(libc::EACCES) => Error::PermissionDenied {
                op: Operation::Connect,
            },
            _ => Error::io(Operation::Connect, e),
        })?;
        let family = family.ok_or_else(|| Error::IpvsUnavailable {
            reason: "the generic netlink family \"IPVS\" is not registered (ip_vs not loaded?)"
                .into(),
        })?;
        let (mut conn, handle, _unsolicited) =
            netlink_proto::from_socket_with_codec::<Msg, TokioSocket, netlink_proto::NetlinkCodec>(
                socket,
            );
        conn.set_forward_ack(true);
        conn.set_forward_done(true);
        let conn = IpvsConnection {
            inner: Box::pin(conn),
        };
        let handle = IpvsHandle {
            inner: Arc::new(Inner {
                conn: handle,
                family,
                dump_lock: Arc::new(tokio::sync::Mutex::new(())),
                netns,
                pool: Mutex::new(vec![sync_socket]),
            }),
        };
        Ok((conn, handle))
    }

    /// The generic-netlink family id the kernel gave IPVS.
    pub fn family_id(&self) -> u16 {
        self.inner.family
    }

    fn send(
        &self,
        op: Operation,
        msg: IpvsMessage,
        flags: u16,
    ) -> Result<impl futures::Stream<Item = NetlinkMessage<Msg>> + use<>, Error> {
        let mut genl = GenlMessage::from_payload(RawIpvs::from_message(&msg));
        genl.set_resolved_family_id(self.inner.family);
        let mut nl = NetlinkMessage::from(genl);
        nl.header.flags = flags;
        nl.finalize();
        self.inner
            .conn
            .request(nl, SocketAddr::new(0, 0))
            .map_err(|e| Error::io(op, io::Error::other(e.to_string())))
    }

    /// Sends a request that is answered by an ack only.
    async fn ack(&self, op: Operation, object: &Object, msg: IpvsMessage) -> Result<(), Error> {
        let mut replies = self.send(op, msg, NLM_F_REQUEST | NLM_F_ACK)?;
        while let Some(m) = replies.next().await {
            if let NetlinkPayload::Error(e) = m.payload {
                return match e.code {
                    None => Ok(()),
                    Some(code) => Err(Error::from_errno(op, object, code.get().saturating_neg())),
                };
            }
        }
        Err(connection_lost(op))
    }

    /// Sends a request answered by one message, then an ack.
    async fn query(
        &self,
        op: Operation,
        object: &Object,
        msg: IpvsMessage,
    ) -> Result<IpvsMessage, Error> {
        let mut replies = self.send(op, msg, NLM_F_REQUEST | NLM_F_ACK)?;
        let mut answer = None;
        while let Some(m) = replies.next().await {
            match m.payload {
                NetlinkPayload::InnerMessage(g) if answer.is_none() => {
                    answer = Some(g.payload.parse())
                }
                NetlinkPayload::Error(e) => {
                    return match (e.code, answer) {
                        (Some(code), _) => {
                            Err(Error::from_errno(op, object, code.get().saturating_neg()))
                        }
                        (None, Some(a)) => a.map_err(|source| Error::Decode { op, source }),
                        (None, None) => Err(Error::Decode {
                            op,
                            source: WireError::new("acknowledged without an answer"),
                        }),
                    };
                }
                _ => {}
            }
        }
        Err(connection_lost(op))
    }

    /// A dump on the shared connection, decoded item by item.
    fn dump<T, F>(
        &self,
        op: Operation,
        object: Object,
        msg: IpvsMessage,
        decode: F,
    ) -> BoxStream<'static, Result<T, Error>>
    where
        T: Send + 'static,
        F: Fn(&IpvsMessage) -> Result<T, WireError> + Send + Sync + 'static,
    {
        let this = self.clone();
        stream::once(async move {
            let guard = this.inner.dump_lock.clone().lock_owned().await;
            match this.send(op, msg, NLM_F_REQUEST | NLM_F_DUMP) {
                Err(e) => stream::iter(vec![Err(e)]).boxed(),
                Ok(replies) => {
                    let mut finished = false;
                    let guard = Some(guard);
                    replies
                        .map(Some)
                        .chain(stream::iter([None]))
                        .filter_map(move |m| {
                            let _held = &guard;
                            let out = match m {
                                _ if finished => None,
                                None => Some(Err(connection_lost(op))),
                                Some(m) => match m.payload {
                                    NetlinkPayload::InnerMessage(g) => Some(
                                        g.payload
                                            .parse()
                                            .and_then(|m| decode(&m))
                                            .map_err(|source| Error::Decode { op, source }),
                                    ),
                                    NetlinkPayload::Done(_) => {
                                        finished = true;
                                        None
                                    }
                                    NetlinkPayload::Error(e) => {
                                        finished = true;
                                        e.code.map(|code| {
                                            Err(Error::from_errno(
                                                op,
                                                &object,
                                                code.get().saturating_neg(),
                                            ))
                                        })
                                    }
                                    NetlinkPayload::Overrun(_) => {
                                        finished = true;
                                        Some(Err(Error::io(
                                            op,
                                            io::Error::from_raw_os_error(libc::ENOBUFS),
                                        )))
                                    }
                                    _ => None,
                                },
                            };
                            futures::future::ready(out)
                        })
                        .boxed()
                }
            }
        })
        .flatten()
        .boxed()
    }

    /// Escape hatch: runs any dump request on the shared connection and returns the reply
    /// messages as typed attributes, unknown ones included (e.g. to inspect attributes of a
    /// newer kernel that this library does not model).
    pub fn dump_raw(&self, msg: IpvsMessage) -> BoxStream<'static, Result<IpvsMessage, Error>> {
        self.dump(Operation::ListServices, Object::Table, msg, |m| {
            Ok(m.clone())
        })
    }

    /// The kernel's IPVS version and connection table size (`GET_INFO`).
    pub async fn info(&self) -> Result<Info, Error> {
        let op = Operation::Info;
        let reply = self
            .query(op, &Object::Table, IpvsMessage::get_info())
            .await?;
        reply.info().map_err(|source| Error::Decode { op, source })
    }

    /// All services, as a stream: one dump, **best-effort**.
    ///
    /// The kernel resumes a multi-part service dump by a position that counts the services
    /// of every network namespace, so IPVS changes in another namespace during the dump can
    /// make it repeat entries (dropped here) or skip them (undetectable in one dump). For a
    /// complete list use [`table`](IpvsHandle::table) or
    /// [`table_verified`](IpvsHandle::table_verified), which repeat the dump until two in
    /// a row agree with the earlier ones. Destination dumps ([`destinations`](IpvsHandle::destinations)) are per service
    /// and not affected.
    pub fn services(&self) -> BoxStream<'static, Result<ServiceEntry, Error>> {
        let mut seen = std::collections::HashSet::new();
        self.dump(
            Operation::ListServices,
            Object::Table,
            IpvsMessage::get_services(),
            IpvsMessage::service_entry,
        )
        .filter(move |r| {
            let keep = match r {
                Ok(entry) => seen.insert(entry.service.key),
                Err(_) => true,
            };
            futures::future::ready(keep)
        })
        .boxed()
    }

    /// One service. Fails with [`Error::ServiceNotFound`] if it does not exist.
    pub async fn service(&self, key: &ServiceKey) -> Result<ServiceEntry, Error> {
        let op = Operation::GetService;
        let object = Object::Service(*key);
        let msg = IpvsMessage::get_service(key).map_err(|e| Error::from_encode(op, &object, e))?;
        let reply = self.query(op, &object, msg).await?;
        reply
            .service_entry()
            .map_err(|source| Error::Decode { op, source })
    }

    async fn run_op(&self, op: Op) -> Result<(), Error> {
        let operation = op.operation();
        let object = op.object();
        let msg = op
            .encode()
            .map_err(|e| Error::from_encode(operation, &object, e))?;
        self.ack(operation, &object, msg).await
    }

    /// Adds a service (`NEW_SERVICE`). The kernel loads the scheduler module on demand and
    /// answers [`Error::ServiceExists`] if the key is taken, [`Error::SchedulerNotFound`] if
    /// it has no such scheduler or persistence engine.
    pub async fn add_service(&self, service: &Service) -> Result<(), Error> {
        self.run_op(Op::AddService(service.clone())).await
    }

    /// Changes a service's scheduler, flags, timeout, netmask or persistence engine
    /// (`SET_SERVICE`; the kernel replaces all of them, the destinations stay).
    /// [`Error::ServiceNotFound`] if it does not exist.
    pub async fn update_service(&self, service: &Service) -> Result<(), Error> {
        self.run_op(Op::UpdateService(service.clone())).await
    }

    /// Deletes a service and its destinations (`DEL_SERVICE`; the destinations go to the
    /// kernel's destination trash while connections still use them).
    pub async fn delete_service(&self, key: &ServiceKey) -> Result<(), Error> {
        self.run_op(Op::DeleteService(*key)).await
    }

    /// A service's destinations, as a stream (empty if the service does not exist).
    pub fn destinations(
        &self,
        key: &ServiceKey,
    ) -> BoxStream<'static, Result<DestinationEntry, Error>> {
        let op = Operation::ListDestinations;
        let object = Object::Service(*key);
        let msg = match IpvsMessage::get_destinations(key) {
            Ok(msg) => msg,
            Err(e) => return stream::iter([Err(Error::from_encode(op, &object, e))]).boxed(),
        };
        let family = key.family();
        self.dump(op, object, msg, move |m| m.destination_entry(family))
    }

    /// Adds a destination to a service (`NEW_DEST`): [`Error::ServiceNotFound`] without the
    /// service, [`Error::DestinationExists`] if it is there, [`Error::InvalidArgument`] for
    /// a family other than the service's without tunnelling.
    pub async fn add_destination(
        &self,
        service: &ServiceKey,
        dest: &Destination,
    ) -> Result<(), Error> {
        self.run_op(Op::AddDestination(*service, dest.clone()))
            .await
    }

    /// Changes a destination's forwarding method, weight, thresholds or tunnel (`SET_DEST`;
    /// existing connections stay on it). [`Error::DestinationNotFound`] if it is not there.
    pub async fn update_destination(
        &self,
        service: &ServiceKey,
        dest: &Destination,
    ) -> Result<(), Error> {
        self.run_op(Op::UpdateDestination(*service, dest.clone()))
            .await
    }

    /// Deletes a destination (`DEL_DEST`; the kernel keeps it in its destination trash for
    /// about two minutes while connections use it).
    pub async fn delete_destination(
        &self,
        service: &ServiceKey,
        dest: &DestinationKey,
    ) -> Result<(), Error> {
        self.run_op(Op::DeleteDestination(*service, *dest)).await
    }

    /// The connection table's timeouts (`GET_CONFIG`, like `ipvsadm -L --timeout`).
    pub async fn timeouts(&self) -> Result<Timeouts, Error> {
        let op = Operation::GetTimeouts;
        let reply = self
            .query(op, &Object::Table, IpvsMessage::get_config())
            .await?;
        Ok(reply.timeouts())
    }

    /// Sets the connection table's timeouts (`SET_CONFIG`); the kernel keeps the current
    /// value for a 0.
    pub async fn set_timeouts(&self, timeouts: &Timeouts) -> Result<(), Error> {
        let op = Operation::SetTimeouts;
        let msg = IpvsMessage::set_timeouts(timeouts)
            .map_err(|e| Error::from_encode(op, &Object::Table, e))?;
        self.ack(op, &Object::Table, msg).await
    }

    /// Zeroes the counters of one service, or of every service with `None`.
    pub async fn zero(&self, service: Option<&ServiceKey>) -> Result<(), Error> {
        let op = Operation::Zero;
        let object = match service {
            Some(key) => Object::Service(*key),
            None => Object::Table,
        };
        let msg = IpvsMessage::zero(service).map_err(|e| Error::from_encode(op, &object, e))?;
        self.ack(op, &object, msg).await
    }

    /// Deletes every service of the handle's network namespace (`FLUSH`), including
    /// services other programs created.
    pub async fn flush(&self) -> Result<(), Error> {
        self.ack(Operation::Flush, &Object::Table, IpvsMessage::flush())
            .await
    }

    /// Starts a connection sync daemon (`NEW_DAEMON`): a kernel thread that multicasts
    /// (master) or receives (backup) connection state. [`Error::SyncDaemonExists`] if one of
    /// that state runs, [`Error::InterfaceNotFound`] for an unknown interface.
    pub async fn start_sync_daemon(&self, daemon: &SyncDaemon) -> Result<(), Error> {
        let op = Operation::StartSyncDaemon;
        let object = Object::SyncDaemonConfig {
            state: daemon.state,
            interface: daemon.interface.clone(),
        };
        let msg =
            IpvsMessage::new_daemon(daemon).map_err(|e| Error::from_encode(op, &object, e))?;
        self.ack(op, &object, msg).await
    }

    /// Stops the sync daemon of that state (`DEL_DAEMON`); [`Error::SyncDaemonNotFound`]
    /// if none runs.
    pub async fn stop_sync_daemon(&self, state: SyncState) -> Result<(), Error> {
        let msg = IpvsMessage::del_daemon(state);
        self.ack(Operation::StopSyncDaemon, &Object::SyncDaemon(state), msg)
            .await
    }

    /// The running sync daemons (`GET_DAEMON` dump), with every parameter the kernel uses.
    pub async fn sync_daemons(&self) -> Result<Vec<SyncDaemon>, Error> {
        let mut s = self.dump(
            Operation::ListSyncDaemons,
            Object::Table,
            IpvsMessage::get_daemons(),
            IpvsMessage::sync_daemon,
        );
        let mut out = Vec::new();
        while let Some(d) = s.next().await {
            out.push(d?);
        }
        Ok(out)
    }

    /// Takes `n` blocking sockets from the pool, opening missing ones in the namespace.
    async fn take_sockets(&self, n: usize) -> io::Result<Vec<SyncSocket>> {
        let mut got = {
            let mut pool = self.inner.pool.lock().unwrap_or_else(|p| p.into_inner());
            let k = pool.len().min(n);
            let at = pool.len() - k;
            pool.split_off(at)
        };
        let missing = n - got.len();
        if missing > 0 {
            let more = netns::run_in(self.inner.netns.clone(), move || {
                (0..missing)
                    .map(|_| SyncSocket::open())
                    .collect::<io::Result<Vec<_>>>()
            })
            .await?;
            got.extend(more);
        }
        Ok(got)
    }

    fn give_back(&self, sockets: Vec<SyncSocket>) {
        let mut pool = self.inner.pool.lock().unwrap_or_else(|p| p.into_inner());
        pool.extend(sockets);
        pool.truncate(MAX_DUMP_WORKERS + 1);
    }

    /// Applies many changes with as few round trips as the kernel allows (many requests per
    /// datagram, each acknowledged by the kernel on its own).
    ///
    /// **Always returns exactly one result per op, in the order of `ops`**, whatever fails:
    /// an op the library refuses to encode gets its own error and is not sent; an op the
    /// kernel refuses gets the kernel's error; when the socket or the worker thread fails,
    /// every op without an answer gets an [`Error::Io`]. A failing op does not stop the
    /// others. The kernel applies the ops in order, so a service may be added and filled in
    /// one batch.
    pub async fn batch(&self, ops: Vec<Op>) -> Vec<Result<(), Error>> {
        if ops.is_empty() {
            return Vec::new();
        }
        let operations: Vec<Operation> = ops.iter().map(Op::operation).collect();
        let mut sockets = match self.take_sockets(1).await {
            Ok(s) => s,
            Err(e) => return batch::failed_all(&operations, &e.to_string()),
        };
        let family = self.inner.family;
        let joined = tokio::task::spawn_blocking(move || {
            let results = match sockets.first_mut() {
                Some(socket) => batch::run(socket, family, &ops),
                None => Vec::new(),
            };
            (results, sockets)
        })
        .await;
        match joined {
            Ok((results, sockets)) => {
                if results.iter().all(|r| !matches!(r, Err(Error::Io { .. }))) {
                    self.give_back(sockets);
                }
                batch::one_per_op(results, &operations)
            }
            Err(e) => batch::failed_all(&operations, &format!("batch worker failed: {e}")),
        }
    }

    /// The whole table: every service with its destinations, **verified** against the
    /// kernel's cross-namespace dump flaw (see [`table_verified`](IpvsHandle::table_verified)).
    ///
    /// Fails with [`Error::DumpUnstable`] when no two dumps in a row agreed within
    /// [`MAX_TABLE_ATTEMPTS`];
    /// [`table_verified`](IpvsHandle::table_verified) returns the merged table instead.
    pub async fn table(&self) -> Result<Table, Error> {
        let read = self.read_table(MAX_TABLE_ATTEMPTS).await?;
        if read.verified {
            Ok(read.table)
        } else {
            Err(Error::DumpUnstable {
                op: Operation::ListServices,
                attempts: read.attempts,
            })
        }
    }

    /// The whole table, with the service list dumped until two dumps in a row agree with the
    /// earlier ones.
    ///
    /// The kernel resumes a multi-part service dump by a position that counts the services
    /// of every network namespace: while IPVS changes in another namespace, one dump can
    /// repeat and skip services of ours, and a skip cannot be seen in one dump. (Measured in
    /// the VM: one add or delete every 10 ms elsewhere made every single dump of 3,000
    /// services miss some, so no two dumps were ever identical.) A disturbed dump never
    /// shows a service that does not exist, so the dumps are merged, by key, until one
    /// brings no key and no configuration (statistics aside) that the earlier ones had not
    /// shown, at most [`MAX_TABLE_ATTEMPTS`] dumps; services the last dump lacked (skipped,
    /// or deleted meanwhile) are then read one by one with an exact `GET_SERVICE`. Every
    /// service's destinations are dumped once, with a few parallel sockets (destination
    /// dumps are per service and not disturbed by other namespaces).
    ///
    /// Without disturbance this costs one service dump more than
    /// [`table_best_effort`](IpvsHandle::table_best_effort). A service skipped by every
    /// dump made stays unseen; each further dump makes that less likely. Changes in this
    /// namespace during the read are not excluded (no IPVS dump is atomic).
    pub async fn table_verified(&self) -> Result<VerifiedTable, Error> {
        self.read_table(MAX_TABLE_ATTEMPTS).await
    }

    /// The whole table from a single service dump: **best-effort**, may miss or (before
    /// de-duplication) repeat services while IPVS changes in another network namespace
    /// (see [`table_verified`](IpvsHandle::table_verified)). Half the cost of a verified
    /// read when nothing changes.
    pub async fn table_best_effort(&self) -> Result<Table, Error> {
        Ok(self.read_table(1).await?.table)
    }

    async fn read_table(&self, max_attempts: u32) -> Result<VerifiedTable, Error> {
        let workers = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .clamp(2, MAX_DUMP_WORKERS);
        let sockets = self
            .take_sockets(workers)
            .await
            .map_err(|e| Error::io(Operation::ListServices, e))?;
        let family = self.inner.family;
        let joined = tokio::task::spawn_blocking(move || dump_table(sockets, family, max_attempts))
            .await
            .map_err(|e| Error::io(Operation::ListServices, io::Error::other(e.to_string())))?;
        let (result, sockets) = joined;
        if result.is_ok() {
            self.give_back(sockets);
        }
        result
    }
}

fn connection_lost(op: Operation) -> Error {
    Error::io(
        op,
        io::Error::new(io::ErrorKind::BrokenPipe, "netlink connection closed"),
    )
}

type WorkerResult = Result<Vec<(usize, Vec<DestinationEntry>)>, Error>;

/// One service dump, repeats dropped.
fn dump_services(socket: &mut SyncSocket, family: u16) -> Result<Vec<ServiceEntry>, Error> {
    let op = Operation::ListServices;
    let mut services = Vec::new();
    let mut decode_err = None;
    let mut seen = std::collections::HashSet::new();
    match socket.dump(family, &IpvsMessage::get_services(), |m| {
        match m.and_then(|m| m.service_entry()) {
            // Repeats can come from concurrent changes in other namespaces (see `services`).
            Ok(s) => {
                if seen.insert(s.service.key) {
                    services.push(s);
                }
            }
            Err(e) => decode_err = Some(e),
        }
    }) {
        Err(e) => return Err(Error::io(op, e)),
        Ok(Err(errno)) => return Err(Error::from_errno(op, &Object::Table, errno)),
        Ok(Ok(())) => {}
    }
    if let Some(source) = decode_err {
        return Err(Error::Decode { op, source });
    }
    Ok(services)
}

/// One service read with `GET_SERVICE` (exact, unaffected by the dump flaw); `None` when
/// it does not exist.
fn get_service(
    socket: &mut SyncSocket,
    family: u16,
    key: &ServiceKey,
) -> Result<Option<ServiceEntry>, Error> {
    let op = Operation::GetService;
    let object = Object::Service(*key);
    let msg = IpvsMessage::get_service(key).map_err(|e| Error::from_encode(op, &object, e))?;
    let mut found = None;
    match socket.query(family, &msg, |m| {
        if found.is_none() {
            found = Some(m.and_then(|m| m.service_entry()));
        }
    }) {
        Err(e) => Err(Error::io(op, e)),
        Ok(Err(errno)) => match Error::from_errno(op, &object, errno) {
            e if e.is_not_found() => Ok(None),
            e => Err(e),
        },
        Ok(Ok(())) => match found {
            Some(Ok(entry)) => Ok(Some(entry)),
            Some(Err(source)) => Err(Error::Decode { op, source }),
            None => Ok(None),
        },
    }
}

/// The verified service list: service dumps merged until a dump brings nothing new.
///
/// A dump disturbed by another namespace only repeats or skips services; it never shows one
/// that did not exist. So the dumps are merged (the latest configuration of each key wins)
/// until two in a row bring no key and no configuration that the earlier ones had not
/// shown, at most `max_attempts` dumps. Services merged from earlier dumps but absent from the last
/// one (skipped by it, or deleted meanwhile) are then read one by one with `get`, which is
/// exact. Returns the services, the number of dumps, and whether the dumps agreed.
/// Consecutive service dumps that must add nothing before a merged read counts as complete.
const QUIET_DUMPS: u32 = 2;

fn merge_dumps(
    max_attempts: u32,
    mut dump: impl FnMut() -> Result<Vec<ServiceEntry>, Error>,
    mut get: impl FnMut(&ServiceKey) -> Result<Option<ServiceEntry>, Error>,
) -> Result<(Vec<ServiceEntry>, u32, bool), Error> {
    let mut merged: BTreeMap<ServiceKey, ServiceEntry> = BTreeMap::new();
    let mut attempts = 0;
    let mut quiet_in_a_row = 0;
    let (latest, verified) = loop {
        let latest = dump()?;
        attempts += 1;
        let nothing_new = attempts > 1
            && latest.iter().all(|e| {
                merged
                    .get(&e.service.key)
                    .is_some_and(|m| m.service == e.service)
            });
        quiet_in_a_row = if nothing_new { quiet_in_a_row + 1 } else { 0 };
        let keys: BTreeSet<ServiceKey> = latest.iter().map(|e| e.service.key).collect();
        for e in latest {
            merged.insert(e.service.key, e);
        }
        // One quiet dump can still have skipped what the previous one skipped (both resumed
        // at positions shifted the same way): ask for two in a row.
        let verified = quiet_in_a_row >= QUIET_DUMPS;
        if verified || attempts >= max_attempts.max(1) {
            break (keys, verified);
        }
    };
    if attempts > 1 {
        let unconfirmed: Vec<ServiceKey> = merged
            .keys()
            .filter(|k| !latest.contains(k))
            .copied()
            .collect();
        for key in unconfirmed {
            match get(&key)? {
                Some(entry) => {
                    merged.insert(key, entry);
                }
                None => {
                    merged.remove(&key);
                }
            }
        }
    }
    Ok((merged.into_values().collect(), attempts, verified))
}

/// Reads the service list with [`merge_dumps`] (a single dump when `max_attempts` is 1),
/// then every service's destinations.
fn dump_table(
    mut sockets: Vec<SyncSocket>,
    family: u16,
    max_attempts: u32,
) -> (Result<VerifiedTable, Error>, Vec<SyncSocket>) {
    let Some(first) = sockets.first_mut() else {
        return (
            Ok(VerifiedTable {
                table: Vec::new(),
                attempts: 0,
                verified: false,
            }),
            sockets,
        );
    };
    // Both closures need the socket, never at the same time.
    let first = std::cell::RefCell::new(first);
    let read = merge_dumps(
        max_attempts,
        || dump_services(&mut first.borrow_mut(), family),
        |key| get_service(&mut first.borrow_mut(), family, key),
    );
    let (services, attempts, verified) = match read {
        Ok(read) => read,
        Err(e) => return (Err(e), sockets),
    };
    match dump_destinations(&mut sockets, family, &services) {
        Ok(dests) => (
            Ok(VerifiedTable {
                table: services.into_iter().zip(dests).collect(),
                attempts,
                verified,
            }),
            sockets,
        ),
        Err(e) => (Err(e), sockets),
    }
}

/// Every service's destinations, in the order of `services`, with one thread per socket.
fn dump_destinations(
    sockets: &mut [SyncSocket],
    family: u16,
    services: &[ServiceEntry],
) -> Result<Vec<Vec<DestinationEntry>>, Error> {
    let next = AtomicUsize::new(0);
    let services_ref = services;
    let parts: Vec<WorkerResult> = std::thread::scope(|scope| {
        let handles: Vec<_> = sockets
            .iter_mut()
            .map(|socket| {
                let next = &next;
                scope.spawn(move || {
                    let op = Operation::ListDestinations;
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(entry) = services_ref.get(i) else {
                            return Ok(out);
                        };
                        let key = entry.service.key;
                        let object = Object::Service(key);
                        let msg = IpvsMessage::get_destinations(&key)
                            .map_err(|e| Error::from_encode(op, &object, e))?;
                        let key_family = key.family();
                        let mut dests = Vec::new();
                        let mut bad = None;
                        match socket.dump(family, &msg, |m| {
                            match m.and_then(|m| m.destination_entry(key_family)) {
                                Ok(d) => dests.push(d),
                                Err(e) => bad = Some(e),
                            }
                        }) {
                            Err(e) => return Err(Error::io(op, e)),
                            Ok(Err(errno)) => {
                                return Err(Error::from_errno(op, &object, errno));
                            }
                            Ok(Ok(())) => {}
                        }
                        if let Some(source) = bad {
                            return Err(Error::Decode { op, source });
                        }
                        out.push((i, dests));
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::io(
                        Operation::ListDestinations,
                        io::Error::other("dump worker panicked"),
                    ))
                })
            })
            .collect()
    });
    let mut dests: Vec<Vec<DestinationEntry>> = services.iter().map(|_| Vec::new()).collect();
    for part in parts {
        for (i, d) in part? {
            if let Some(slot) = dests.get_mut(i) {
                *slot = d;
            }
        }
    }
    Ok(dests)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Scheduler, Stats};
    use std::net::{IpAddr, Ipv4Addr};

    fn entry(i: u8, scheduler: Scheduler, packets: u64) -> ServiceEntry {
        let key = ServiceKey::tcp(IpAddr::V4(Ipv4Addr::new(10, 0, 0, i)), 80);
        ServiceEntry {
            service: Service::new(key, scheduler),
            stats: Stats {
                in_packets: packets,
                ..Stats::default()
            },
        }
    }

    /// Runs `merge_dumps` over a fixed sequence of dumps (the last one repeated), with
    /// `exists` answering the exact reads; also returns the keys read exactly.
    fn run(
        dumps: Vec<Vec<ServiceEntry>>,
        exists: &[ServiceEntry],
        max: u32,
    ) -> (Vec<ServiceEntry>, u32, bool, Vec<ServiceKey>) {
        let mut i = 0;
        let mut asked = Vec::new();
        let (got, attempts, verified) = merge_dumps(
            max,
            || {
                let d = dumps[i.min(dumps.len() - 1)].clone();
                i += 1;
                Ok(d)
            },
            |key| {
                asked.push(*key);
                Ok(exists.iter().find(|e| e.service.key == *key).cloned())
            },
        )
        .expect("no error");
        (got, attempts, verified, asked)
    }

    fn keys(entries: &[ServiceEntry]) -> Vec<ServiceKey> {
        let mut k: Vec<ServiceKey> = entries.iter().map(|e| e.service.key).collect();
        k.sort();
        k
    }

    #[test]
    fn skipped_services_are_found_by_merging_dumps() {
        let rr = Scheduler::RoundRobin;
        let all: Vec<ServiceEntry> = (1..=5).map(|i| entry(i, rr.clone(), 0)).collect();
        let without = |skip: &[u8]| -> Vec<ServiceEntry> {
            all.iter()
                .filter(|e| {
                    !skip
                        .iter()
                        .any(|&i| e.service.key == entry(i, rr.clone(), 0).service.key)
                })
                .cloned()
                .collect()
        };
        // Nothing disturbed: two dumps in a row bring nothing new, nothing is read one by one.
        let (got, attempts, verified, asked) = run(vec![all.clone()], &all, 8);
        assert_eq!((attempts, verified), (3, true));
        assert_eq!(got, all);
        assert!(asked.is_empty());

        // Every dump skips something, never the same service twice: the third and fourth
        // dumps bring nothing new; what the last one skipped is read exactly.
        let (got, attempts, verified, asked) = run(
            vec![without(&[2]), without(&[4]), without(&[1, 5])],
            &all,
            8,
        );
        assert_eq!((attempts, verified), (4, true));
        assert_eq!(keys(&got), keys(&all));
        assert_eq!(asked.len(), 2);

        // Counters differ between dumps: not a disagreement.
        let mut busier = all.clone();
        busier[0].stats.in_packets = 7;
        let (_, attempts, verified, _) = run(vec![all.clone(), busier], &all, 8);
        assert_eq!((attempts, verified), (3, true));

        // A configuration change is new information: one more dump.
        let mut changed = all.clone();
        changed[1].service.scheduler = Scheduler::WeightedLeastConnection;
        let (got, attempts, verified, _) = run(vec![all.clone(), changed.clone()], &changed, 8);
        assert_eq!((attempts, verified), (4, true));
        assert_eq!(got, changed);

        // A service deleted meanwhile (in an earlier dump, not in the last ones, and gone
        // when read) is dropped.
        let gone = without(&[3]);
        let (got, _, verified, asked) = run(vec![all.clone(), gone.clone()], &gone, 8);
        assert!(verified);
        assert_eq!(keys(&got), keys(&gone));
        assert_eq!(asked, vec![all[2].service.key]);

        // New services in every dump: bounded, unverified.
        let growing: Vec<Vec<ServiceEntry>> = (1..=10)
            .map(|n| (1..=n).map(|i| entry(i, rr.clone(), 0)).collect())
            .collect();
        let (got, attempts, verified, _) = run(growing, &all, 8);
        assert_eq!((attempts, verified), (8, false));
        assert_eq!(got.len(), 8);

        // A single dump is taken as it is.
        let (got, attempts, verified, asked) = run(vec![without(&[2])], &all, 1);
        assert_eq!((attempts, verified, got.len()), (1, false, 4));
        assert!(asked.is_empty());
    }
}
