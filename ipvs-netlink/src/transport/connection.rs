//! The async connection: one non-blocking socket driven by a future the caller spawns,
//! many requests in flight at once, replies routed back by sequence number.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use netlink_packet_core::{NLM_F_ACK, NLM_F_REQUEST, NetlinkBuffer, NetlinkSerializable};
use netlink_sys::{AsyncSocket, AsyncSocketExt, TokioSocket};
use tokio::sync::mpsc;

use super::socket::{DATAGRAM, configure};
use super::{Barrier, End, needs_barrier, push_message, replies};

/// What a request gets back, in order: its data messages, then exactly one end.
#[derive(Debug)]
pub(crate) enum Part {
    /// A data message's payload (what follows the netlink header).
    Data(Vec<u8>),
    /// `NLMSG_DONE` or an acknowledgement.
    Done,
    /// The kernel refused the request with this errno (positive); `EINTR` when it sent no
    /// reply at all (see [the module documentation](super)).
    Errno(i32),
    /// The socket failed (or lost messages) while the request was in flight.
    Failed(io::Error),
}

/// A request for the connection: the encoded message (its sequence number is set when it
/// is sent) and where its replies go.
struct Request {
    bytes: Vec<u8>,
    /// Whether a [`Barrier`] goes behind it.
    barrier: bool,
    replies: mpsc::UnboundedSender<Part>,
}

/// Sends requests to a [`Connection`]. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionHandle {
    requests: mpsc::UnboundedSender<Request>,
    counts: Arc<Counts>,
}

/// What a connection has done so far, for diagnostics: a request stuck in the kernel
/// (entered `sendmsg`, never left it) looks different from one whose reply never came
/// (sent, not ended) or one the connection never took (queued, not sending).
#[derive(Debug, Default)]
pub(crate) struct Counts {
    /// Requests handed to the connection.
    queued: AtomicU64,
    /// Requests whose `sendmsg` was entered.
    sending: AtomicU64,
    /// Requests whose `sendmsg` returned (successfully or not).
    sent: AtomicU64,
    /// Requests that got their end (done, an errno or a failure).
    ended: AtomicU64,
    /// Datagrams received.
    datagrams: AtomicU64,
    /// Reply messages whose sequence number no request in flight had.
    unmatched: AtomicU64,
    /// Requests the kernel sent no reply for (ended by their barrier).
    unanswered: AtomicU64,
    /// The sequence number of the last request sent.
    last_sequence: AtomicU64,
}

impl Counts {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        write!(
            f,
            "requests queued {}, in sendmsg {}, sent {}, ended {} (last sequence {}); \
             datagrams received {}, unmatched replies {}, unanswered requests {}",
            get(&self.queued),
            get(&self.sending).saturating_sub(get(&self.sent)),
            get(&self.sent),
            get(&self.ended),
            get(&self.last_sequence),
            get(&self.datagrams),
            get(&self.unmatched),
            get(&self.unanswered),
        )
    }
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("len", &self.bytes.len())
            .finish()
    }
}

impl ConnectionHandle {
    /// Queues a request with `flags`; its replies arrive on the returned channel.
    pub(crate) fn request<P: NetlinkSerializable>(
        &self,
        payload: P,
        flags: u16,
    ) -> io::Result<mpsc::UnboundedReceiver<Part>> {
        let mut bytes = Vec::new();
        push_message(&mut bytes, payload, flags, 0);
        let (tx, rx) = mpsc::unbounded_channel();
        self.requests
            .send(Request {
                bytes,
                barrier: needs_barrier(flags),
                replies: tx,
            })
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "netlink connection closed"))?;
        Counts::bump(&self.counts.queued);
        Ok(rx)
    }

    /// What the connection has done so far (see [`Counts`]).
    pub(crate) fn counts(&self) -> &Counts {
        &self.counts
    }
}

/// The socket and the requests in flight. [`run`](Connection::run) ends once every
/// [`ConnectionHandle`] is dropped and every request in flight is answered.
pub(crate) struct Connection {
    socket: TokioSocket,
    requests: mpsc::UnboundedReceiver<Request>,
    in_flight: InFlight,
    sequence: u32,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("in_flight", &self.in_flight.pending.len())
            .finish_non_exhaustive()
    }
}

/// What a sequence number in flight stands for.
#[derive(Debug)]
enum Awaited {
    /// A request: its replies go here.
    Request(mpsc::UnboundedSender<Part>),
    /// The [`Barrier`] sent behind the request with this sequence number.
    Barrier { behind: u32 },
}

/// The sequence numbers in flight and where their replies go.
#[derive(Debug)]
pub(crate) struct InFlight {
    pending: HashMap<u32, Awaited>,
    counts: Arc<Counts>,
}

