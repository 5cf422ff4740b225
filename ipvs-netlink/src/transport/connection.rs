//! The async connection: one non-blocking socket driven by a future the caller spawns,
//! many requests in flight at once, replies routed back by sequence number.

use std::collections::HashMap;
use std::io;

use netlink_packet_core::{NetlinkBuffer, NetlinkSerializable};
use netlink_sys::{AsyncSocket, AsyncSocketExt, TokioSocket};
use tokio::sync::mpsc;

use super::socket::{DATAGRAM, configure};
use super::{End, push_message, replies};

/// What a request gets back, in order: its data messages, then exactly one end.
#[derive(Debug)]
pub(crate) enum Part {
    /// A data message's payload (what follows the netlink header).
    Data(Vec<u8>),
    /// `NLMSG_DONE` or an acknowledgement.
    Done,
    /// The kernel refused the request with this errno (positive).
    Errno(i32),
    /// The socket failed (or lost messages) while the request was in flight.
    Failed(io::Error),
}

/// A request for the connection: the encoded message (its sequence number is set when it
/// is sent) and where its replies go.
struct Request {
    bytes: Vec<u8>,
    replies: mpsc::UnboundedSender<Part>,
}

/// Sends requests to a [`Connection`]. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionHandle {
    requests: mpsc::UnboundedSender<Request>,
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
            .send(Request { bytes, replies: tx })
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "netlink connection closed"))?;
        Ok(rx)
    }
}

/// The socket and the requests in flight. [`run`](Connection::run) ends once every
/// [`ConnectionHandle`] is dropped and every request in flight is answered.
pub(crate) struct Connection {
    socket: TokioSocket,
    requests: mpsc::UnboundedReceiver<Request>,
    pending: HashMap<u32, mpsc::UnboundedSender<Part>>,
    sequence: u32,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
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
        Ok((
            Connection {
                socket,
                requests: rx,
                pending: HashMap::new(),
                sequence: 0,
                buf: Vec::with_capacity(DATAGRAM),
            },
            ConnectionHandle { requests: tx },
        ))
    }

    /// Moves requests to the kernel and replies back until every handle is gone and
    /// nothing is in flight.
    pub(crate) async fn run(mut self) {
        let mut open = true;
        loop {
            if !open && self.pending.is_empty() {
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
                Event::Received(Ok(())) => self.route(),
                Event::Received(Err(e)) => self.fail_all(&e),
            }
        }
    }

    async fn send(&mut self, mut request: Request) {
        self.sequence = self.sequence.wrapping_add(1).max(1);
        let sequence = self.sequence;
        if let Ok(mut header) = NetlinkBuffer::new_checked(&mut request.bytes[..]) {
            header.set_sequence_number(sequence);
        }
        match self.socket.send(&request.bytes).await {
            Ok(_) => {
                self.pending.insert(sequence, request.replies);
            }
            Err(e) => {
                let _ = request.replies.send(Part::Failed(e));
            }
        }
    }

    fn route(&mut self) {
        let mut overrun = false;
        for reply in replies(&self.buf) {
            let sequence = reply.header.sequence_number;
            let Some(tx) = self.pending.get(&sequence) else {
                continue;
            };
            let (part, last) = match reply.end() {
                End::No => (Part::Data(reply.payload.to_vec()), false),
                End::Done => (Part::Done, true),
                End::Errno(errno) => (Part::Errno(errno), true),
                End::Overrun => {
                    overrun = true;
                    continue;
                }
            };
            // A receiver that went away (a dropped stream) needs nothing more.
            if tx.send(part).is_err() || last {
                self.pending.remove(&sequence);
            }
        }
        if overrun {
            self.fail_all(&io::Error::from_raw_os_error(libc::ENOBUFS));
        }
    }

    /// Fails every request in flight: their replies may be lost.
    fn fail_all(&mut self, e: &io::Error) {
        for (_, tx) in self.pending.drain() {
            let error = match e.raw_os_error() {
                Some(errno) => io::Error::from_raw_os_error(errno),
                None => io::Error::new(e.kind(), e.to_string()),
            };
            let _ = tx.send(Part::Failed(error));
        }
    }
}
