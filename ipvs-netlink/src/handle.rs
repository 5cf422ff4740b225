//! The async handle.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use futures::stream::{self, BoxStream, StreamExt};
use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_sys::protocols::NETLINK_GENERIC;
use tokio::sync::mpsc;

use crate::batch::{self, Op};
use crate::destination::{Destination, DestinationEntry, DestinationKey};
use crate::error::{Error, Object, Operation};
use crate::listing::Listing;
use crate::message::{self, IpvsMessage, WireError};
use crate::netns::{self, NetnsTarget};
use crate::service::{Service, ServiceEntry, ServiceKey};
use crate::sync_daemon::{SyncDaemon, SyncState};
use crate::table;
use crate::transport::{self, Connection, ConnectionHandle, NetlinkSocket, Part};
use crate::{Info, Timeouts};

/// Most worker threads (each with its own socket) used by [`IpvsHandle::table`].
const MAX_DUMP_WORKERS: usize = 4;

/// Most service dumps [`IpvsHandle::table_verified`] makes before giving up.
pub const MAX_TABLE_ATTEMPTS: u32 = 8;

/// The netlink connection behind an [`IpvsHandle`]: a future that owns the handle's
/// socket, sends its single requests and dumps (many in flight at once) and routes the
/// replies back by sequence number. Spawn it (or poll it) for the handle's single requests
/// and dumps to make progress; it ends when every handle is dropped and nothing is in
/// flight. [`batch`](IpvsHandle::batch) and [`table`](IpvsHandle::table) run on blocking
/// sockets of the same transport ([`crate::transport`]) and do not depend on it.
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

pub use crate::table::{Table, VerifiedServices, VerifiedTable};

/// The shared connection's dump slot while a dump's replies are read. A dump stream dropped
/// before its end (the caller stopped reading) keeps the slot on a task of its own until the
/// kernel's end of that dump has come in: until then the kernel answers another dump on the
/// socket with `EBUSY`.
struct DumpSlot {
    replies: Option<mpsc::UnboundedReceiver<Part>>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl DumpSlot {
    fn new(
        replies: mpsc::UnboundedReceiver<Part>,
        guard: tokio::sync::OwnedMutexGuard<()>,
    ) -> Self {
        DumpSlot {
            replies: Some(replies),
            guard: Some(guard),
        }
    }

    /// The next part of the dump; after its last one (or none) the slot is free.
    async fn next(&mut self) -> Option<Part> {
        let part = self.replies.as_mut()?.recv().await;
        if !matches!(part, Some(Part::Data(_))) {
            self.replies = None;
            self.guard = None;
        }
        part
    }
}

impl Drop for DumpSlot {
    fn drop(&mut self) {
        let (Some(mut replies), Some(guard)) = (self.replies.take(), self.guard.take()) else {
            return;
        };
        // Without a runtime the connection task is gone too: nothing left to wait for.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                while let Some(Part::Data(_)) = replies.recv().await {}
                drop(guard);
            });
        }
    }
}

/// An async client of the kernel's IPVS family. Cheap to clone (an `Arc`); every clone
/// shares one netlink connection and may be used from many tasks at once.
///
/// The kernel runs one dump per socket at a time: a dump started while another one of the
/// handle is still being read (destinations listed while the services are walked) runs on
/// a pooled socket of its own, and is read whole before its first item comes.
/// [`batch`](IpvsHandle::batch) and [`table`](IpvsHandle::table) use dedicated sockets from
/// the same small pool, opened in the handle's network namespace: page-sized ones (see
/// [`NetlinkSocket::open_page_sized`]), and one that takes 32 KiB datagrams for the
/// whole-table reads' service dumps.
#[derive(Clone)]
pub struct IpvsHandle {
    inner: Arc<Inner>,
    /// Sockets a whole-table read may use; `None`: one per CPU, 2 to [`MAX_DUMP_WORKERS`].
    read_sockets: Option<usize>,
}

