//! The blocking socket: one request at a time, or many pipelined.

use std::io::{self, IoSliceMut};
use std::os::fd::AsRawFd;

use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkSerializable};
use netlink_sys::{Socket, SocketAddr};
use nix::sys::socket::{MsgFlags, MultiHeaders, recvmmsg};

use super::{Barrier, End, Reply, needs_barrier, push_message, replies};

/// Receive buffer asked for (the kernel doubles it); sized so that the acks of a whole
/// pipelined chunk and large dump replies never overflow.
const RCVBUF: usize = 16 * 1024 * 1024;
/// The user-space buffer the async connection reads one datagram into.
pub(super) const DATAGRAM: usize = 1 << 20;
/// The buffer for one datagram of a `recvmmsg` on a socket from [`NetlinkSocket::open`]: the
/// kernel makes dump datagrams of at most 32 KiB (the largest receive buffer it sizes them
/// to), acks are far smaller.
const SLOT: usize = 32 * 1024;
/// Most bytes a [`NetlinkSocket::open_page_sized`] socket's datagram may take.
const PAGE_SLOT_MAX: usize = 8 * 1024;
/// The least room a 64-bit kernel keeps after the data of a socket buffer for the buffer's
/// shared info: `SKB_DATA_ALIGN(sizeof(struct skb_shared_info))` with the fewest fragments
/// a kernel is built with (`MAX_SKB_FRAGS` 17), 320 bytes. A kernel with more fragments
/// keeps more.
const SKB_SHARED_INFO_MIN: usize = 320;
/// Datagrams taken by one `recvmmsg`.
const SLOTS: usize = 32;
/// Most bytes of requests sent in one datagram (below the default 208 KiB send buffer).
const CHUNK_BYTES: usize = 160 * 1024;
/// Most requests per datagram, bounding the acks queued at once.
const CHUNK_REQUESTS: usize = 2048;
/// Receive-buffer bytes counted per queued acknowledgement: the kernel charges each ack's
/// whole buffer (about 768 bytes) against the socket's receive buffer.
const ACK_TRUESIZE: usize = 1024;

/// What became of one request of a [`pipeline`](NetlinkSocket::pipeline).
#[derive(Debug)]
pub enum Answer<'a> {
    /// The kernel acknowledged it.
    Ack,
    /// The kernel refused it with this errno (positive); `EINTR` when it sent no
    /// acknowledgement at all (see [the module documentation](super)).
    Errno(i32),
    /// It was never sent: sending its datagram failed.
    NotSent(&'a io::Error),
    /// It was sent, but receiving the acknowledgements failed.
    Unanswered(&'a io::Error),
}

/// A blocking netlink socket of any protocol, in the network namespace of the thread that
/// opened it: bound, connected to the kernel, with `NETLINK_CAP_ACK` (acks do not echo the
/// request), a large receive buffer and a 30 s receive timeout.
#[derive(Debug)]
pub struct NetlinkSocket {
    socket: Socket,
    sequence: u32,
    inbox: Inbox,
    out: Vec<u8>,
    /// Most requests per datagram: [`CHUNK_REQUESTS`], fewer when the receive buffer could
    /// not be raised (no `CAP_NET_ADMIN`) and would overflow with the chunk's acks.
    chunk_requests: usize,
}

/// The datagrams one `recvmmsg` took.
struct Inbox {
    /// [`SLOTS`] buffers of `slot` bytes, made at the first [`fill`](Inbox::fill) after
    /// [`release`](Inbox::release) (or the socket's opening).
    buf: Vec<u8>,
    /// The size of one datagram's buffer.
    slot: usize,
    /// The length of each datagram received, in order.
    lens: Vec<usize>,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox").field("lens", &self.lens).finish()
    }
}

impl Inbox {
    fn new(slot: usize) -> Inbox {
        Inbox {
            buf: Vec::new(),
            slot,
            lens: Vec::with_capacity(SLOTS),
        }
    }

    /// Gives the buffers back to the allocator until the next [`fill`](Inbox::fill).
    fn release(&mut self) {
        self.buf = Vec::new();
        self.lens.clear();
    }

