//! Pipelined bulk changes: many requests per `sendmsg`, one result per operation.
//!
//! The kernel's netlink input path handles every message of a datagram in turn and acks
//! each (`NLM_F_ACK`), continuing after errors; acks are queued before `sendmsg` returns.
//! So a chunk of requests costs one send and a few receives, and acks are matched back to
//! operations by sequence number.

use crate::destination::{Destination, DestinationKey};
use crate::error::{Error, Object, Operation};
use crate::message;
use crate::message::{EncodeError, IpvsMessage};
use crate::service::{Service, ServiceKey};
use crate::transport::{Answer, NetlinkSocket};

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

/// Runs `ops` on a blocking socket, pipelined. Returns one result per op, in order.
pub(crate) fn run(socket: &mut NetlinkSocket, family: u16, ops: &[Op]) -> Vec<Result<(), Error>> {
    let mut results: Vec<Option<Result<(), Error>>> = (0..ops.len()).map(|_| None).collect();
    let mut refused = Vec::new();
    let requests = ops
        .iter()
        .enumerate()
        .filter_map(|(i, op)| match op.encode() {
            Ok(msg) => Some((i, message::genl(family, msg))),
            Err(e) => {
                refused.push((i, Error::from_encode(op.operation(), &op.object(), e)));
                None
            }
        });
    socket.pipeline(requests, |i, answer| {
        let op = &ops[i];
        results[i] = Some(match answer {
            Answer::Ack => Ok(()),
            Answer::Errno(errno) => Err(Error::from_errno(op.operation(), &op.object(), errno)),
            Answer::NotSent(e) => Err(match e.raw_os_error() {
                Some(errno) => Error::from_errno(op.operation(), &op.object(), errno),
                None => Error::io(op.operation(), std::io::Error::other(e.to_string())),
            }),
            Answer::Unanswered(e) => Err(Error::io(
                op.operation(),
                std::io::Error::other(format!("waiting for acknowledgements: {e}")),
            )),
        });
    });
    for (i, e) in refused {
        results[i] = Some(Err(e));
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