struct Inner {
    conn: ConnectionHandle,
    family: u16,
    dump_lock: Arc<tokio::sync::Mutex<()>>,
    netns: Option<Arc<OwnedFd>>,
    /// Page-sized sockets: batches, single dumps, the destination dumps of a table read.
    pool: Mutex<Vec<NetlinkSocket>>,
    /// The socket a table read dumps the service list on: its parts are the kernel's
    /// largest, since each part of a service dump walks the kernel's service table from the
    /// start up to where the last one ended.
    lister: Mutex<Option<NetlinkSocket>>,
    /// The kernel's text listing of the handle's namespace (`/proc/net/ip_vs`), opened with
    /// the sockets (a `/proc/net` file shows the namespace it was opened in, whichever
    /// thread reads it) and read again from its start each time; `None` when it could not
    /// be opened (no `/proc`).
    listing: Mutex<Option<std::fs::File>>,
    /// The listing's length when last read: the next read's buffer is made at it.
    listing_len: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for IpvsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpvsHandle")
            .field("family", &self.inner.family)
            .field("in_netns", &self.inner.netns.is_some())
            .field("connection", &format_args!("{}", self.inner.conn.counts()))
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
        let (socket, family, connection) = netns::run_in(netns.clone(), move || {
            let _guard = rt.enter();
            let mut socket = NetlinkSocket::open(NETLINK_GENERIC)?;
            let family = transport::resolve_family(&mut socket, message::FAMILY_NAME)?;
            let connection = Connection::open(NETLINK_GENERIC)?;
            // After the family is resolved (which loads ip_vs if it can): the file exists
            // from then on.
            let listing = std::fs::File::open(LISTING_PATH).ok();
            Ok((socket, family, (connection, listing)))
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
        let ((connection, conn), listing) = connection;
        let connection = IpvsConnection {
            inner: Box::pin(connection.run()),
        };
        let handle = IpvsHandle {
            inner: Arc::new(Inner {
                conn,
                family,
                dump_lock: Arc::new(tokio::sync::Mutex::new(())),
                netns,
                pool: Mutex::new(Vec::new()),
                lister: Mutex::new(Some(socket)),
                listing: Mutex::new(listing),
                listing_len: std::sync::atomic::AtomicUsize::new(0),
            }),
            read_sockets: None,
        };
        Ok((connection, handle))
    }

    /// A handle on the same connection whose whole-table reads ([`IpvsHandle::table`] and
    /// the like) use at most `sockets` sockets (1 to 4): with one, the destination dumps
    /// follow the service dumps on a single socket and thread, for a read in the background
    /// that leaves the other CPUs, and the kernel's IPVS lock, to other work. By default a
    /// read uses one socket per CPU, 2 to 4.
    pub fn with_read_sockets(&self, sockets: usize) -> IpvsHandle {
        IpvsHandle {
            inner: self.inner.clone(),
            read_sockets: Some(sockets.clamp(1, MAX_DUMP_WORKERS)),
        }
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
    ) -> Result<mpsc::UnboundedReceiver<Part>, Error> {
        self.inner
            .conn
            .request(message::genl(self.inner.family, msg), flags)
            .map_err(|e| Error::io(op, e))
    }

    /// Sends a request that is answered by an ack only.
    async fn ack(&self, op: Operation, object: &Object, msg: IpvsMessage) -> Result<(), Error> {
        let mut replies = self.send(op, msg, NLM_F_REQUEST | NLM_F_ACK)?;
        while let Some(part) = replies.recv().await {
            match part {
                Part::Data(_) => {}
                Part::Done => return Ok(()),
                Part::Errno(errno) => return Err(Error::from_errno(op, object, errno)),
                Part::Failed(e) => return Err(Error::io(op, e)),
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
        while let Some(part) = replies.recv().await {
            match part {
                Part::Data(payload) if answer.is_none() => {
                    answer = Some(IpvsMessage::from_genl(&payload))
                }
                Part::Data(_) => {}
                Part::Done => {
                    return match answer {
                        Some(a) => a.map_err(|source| Error::Decode { op, source }),
                        None => Err(Error::Decode {
                            op,
                            source: WireError::new("acknowledged without an answer"),
                        }),
                    };
                }
                Part::Errno(errno) => return Err(Error::from_errno(op, object, errno)),
                Part::Failed(e) => return Err(Error::io(op, e)),
            }
        }
        Err(connection_lost(op))
    }

    /// A dump, decoded item by item: on the shared connection when no other dump of this
    /// handle is being read, else on a pooled socket of its own (so a caller may list each
    /// service's destinations while it walks the services).
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
            // The kernel runs one dump per socket at a time.
            let Ok(guard) = this.inner.dump_lock.clone().try_lock_owned() else {
                let items = this.dump_on_own_socket(op, &object, msg, &decode).await;
                return stream::iter(items).boxed();
            };
            match this.send(op, msg, NLM_F_REQUEST | NLM_F_DUMP) {
                Err(e) => stream::iter(vec![Err(e)]).boxed(),
                Ok(replies) => stream::unfold(
                    Some((DumpSlot::new(replies, guard), Arc::new(decode), object)),
                    move |state| async move {
                        let (mut slot, decode, object) = state?;
                        let item = match slot.next().await {
                            None => Err(connection_lost(op)),
                            Some(Part::Data(payload)) => IpvsMessage::from_genl(&payload)
                                .and_then(|m| decode(&m))
                                .map_err(|source| Error::Decode { op, source }),
                            Some(Part::Done) => return None,
                            Some(Part::Errno(errno)) => Err(Error::from_errno(op, &object, errno)),
                            Some(Part::Failed(e)) => Err(Error::io(op, e)),
                        };
                        // A decoding error is one bad message; any other error ends the dump.
                        let more = matches!(item, Ok(_) | Err(Error::Decode { .. }));
                        Some((item, more.then_some((slot, decode, object))))
                    },
                )
                .boxed(),
            }
        })
        .flatten()
        .boxed()
    }

