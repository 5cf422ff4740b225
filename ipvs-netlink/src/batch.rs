//! Pipelined bulk changes: many requests per `sendmsg`, one result per operation.
//!
//! The kernel's netlink input path handles every message of a datagram in turn and acks
//! each (`NLM_F_ACK`), continuing after errors; acks are queued before `sendmsg` returns.
//! So a chunk of requests costs one send and a few receives, and acks are matched back to
//! operations by sequence number.

use crate::destination::{Destination, DestinationKey};
use crate::error::{Error, Object, Operation};
use crate::message::{EncodeError, IpvsMessage};
use crate::service::{Service, ServiceKey};
use crate::transport::{NLM_F_ACK, NLM_F_REQUEST, SyncSocket, encode_ipvs, parse_messages};

/// Most bytes of requests sent in one datagram (below the default 208 KiB send buffer).
const CHUNK_BYTES: usize = 160 * 1024;
/// Most requests per datagram, bounding the acks queued at once.
const CHUNK_OPS: usize = 2048;

/// One change in a [`batch`](crate::IpvsHandle::batch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Add a service.
    AddService(Service),
    /// Change a service's configuration.
    UpdateService(Service),
    /// Delete a service (and its destinations).
    DeleteService(ServiceKey),
    /// Add a destination to a service.
    AddDestination(ServiceKey, Destination),
    /// Change a destination.
    UpdateDestination(ServiceKey, Destination),
    /// Delete a destination.
    DeleteDestination(ServiceKey, DestinationKey),
}

impl Op {
    /// The operation kind, for errors.
    pub fn operation(&self) -> Operation {
        match self {
            Op::AddService(_) => Operation::AddService,
            Op::UpdateService(_) => Operation::UpdateService,
            Op::DeleteService(_) => Operation::DeleteService,
            Op::AddDestination(..) => Operation::AddDestination,
            Op::UpdateDestination(..) => Operation::UpdateDestination,
            Op::DeleteDestination(..) => Operation::DeleteDestination,
        }
    }

    /// The object the operation is about, for errors.
    pub fn object(&self) -> Object {
        match self {
            Op::AddService(s) | Op::UpdateService(s) => Object::ServiceConfig {
                key: s.key,
                scheduler: s.scheduler.name().to_owned(),
                pe: s.pe_name.clone(),
            },
            Op::DeleteService(k) => Object::Service(*k),
            Op::AddDestination(k, d) | Op::UpdateDestination(k, d) => {
                Object::Destination(*k, DestinationKey::from(d))
            }
            Op::DeleteDestination(k, d) => Object::Destination(*k, *d),
        }
    }

    /// Encodes the request, refusing what the kernel would refuse or store differently.
    pub fn encode(&self) -> Result<IpvsMessage, EncodeError> {
        match self {
            Op::AddService(s) => IpvsMessage::new_service(s),
            Op::UpdateService(s) => IpvsMessage::set_service(s),
            Op::DeleteService(k) => IpvsMessage::del_service(k),
            Op::AddDestination(k, d) => IpvsMessage::new_destination(k, d),
            Op::UpdateDestination(k, d) => IpvsMessage::set_destination(k, d),
            Op::DeleteDestination(k, d) => IpvsMessage::del_destination(k, d),
        }
    }
}

/// An I/O error for every op: the batch could not run.
pub(crate) fn failed_all(operations: &[Operation], why: &str) -> Vec<Result<(), Error>> {
    operations
        .iter()
        .map(|op| Err(Error::io(*op, std::io::Error::other(why.to_owned()))))
        .collect()
}

/// `results` made exactly one per op: missing answers become I/O errors, extra ones (never
/// produced by [`run`]) are dropped.
pub(crate) fn one_per_op(
    mut results: Vec<Result<(), Error>>,
    operations: &[Operation],
) -> Vec<Result<(), Error>> {
    results.truncate(operations.len());
    let answered = results.len();
    results.extend(failed_all(
        &operations[answered..],
        "no result for this operation",
    ));
    results
}