impl InFlight {
    pub(super) fn new(counts: Arc<Counts>) -> InFlight {
        InFlight {
            pending: HashMap::new(),
            counts,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Awaits the replies of the request sent with `sequence`, and the acknowledgement
    /// of its barrier sent with `barrier`, if any.
    pub(super) fn sent(
        &mut self,
        sequence: u32,
        barrier: Option<u32>,
        replies: mpsc::UnboundedSender<Part>,
    ) {
        self.pending.insert(sequence, Awaited::Request(replies));
        if let Some(barrier) = barrier {
            self.pending
                .insert(barrier, Awaited::Barrier { behind: sequence });
        }
    }

    /// Ends a request with `part`.
    fn end(&mut self, sequence: u32, part: Part) {
        if let Some(Awaited::Request(tx)) = self.pending.remove(&sequence) {
            Counts::bump(&self.counts.ended);
            let _ = tx.send(part);
        }
    }

    /// Hands the messages of one datagram to their requests. Returns `false` when the
    /// kernel reported lost messages (`NLMSG_OVERRUN`).
    pub(super) fn route(&mut self, datagram: &[u8]) -> bool {
        Counts::bump(&self.counts.datagrams);
        let mut intact = true;
        for reply in replies(datagram) {
            let sequence = reply.header.sequence_number;
            let end = reply.end();
            let tx = match self.pending.get(&sequence) {
                None => {
                    Counts::bump(&self.counts.unmatched);
                    continue;
                }
                Some(Awaited::Barrier { behind }) => {
                    if end != End::No {
                        let behind = *behind;
                        self.pending.remove(&sequence);
                        if self.pending.contains_key(&behind) {
                            // Every reply of the request would have come before this one.
                            Counts::bump(&self.counts.unanswered);
                            self.end(behind, Part::Errno(libc::EINTR));
                        }
                    }
                    continue;
                }
                Some(Awaited::Request(tx)) => tx,
            };
            let (part, last) = match end {
                End::No => (Part::Data(reply.payload.to_vec()), false),
                End::Done => (Part::Done, true),
                End::Errno(errno) => (Part::Errno(errno), true),
                End::Overrun => {
                    intact = false;
                    continue;
                }
            };
            // A receiver that went away (a dropped stream) needs nothing more.
            if tx.send(part).is_err() || last {
                self.pending.remove(&sequence);
                Counts::bump(&self.counts.ended);
            }
        }
        intact
    }

    /// Fails every request in flight: their replies may be lost.
    fn fail_all(&mut self, e: &io::Error) {
        for (_, awaited) in self.pending.drain() {
            let Awaited::Request(tx) = awaited else {
                continue;
            };
            Counts::bump(&self.counts.ended);
            let error = match e.raw_os_error() {
                Some(errno) => io::Error::from_raw_os_error(errno),
                None => io::Error::new(e.kind(), e.to_string()),
            };
            let _ = tx.send(Part::Failed(error));
        }
    }
}

enum Event {
    Request(Option<Request>),
    Received(io::Result<()>),
}

impl Connection {
    /// A connection on a new non-blocking socket of `protocol`, configured like
    /// [`NetlinkSocket`](super::NetlinkSocket)'s, in the calling thread's network
    /// namespace. Must be called within a tokio runtime.
    pub(crate) fn open(protocol: isize) -> io::Result<(Connection, ConnectionHandle)> {
        let mut socket = TokioSocket::new(protocol)?;
        configure(socket.socket_mut())?;
        let (tx, rx) = mpsc::unbounded_channel();
        let counts = Arc::new(Counts::default());
        Ok((
            Connection {
                socket,
                requests: rx,
                in_flight: InFlight::new(counts.clone()),
                sequence: 0,
                buf: Vec::with_capacity(DATAGRAM),
            },
            ConnectionHandle {
                requests: tx,
                counts,
            },
        ))
    }

    /// Moves requests to the kernel and replies back until every handle is gone and
    /// nothing is in flight.
    pub(crate) async fn run(mut self) {
        let mut open = true;
        loop {
            if !open && self.in_flight.is_empty() {
                return;
            }
            self.buf.clear();
            self.buf.reserve(DATAGRAM);
            let event = tokio::select! {
                r = self.requests.recv(), if open => Event::Request(r),
                r = self.socket.recv(&mut self.buf) => Event::Received(r),
            };
            match event {
                Event::Request(Some(request)) => self.send(request).await,
                Event::Request(None) => open = false,
                Event::Received(Ok(())) => {
                    if !self.in_flight.route(&self.buf) {
                        self.in_flight
                            .fail_all(&io::Error::from_raw_os_error(libc::ENOBUFS));
                    }
                }
                Event::Received(Err(e)) => self.in_flight.fail_all(&e),
            }
        }
    }

    fn next_sequence(&mut self) -> u32 {
        self.sequence = self.sequence.wrapping_add(1).max(1);
        self.sequence
    }

    async fn send(&mut self, mut request: Request) {
        let sequence = self.next_sequence();
        if let Ok(mut header) = NetlinkBuffer::new_checked(&mut request.bytes[..]) {
            header.set_sequence_number(sequence);
        }
        let barrier = request.barrier.then(|| {
            let barrier = self.next_sequence();
            push_message(
                &mut request.bytes,
                Barrier,
                NLM_F_REQUEST | NLM_F_ACK,
                barrier,
            );
            barrier
        });
        let counts = &self.in_flight.counts;
        counts
            .last_sequence
            .store(u64::from(sequence), Ordering::Relaxed);
        Counts::bump(&counts.sending);
        let sent = self.socket.send(&request.bytes).await;
        Counts::bump(&self.in_flight.counts.sent);
        match sent {
            Ok(_) => self.in_flight.sent(sequence, barrier, request.replies),
            Err(e) => {
                Counts::bump(&self.in_flight.counts.ended);
                let _ = request.replies.send(Part::Failed(e));
            }
        }
    }
}