    /// Waits for a datagram, then takes every one already queued (up to [`SLOTS`]) in the
    /// same `recvmmsg` (`MSG_WAITFORONE`). Each datagram the kernel hands out lets it
    /// queue the next part of a dump (or its `NLMSG_DONE`) before the next one is taken,
    /// so a dump of a few parts, or the acks of many pipelined requests, arrive in one
    /// system call instead of one each.
    fn fill(&mut self, socket: &Socket) -> io::Result<()> {
        self.lens.clear();
        if self.buf.is_empty() {
            self.buf = vec![0; self.slot * SLOTS];
        }
        let mut headers = MultiHeaders::<()>::preallocate(SLOTS, None);
        let mut slots: Vec<[IoSliceMut<'_>; 1]> = self
            .buf
            .chunks_mut(self.slot)
            .map(|slot| [IoSliceMut::new(slot)])
            .collect();
        let received = recvmmsg(
            socket.as_raw_fd(),
            &mut headers,
            slots.iter_mut(),
            MsgFlags::MSG_WAITFORONE,
            None,
        )
        .map_err(io::Error::from)?;
        for datagram in received {
            if datagram.flags.contains(MsgFlags::MSG_TRUNC) {
                return Err(io::Error::other(format!(
                    "netlink datagram larger than {} bytes",
                    self.slot
                )));
            }
            self.lens.push(datagram.bytes.min(self.slot));
        }
        Ok(())
    }

    /// The datagrams taken by the last [`fill`](Inbox::fill).
    fn datagrams(&self) -> impl Iterator<Item = &[u8]> {
        self.lens
            .iter()
            .enumerate()
            .map(|(i, &len)| &self.buf[i * self.slot..i * self.slot + len])
    }
}

/// The datagram buffer of a [`NetlinkSocket::open_page_sized`] socket on pages of `page`
/// bytes.
pub(super) fn page_slot(page: usize) -> usize {
    let page = page.clamp(4096, PAGE_SLOT_MAX);
    if cfg!(target_pointer_width = "64") {
        page - SKB_SHARED_INFO_MIN
    } else {
        page
    }
}

impl NetlinkSocket {
    /// Opens a socket of `protocol` (e.g. `netlink_sys::protocols::NETLINK_GENERIC`) that
    /// takes datagrams of up to 32 KiB: the kernel fills each part of a long dump that far.
    pub fn open(protocol: isize) -> io::Result<NetlinkSocket> {
        NetlinkSocket::open_with(protocol, SLOT)
    }

    /// Opens a socket of `protocol` that takes datagrams of at most a page (8 KiB at most)
    /// less a socket buffer's overhead: for many short dumps (one service's destinations
    /// each) and acknowledgements.
    ///
    /// The kernel sizes the buffer of every dump part it makes for a socket to the largest
    /// receive buffer that socket has read with (up to 32 KiB), even for a dump of five
    /// records, and a dump of one part takes two buffers (the part, then its `NLMSG_DONE`),
    /// zeroed on kernels that clear memory on allocation (`init_on_alloc`, Debian's
    /// default). Measured in the VM at 10,000 services × 5 destinations: with 32 KiB
    /// buffers a quarter of a whole-table read went to clearing them, with page-sized
    /// ones still a sixth, as a page of data and the buffer's overhead take two pages.
    ///
    /// Read with less than `NLMSG_GOODSIZE` (a page, 8 KiB at most, less the overhead), the
    /// kernel makes parts of `NLMSG_GOODSIZE`: data and overhead in one page. This socket
    /// reads with a page less the least overhead a 64-bit kernel has (320 bytes: the
    /// buffer's shared info with the fewest fragments), never less than `NLMSG_GOODSIZE` and
    /// so never less than a part: the kernel makes parts of at most
    /// `max(NLMSG_GOODSIZE, buffer)`. A 32-bit process (whose kernel's overhead may be
    /// smaller) reads with a whole page.
    pub fn open_page_sized(protocol: isize) -> io::Result<NetlinkSocket> {
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|page| usize::try_from(page).ok())
            .unwrap_or(PAGE_SLOT_MAX);
        NetlinkSocket::open_with(protocol, page_slot(page))
    }

    fn open_with(protocol: isize, slot: usize) -> io::Result<NetlinkSocket> {
        let mut socket = Socket::new(protocol)?;
        configure(&mut socket)?;
        nix::sys::socket::setsockopt(
            &socket,
            nix::sys::socket::sockopt::ReceiveTimeout,
            &nix::sys::time::TimeVal::new(30, 0),
        )
        .map_err(io::Error::from)?;
        // The acks of one datagram are queued while it is sent, before any is read.
        let rcvbuf = nix::sys::socket::getsockopt(&socket, nix::sys::socket::sockopt::RcvBuf)
            .unwrap_or(RCVBUF);
        let chunk_requests = (rcvbuf / ACK_TRUESIZE).clamp(16, CHUNK_REQUESTS);
        Ok(NetlinkSocket {
            socket,
            sequence: 0,
            inbox: Inbox::new(slot),
            out: Vec::new(),
            chunk_requests,
        })
    }

    /// Turns on strict checking of dump requests (`NETLINK_GET_STRICT_CHK`, Linux 4.20 and
    /// later): the kernel then takes a dump request's header fields and attributes as
    /// filters (rtnetlink: an address dump of one link, a route dump of one table) and
    /// refuses those it cannot filter by, instead of ignoring them. Fails on a kernel
    /// without it, which dumps everything whatever the request says.
    pub fn set_strict_check(&mut self) -> io::Result<()> {
        self.socket.set_netlink_get_strict_chk(true)
    }