/// Runs `ops` on a blocking socket. Returns one result per op, in order.
pub(crate) fn run(socket: &mut SyncSocket, family: u16, ops: &[Op]) -> Vec<Result<(), Error>> {
    let mut results: Vec<Option<Result<(), Error>>> = (0..ops.len()).map(|_| None).collect();
    let mut buf = Vec::with_capacity(CHUNK_BYTES + 4096);
    // Indices of the ops in the current chunk; op k of the chunk has seq `first_seq + k`.
    let mut chunk: Vec<usize> = Vec::with_capacity(CHUNK_OPS);
    let mut first_seq = 0u32;
    for (i, op) in ops.iter().enumerate() {
        let msg = match op.encode() {
            Ok(m) => m,
            Err(e) => {
                results[i] = Some(Err(Error::from_encode(op.operation(), &op.object(), e)));
                continue;
            }
        };
        if chunk.is_empty() {
            first_seq = socket.next_seq();
        } else {
            socket.next_seq();
        }
        let seq = first_seq.wrapping_add(chunk.len() as u32);
        encode_ipvs(&mut buf, family, NLM_F_REQUEST | NLM_F_ACK, seq, &msg);
        chunk.push(i);
        if buf.len() >= CHUNK_BYTES || chunk.len() >= CHUNK_OPS {
            flush_chunk(socket, ops, &buf, &chunk, first_seq, &mut results);
            buf.clear();
            chunk.clear();
        }
    }
    if !chunk.is_empty() {
        flush_chunk(socket, ops, &buf, &chunk, first_seq, &mut results);
    }
    results
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            r.unwrap_or_else(|| {
                Err(Error::io(
                    ops[i].operation(),
                    std::io::Error::other("no acknowledgement from the kernel"),
                ))
            })
        })
        .collect()
}

fn flush_chunk(
    socket: &mut SyncSocket,
    ops: &[Op],
    buf: &[u8],
    chunk: &[usize],
    first_seq: u32,
    results: &mut [Option<Result<(), Error>>],
) {
    if let Err(e) = socket.send(buf) {
        let errno = e.raw_os_error();
        for &i in chunk {
            results[i] = Some(Err(match errno {
                Some(n) => Error::from_errno(ops[i].operation(), &ops[i].object(), n),
                None => Error::io(ops[i].operation(), std::io::Error::other(e.to_string())),
            }));
        }
        return;
    }
    let mut pending = chunk.len();
    while pending > 0 {
        let data = match socket.recv() {
            Ok(d) => d,
            Err(e) => {
                for &i in chunk {
                    if results[i].is_none() {
                        results[i] = Some(Err(Error::io(
                            ops[i].operation(),
                            std::io::Error::other(format!("waiting for acknowledgements: {e}")),
                        )));
                    }
                }
                return;
            }
        };
        for m in parse_messages(data) {
            let Some((code, seq)) = m.error_code() else {
                continue;
            };
            let k = seq.wrapping_sub(first_seq) as usize;
            let Some(&i) = chunk.get(k) else {
                continue;
            };
            if results[i].is_some() {
                continue;
            }
            results[i] = Some(if code == 0 {
                Ok(())
            } else {
                Err(Error::from_errno(
                    ops[i].operation(),
                    &ops[i].object(),
                    code.saturating_neg(),
                ))
            });
            pending -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_made_one_per_op() {
        let ops = [
            Operation::AddService,
            Operation::AddDestination,
            Operation::DeleteService,
        ];
        let r = one_per_op(vec![Ok(())], &ops);
        assert_eq!(r.len(), 3);
        assert!(r[0].is_ok());
        assert!(matches!(
            r[2],
            Err(Error::Io {
                op: Operation::DeleteService,
                ..
            })
        ));
        assert_eq!(one_per_op((0..5).map(|_| Ok(())).collect(), &ops).len(), 3);
        let failed = failed_all(&ops, "worker died");
        assert_eq!(failed.len(), 3);
        assert!(matches!(
            failed[1],
            Err(Error::Io {
                op: Operation::AddDestination,
                ..
            })
        ));
    }
}