    /// Runs a dump on a pooled blocking socket and returns its items (one per reply, a
    /// decoding error as its own item; a failure of the dump as a last item).
    async fn dump_on_own_socket<T, F>(
        &self,
        op: Operation,
        object: &Object,
        msg: IpvsMessage,
        decode: &F,
    ) -> Vec<Result<T, Error>>
    where
        F: Fn(&IpvsMessage) -> Result<T, WireError>,
    {
        let sockets = match self.take_sockets(1).await {
            Ok(sockets) => sockets,
            Err(e) => return vec![Err(Error::io(op, e))],
        };
        let family = self.inner.family;
        let joined = self
            .on_blocking_thread(
                sockets,
                move |sockets| {
                    let mut payloads = Vec::new();
                    let answer = match sockets.first_mut() {
                        Some(socket) => socket.dump(message::genl(family, msg), |reply| {
                            payloads.push(reply.payload.to_vec())
                        }),
                        None => Err(io::Error::other("no socket")),
                    };
                    (payloads, answer)
                },
                |(_, answer)| answer.is_ok(),
            )
            .await;
        let (payloads, answer) = match joined {
            Ok(done) => done,
            Err(e) => return vec![Err(Error::io(op, io::Error::other(e.to_string())))],
        };
        let mut items: Vec<Result<T, Error>> = payloads
            .iter()
            .map(|payload| {
                IpvsMessage::from_genl(payload)
                    .and_then(|m| decode(&m))
                    .map_err(|source| Error::Decode { op, source })
            })
            .collect();
        match answer {
            Ok(Ok(())) => {}
            Ok(Err(errno)) => items.push(Err(Error::from_errno(op, object, errno))),
            Err(e) => items.push(Err(Error::io(op, e))),
        }
        items
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

    /// Every (address, port, protocol) service's destinations, as the kernel's text listing
    /// of the handle's namespace shows them (`/proc/net/ip_vs`): one read of one file, about
    /// a seventh of the kernel's work of a destination dump per service (see
    /// [`crate::listing`] for what it shows and what it does not). Best-effort, and less
    /// than a single service dump: while other namespaces have IPVS services the kernel's
    /// listing skips about one of this namespace's for each of theirs, so a caller compares
    /// it with a service dump ([`IpvsHandle::services`]) and dumps the destinations of a
    /// service it does not show. Fails when the file could not be opened or does not read
    /// as the kernel writes it.
    pub async fn listed_destinations(&self) -> Result<Listing, Error> {
        self.listed_destinations_up_to(usize::MAX)
            .await
            .map(Option::unwrap_or_default)
    }

    /// [`listed_destinations`](IpvsHandle::listed_destinations), unless the listing shows
    /// more than `max_services` services (firewall-mark ones included): then `None`, read
    /// no further than that. The kernel hands the listing out a page at a time (a dozen
    /// services with five destinations each) and finds where to resume each page by walking
    /// the namespace's services from the first, so its work grows with the square of the
    /// services: in the test VM at 50,000 services × 5 destinations, about 20 s of kernel
    /// time for the whole listing, against 7.5 s for a destination dump per service on
    /// parallel sockets; at 10,000, a seventh of those dumps' work.
    pub async fn listed_destinations_up_to(
        &self,
        max_services: usize,
    ) -> Result<Option<Listing>, Error> {
        let op = Operation::ListDestinations;
        let inner = Arc::clone(&self.inner);
        let read = tokio::task::spawn_blocking(move || -> io::Result<Option<Vec<u8>>> {
            use std::io::{Read, Seek};
            let mut slot = inner.listing.lock().unwrap_or_else(|p| p.into_inner());
            let file = slot.as_mut().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{LISTING_PATH} could not be opened"),
                )
            })?;
            file.rewind()?;
            let last = inner.listing_len.load(std::sync::atomic::Ordering::Relaxed);
            let mut text = Vec::with_capacity(last + last / 8 + LISTING_READ);
            let mut piece = vec![0; LISTING_READ];
            let most = max_services.saturating_add(crate::listing::HEADER_LINE_STARTS);
            let (mut lines, mut at_line_start) = (0usize, true);
            loop {
                let read = match file.read(&mut piece) {
                    Ok(0) => break,
                    Ok(read) => &piece[..read],
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                    Err(error) => return Err(error),
                };
                lines += crate::listing::count_line_starts(read, &mut at_line_start);
                if lines > most {
                    return Ok(None);
                }
                text.extend_from_slice(read);
            }
            inner
                .listing_len
                .store(text.len(), std::sync::atomic::Ordering::Relaxed);
            Ok(Some(text))
        })
        .await
        .map_err(|e| Error::io(op, io::Error::other(e.to_string())))?
        .map_err(|e| Error::io(op, e))?;
        let Some(read) = read else {
            return Ok(None);
        };
        let text = std::str::from_utf8(&read)
            .map_err(|e| Error::io(op, io::Error::new(io::ErrorKind::InvalidData, e)))?;
        crate::listing::parse_listing(text)
            .map(Some)
            .map_err(|e| Error::io(op, io::Error::new(io::ErrorKind::InvalidData, e)))
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
    ///
    /// A daemon stopped right after it was started may not have run yet: the kernel then
    /// stops and frees it all the same but answers `-EINTR` (what stopping a kernel thread
    /// that never ran returns), and netlink sends no reply for that errno. The request is
    /// still answered (see the transport's barrier), and that answer means stopped.
    pub async fn stop_sync_daemon(&self, state: SyncState) -> Result<(), Error> {
        let msg = IpvsMessage::del_daemon(state);
        match self
            .ack(Operation::StopSyncDaemon, &Object::SyncDaemon(state), msg)
            .await
        {
            Err(Error::Kernel {
                errno: libc::EINTR, ..
            }) => Ok(()),
            other => other,
        }
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
    async fn take_sockets(&self, n: usize) -> io::Result<Vec<NetlinkSocket>> {
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
                    .map(|_| NetlinkSocket::open_page_sized(NETLINK_GENERIC))
                    .collect::<io::Result<Vec<_>>>()
            })
            .await?;
            got.extend(more);
        }
        Ok(got)
    }

    fn give_back(&self, sockets: Vec<NetlinkSocket>) {
        let mut pool = self.inner.pool.lock().unwrap_or_else(|p| p.into_inner());
        pool.extend(sockets);
        pool.truncate(MAX_DUMP_WORKERS + 1);
    }

    /// Runs `work` with `sockets` on a blocking thread; they go back to the pool when
    /// `reusable` says the result left them in a known state.
    async fn on_blocking_thread<R: Send + 'static>(
        &self,
        mut sockets: Vec<NetlinkSocket>,
        work: impl FnOnce(&mut [NetlinkSocket]) -> R + Send + 'static,
        reusable: impl FnOnce(&R) -> bool,
    ) -> Result<R, tokio::task::JoinError> {
        let (result, sockets) = tokio::task::spawn_blocking(move || {
            let result = work(&mut sockets);
            (result, sockets)
        })
        .await?;
        if reusable(&result) {
            self.give_back(sockets);
        }
        Ok(result)
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
        let sockets = match self.take_sockets(1).await {
            Ok(s) => s,
            Err(e) => return batch::failed_all(&operations, &e.to_string()),
        };
        let family = self.inner.family;
        let joined = self
            .on_blocking_thread(
                sockets,
                move |sockets| match sockets.first_mut() {
                    Some(socket) => batch::run(socket, family, &ops),
                    None => Vec::new(),
                },
                |results| results.iter().all(|r| !matches!(r, Err(Error::Io { .. }))),
            )
            .await;
        match joined {
            Ok(results) => batch::one_per_op(results, &operations),
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
    /// shows a service that does not exist, so the dumps are merged, by key, until two in a
    /// row bring no key and no configuration (statistics aside) that the earlier ones had
    /// not shown, at most [`MAX_TABLE_ATTEMPTS`] dumps; services the last dump lacked
    /// (skipped, or deleted meanwhile) are then read one by one with an exact
    /// `GET_SERVICE`. Only the first dump is decoded whole: later ones are compared with
    /// what was merged on their raw bytes, and only a record that differs is decoded.
    /// Every service's destinations are dumped once, on a few parallel sockets, from the
    /// moment a dump first shows the service (destination dumps are per service and not
    /// disturbed by other namespaces).
    ///
    /// Without disturbance this costs two service dumps more than
    /// [`table_best_effort`](IpvsHandle::table_best_effort), made while the destinations
    /// are being dumped. A service skipped by every dump made stays unseen; each further
    /// dump makes that less likely. Changes in this namespace during the read are not
    /// excluded (no IPVS dump is atomic).
    pub async fn table_verified(&self) -> Result<VerifiedTable, Error> {
        self.read_table(MAX_TABLE_ATTEMPTS).await
    }

    /// The whole table from a single service dump: **best-effort**, may miss or (before
    /// de-duplication) repeat services while IPVS changes in another network namespace
    /// (see [`table_verified`](IpvsHandle::table_verified)). It saves the verified read's
    /// two further service dumps, which run beside the destination dumps: measured in the
    /// VM at 10,000 services × 5 destinations, 1.0–1.1 s against 1.3–1.5 s, since the
    /// destination dumps (one per service) take most of either read.
    pub async fn table_best_effort(&self) -> Result<Table, Error> {
        Ok(self.read_table(1).await?.table)
    }

    /// The service list alone, verified as [`table_verified`](IpvsHandle::table_verified)'s
    /// is (dumps repeated until two in a row agree with the earlier ones, then the
    /// unconfirmed ones read one by one), without any destination: for a caller that takes
    /// the destinations from the kernel's listing
    /// ([`listed_destinations`](IpvsHandle::listed_destinations)).
    pub async fn services_verified(&self) -> Result<VerifiedServices, Error> {
        let failed = |e: io::Error| Error::io(Operation::ListServices, e);
        let mut lister = self.take_lister().await.map_err(failed)?;
        let family = self.inner.family;
        let (read, lister) = tokio::task::spawn_blocking(move || {
            let read = table::read_service_list(&mut lister, family, MAX_TABLE_ATTEMPTS);
            (read, lister)
        })
        .await
        .map_err(|e| failed(io::Error::other(e.to_string())))?;
        if read.is_ok() {
            self.give_back_lister(lister);
        }
        read
    }

    /// The table of services already read (by [`services`](IpvsHandle::services) or
    /// [`services_verified`](IpvsHandle::services_verified)): every one's destinations
    /// dumped on the parallel sockets a table read uses, without dumping the service list
    /// again. For a caller that has the service list and finds the kernel's listing not
    /// worth reading for their destinations
    /// ([`listed_destinations_up_to`](IpvsHandle::listed_destinations_up_to)). Sorted by
    /// service key, each service once. A service deleted since it was read is shown with
    /// no destinations: the kernel ends the destination dump of a service it does not have
    /// as it ends that of a service without destinations, with no error.
    pub async fn table_of(&self, services: Vec<ServiceEntry>) -> Result<Table, Error> {
        let failed = |e: io::Error| Error::io(Operation::ListDestinations, e);
        let mut sockets = self
            .take_sockets(self.dump_workers())
            .await
            .map_err(failed)?;
        let family = self.inner.family;
        let (read, sockets) = tokio::task::spawn_blocking(move || {
            let read = table::read_destinations(&mut sockets, family, services);
            (read, sockets)
        })
        .await
        .map_err(|e| failed(io::Error::other(e.to_string())))?;
        if read.is_ok() {
            self.give_back(sockets);
        }
        read
    }

    /// How many sockets a whole-table read dumps destinations on.
    fn dump_workers(&self) -> usize {
        self.read_sockets.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
                .clamp(2, MAX_DUMP_WORKERS)
        })
    }

    async fn read_table(&self, max_attempts: u32) -> Result<VerifiedTable, Error> {
        let workers = self.dump_workers();
        let failed = |e: io::Error| Error::io(Operation::ListServices, e);
        let mut lister = self.take_lister().await.map_err(failed)?;
        let mut sockets = self.take_sockets(workers).await.map_err(failed)?;
        let family = self.inner.family;
        let (read, lister, sockets) = tokio::task::spawn_blocking(move || {
            let read = table::read(&mut lister, &mut sockets, family, max_attempts);
            (read, lister, sockets)
        })
        .await
        .map_err(|e| failed(io::Error::other(e.to_string())))?;
        if read.is_ok() {
            self.give_back(sockets);
            self.give_back_lister(lister);
        }
        read
    }

    /// The socket service lists are dumped on: the handle's, or a new one in its namespace
    /// while another read holds it.
    async fn take_lister(&self) -> io::Result<NetlinkSocket> {
        let taken = self
            .inner
            .lister
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match taken {
            Some(lister) => Ok(lister),
            None => {
                netns::run_in(self.inner.netns.clone(), || {
                    NetlinkSocket::open(NETLINK_GENERIC)
                })
                .await
            }
        }
    }

    /// Keeps `lister` for the next read, which comes seconds or minutes later (a resync):
    /// its megabyte of buffers goes back meanwhile.
    fn give_back_lister(&self, mut lister: NetlinkSocket) {
        lister.release_buffers();
        let mut slot = self.inner.lister.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert(lister);
    }
}

/// The kernel's text listing of the calling thread's network namespace.
const LISTING_PATH: &str = "/proc/thread-self/net/ip_vs";

/// How much of the listing one read asks for (the kernel answers a page or so of it).
const LISTING_READ: usize = 64 * 1024;

fn connection_lost(op: Operation) -> Error {
    Error::io(
        op,
        io::Error::new(io::ErrorKind::BrokenPipe, "netlink connection closed"),
    )
}