    /// Gives its receive and send buffers back to the allocator; the next request makes
    /// them again. For a socket kept between rare, large reads: a whole-table read fills
    /// every receive buffer of the socket that dumps the service list (32 × 32 KiB), which
    /// would otherwise stay resident until the next read.
    pub(crate) fn release_buffers(&mut self) {
        self.inbox.release();
        self.out = Vec::new();
    }

    /// The bytes its buffers hold (tests).
    #[cfg(test)]
    pub(crate) fn buffered_bytes(&self) -> usize {
        self.inbox.buf.capacity() + self.out.capacity()
    }

    /// The next sequence number (never 0).
    fn next_sequence(&mut self) -> u32 {
        self.sequence = self.sequence.wrapping_add(1).max(1);
        self.sequence
    }

    fn send_out(&mut self) -> io::Result<()> {
        let n = self.socket.send(&self.out, 0)?;
        if n != self.out.len() {
            return Err(io::Error::other(format!(
                "short netlink send: {n} of {} bytes",
                self.out.len()
            )));
        }
        Ok(())
    }

    /// Sends one request with `flags` and hands every reply message to `f` until the one
    /// that ends it. `Ok(Err(errno))`: the kernel refused it (`EINTR`: it sent no reply;
    /// a request that is not a dump goes with an acknowledged no-op barrier that shows it).
    fn exchange<P: NetlinkSerializable>(
        &mut self,
        payload: P,
        flags: u16,
        mut f: impl FnMut(&Reply<'_>),
    ) -> io::Result<Result<(), i32>> {
        let sequence = self.next_sequence();
        self.out.clear();
        push_message(&mut self.out, payload, flags, sequence);
        let barrier = needs_barrier(flags).then(|| {
            let barrier = self.next_sequence();
            push_message(&mut self.out, Barrier, NLM_F_REQUEST | NLM_F_ACK, barrier);
            barrier
        });
        self.send_out()?;
        let mut result = None;
        loop {
            self.inbox.fill(&self.socket)?;
            for reply in self.inbox.datagrams().flat_map(replies) {
                let end = reply.end();
                if Some(reply.header.sequence_number) == barrier {
                    if end != End::No {
                        // Every reply of the request came before this one.
                        return Ok(result.unwrap_or(Err(libc::EINTR)));
                    }
                    continue;
                }
                if reply.header.sequence_number != sequence || result.is_some() {
                    continue;
                }
                match end {
                    End::No => f(&reply),
                    End::Done => result = Some(Ok(())),
                    End::Errno(errno) => result = Some(Err(errno)),
                    End::Overrun => return Err(io::Error::from_raw_os_error(libc::ENOBUFS)),
                }
                if let (None, Some(result)) = (barrier, result) {
                    return Ok(result);
                }
            }
        }
    }

    /// Runs a dump (`NLM_F_DUMP`), handing every reply message to `f`. `Ok(Err(errno))`:
    /// the kernel refused or aborted it.
    pub fn dump<P: NetlinkSerializable>(
        &mut self,
        payload: P,
        f: impl FnMut(&Reply<'_>),
    ) -> io::Result<Result<(), i32>> {
        self.exchange(payload, NLM_F_REQUEST | NLM_F_DUMP, f)
    }

    /// Sends a request asking for an acknowledgement, handing the messages that come
    /// before it (e.g. the answer to a `GET`) to `f`. `Ok(Err(errno))`: the kernel
    /// refused it.
    pub fn request<P: NetlinkSerializable>(
        &mut self,
        payload: P,
        f: impl FnMut(&Reply<'_>),
    ) -> io::Result<Result<(), i32>> {
        self.exchange(payload, NLM_F_REQUEST | NLM_F_ACK, f)
    }

    /// Sends `messages` (each with its flags) as one datagram, exactly as given, then an
    /// acknowledged no-op barrier in a datagram of its own, and reads until the barrier's
    /// acknowledgement: every reply to the first datagram comes before it. For a netfilter
    /// batch (`NFNL_MSG_BATCH_BEGIN` .. `NFNL_MSG_BATCH_END`), which takes the whole
    /// datagram it begins, so no barrier may share it. `Ok(Err(errno))`: the first error a
    /// reply carried (the kernel reports every failing message of a batch, and a failed
    /// commit on its begin message); `Ok(Ok(()))`: no reply carried one.
    pub fn send_batch<P, I>(&mut self, messages: I) -> io::Result<Result<(), i32>>
    where
        P: NetlinkSerializable,
        I: IntoIterator<Item = (P, u16)>,
    {
        self.out.clear();
        for (message, flags) in messages {
            let sequence = self.next_sequence();
            push_message(&mut self.out, message, flags, sequence);
        }
        self.send_out()?;
        let barrier = self.next_sequence();
        self.out.clear();
        push_message(&mut self.out, Barrier, NLM_F_REQUEST | NLM_F_ACK, barrier);
        self.send_out()?;
        let mut result = Ok(());
        loop {
            self.inbox.fill(&self.socket)?;
            for reply in self.inbox.datagrams().flat_map(replies) {
                let end = reply.end();
                if reply.header.sequence_number == barrier && end != End::No {
                    return Ok(result);
                }
                match end {
                    End::Errno(errno) if result.is_ok() => result = Err(errno),
                    End::Overrun => return Err(io::Error::from_raw_os_error(libc::ENOBUFS)),
                    _ => {}
                }
            }
        }
    }

    /// Sends `requests` with as few `sendmsg` calls as the kernel allows (up to 160 KiB or
    /// 2,048 requests per datagram), each asking for an acknowledgement, and calls
    /// `answer` exactly once for every request with its tag, in order within a datagram.
    /// Each datagram ends with an acknowledged no-op barrier: a request the kernel sent no acknowledgement
    /// for is answered `Errno(EINTR)` once the barrier's comes, after the datagram's others.
    /// Requests are pulled from the iterator as they are sent. A datagram that fails to
    /// send or whose acks cannot be read fails only its own requests.
    pub fn pipeline<T, P, I>(&mut self, requests: I, mut answer: impl FnMut(T, Answer<'_>))
    where
        P: NetlinkSerializable,
        I: IntoIterator<Item = (T, P)>,
    {
        let mut requests = requests.into_iter().peekable();
        let mut tags: Vec<Option<T>> = Vec::new();
        while requests.peek().is_some() {
            self.out.clear();
            tags.clear();
            let first = self.sequence.wrapping_add(1).max(1);
            while self.out.len() < CHUNK_BYTES && tags.len() < self.chunk_requests {
                let Some((tag, payload)) = requests.next() else {
                    break;
                };
                // Sequence numbers of a chunk are consecutive, so that an ack maps back
                // to its request by subtraction (wrapping).
                let sequence = first.wrapping_add(tags.len() as u32);
                self.sequence = sequence;
                push_message(&mut self.out, payload, NLM_F_REQUEST | NLM_F_ACK, sequence);
                tags.push(Some(tag));
            }
            // The barrier's sequence number follows the chunk's.
            let barrier_index = tags.len();
            let barrier = first.wrapping_add(barrier_index as u32);
            self.sequence = barrier;
            push_message(&mut self.out, Barrier, NLM_F_REQUEST | NLM_F_ACK, barrier);
            if let Err(e) = self.send_out() {
                for tag in tags.drain(..).flatten() {
                    answer(tag, Answer::NotSent(&e));
                }
                continue;
            }
            let mut pending = tags.len();
            while pending > 0 {
                if let Err(e) = self.inbox.fill(&self.socket) {
                    for tag in tags.drain(..).flatten() {
                        answer(tag, Answer::Unanswered(&e));
                    }
                    break;
                }
                for reply in self.inbox.datagrams().flat_map(replies) {
                    let Some(result) = reply.ack() else {
                        continue;
                    };
                    let k = reply.header.sequence_number.wrapping_sub(first) as usize;
                    if k == barrier_index {
                        // The barrier: every acknowledgement of the chunk came before it.
                        for tag in tags.iter_mut().filter_map(Option::take) {
                            answer(tag, Answer::Errno(libc::EINTR));
                        }
                        pending = 0;
                        continue;
                    }
                    let Some(tag) = tags.get_mut(k).and_then(Option::take) else {
                        continue;
                    };
                    pending -= 1;
                    match result {
                        Ok(()) => answer(tag, Answer::Ack),
                        Err(errno) => answer(tag, Answer::Errno(errno)),
                    }
                }
            }
        }
    }
}

/// Binds and connects a new socket to the kernel, asks for small acks (no echo of the
/// request payload; best effort) and raises its receive buffer.
pub(super) fn configure(socket: &mut Socket) -> io::Result<()> {
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let _ = socket.set_cap_ack(true);
    tune_rcvbuf(socket);
    Ok(())
}

/// Raises a socket's receive buffer: `SO_RCVBUFFORCE` when privileged, else `SO_RCVBUF`.
fn tune_rcvbuf(socket: &Socket) {
    let forced =
        nix::sys::socket::setsockopt(socket, nix::sys::socket::sockopt::RcvBufForce, &RCVBUF);
    if forced.is_err() {
        let _ = socket.set_rx_buf_sz(RCVBUF);
    }
}
