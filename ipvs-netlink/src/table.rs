//! Reading the whole table on blocking sockets: the service list (verified against the
//! kernel's cross-namespace dump flaw, or a single dump) on a socket that takes the kernel's
//! largest datagrams, and every service's destinations on page-sized sockets (see
//! [`NetlinkSocket::open_page_sized`]), dumped in parallel while the service list is still
//! being verified.
//!
//! The kernel resumes a multi-part service dump by a position that counts the services of
//! every network namespace, so IPVS changes in another namespace during a dump can make it
//! repeat and skip services of ours. A disturbed dump never shows a service that does not
//! exist, so dumps are merged (the latest configuration of each key wins) until
//! [`QUIET_DUMPS`] dumps in a row bring no key and no configuration that the earlier ones
//! had not shown. Only the first dump is decoded whole; later ones are compared with it
//! record by record on their raw bytes (key and configuration, statistics aside), and only
//! a record that differs is decoded. Services merged from earlier dumps but absent from the
//! last one (skipped by it, or deleted meanwhile) are then read one by one with
//! `GET_SERVICE`, which is exact.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::{Condvar, Mutex};

use crate::destination::DestinationEntry;
use crate::error::{Error, Object, Operation};
use crate::message::{self, IpvsMessage, WireError, record};
use crate::service::{ServiceEntry, ServiceKey};
use crate::transport::NetlinkSocket;

/// Every service with its destinations, as [`IpvsHandle::table`](crate::IpvsHandle::table) returns it.
pub type Table = Vec<(ServiceEntry, Vec<DestinationEntry>)>;

/// The service list read by [`IpvsHandle::services_verified`](crate::IpvsHandle::services_verified).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifiedServices {
    /// Every service, sorted by key.
    pub services: Vec<ServiceEntry>,
    /// How many service dumps were made.
    pub attempts: u32,
    /// Whether two service dumps in a row agreed with the earlier ones (as
    /// [`VerifiedTable::verified`]).
    pub verified: bool,
}

/// A table read by [`IpvsHandle::table_verified`](crate::IpvsHandle::table_verified).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifiedTable {
    /// Every service with its destinations, sorted by service key.
    pub table: Table,
    /// How many service dumps were made.
    pub attempts: u32,
    /// Whether two service dumps in a row agreed with the earlier ones (brought no key and
    /// no configuration they had not shown). `false` when that did not happen within
    /// [`MAX_TABLE_ATTEMPTS`](crate::MAX_TABLE_ATTEMPTS) dumps, and for a single dump ([`IpvsHandle::table_best_effort`](crate::IpvsHandle::table_best_effort)).
    pub verified: bool,
}

/// Consecutive service dumps that must add nothing before a merged read counts as complete.
/// One quiet dump could repeat what the previous one skipped (both resumed at positions
/// shifted the same way).
const QUIET_DUMPS: u32 = 2;

/// What a service dump showed of one key.
#[derive(Debug)]
struct Known {
    /// The configuration bytes last shown (see [`record::split_service`]).
    config: Vec<u8>,
    /// The decoded key.
    key: ServiceKey,
    /// The last dump (1-based) that showed it.
    seen_in: u32,
}

/// The service dumps merged so far.
#[derive(Debug, Default)]
struct Merge {
    /// By raw key bytes.
    known: HashMap<Vec<u8>, Known>,
    /// The services, with the latest configuration shown.
    services: BTreeMap<ServiceKey, ServiceEntry>,
    /// Dumps begun.
    attempts: u32,
    /// Dumps in a row that brought nothing new.
    quiet: u32,
    /// Whether the current dump brought a new key or configuration.
    news: bool,
}

impl Merge {
    fn begin_dump(&mut self) {
        self.attempts += 1;
        self.news = false;
    }

    /// Takes one record of the current dump; `decode` is called only for a record that
    /// brings something new. Returns the key when it was never seen before.
    fn record(
        &mut self,
        key: &[u8],
        config: &[u8],
        decode: impl FnOnce() -> Result<ServiceEntry, WireError>,
    ) -> Result<Option<ServiceKey>, WireError> {
        let attempt = self.attempts;
        if let Some(known) = self.known.get_mut(key) {
            known.seen_in = attempt;
            if known.config == config {
                return Ok(None);
            }
            let entry = decode()?;
            known.config = config.to_vec();
            self.news = true;
            self.services.insert(entry.service.key, entry);
            return Ok(None);
        }
        let entry = decode()?;
        let service_key = entry.service.key;
        self.known.insert(
            key.to_vec(),
            Known {
                config: config.to_vec(),
                key: service_key,
                seen_in: attempt,
            },
        );
        self.news = true;
        self.services.insert(service_key, entry);
        Ok(Some(service_key))
    }

    /// Takes one record of a dump that is the only one (a best-effort read): nothing is
    /// compared with it later, so neither its raw bytes nor their index are kept. Returns the
    /// key when it was not shown before (a disturbed dump can repeat one).
    fn record_only(&mut self, entry: ServiceEntry) -> Option<ServiceKey> {
        let key = entry.service.key;
        self.news = true;
        self.services.insert(key, entry).is_none().then_some(key)
    }

    /// Ends the current dump; `true` when no further dump is needed.
    fn end_dump(&mut self, max_attempts: u32) -> bool {
        self.quiet = if self.attempts > 1 && !self.news {
            self.quiet + 1
        } else {
            0
        };
        self.verified() || self.attempts >= max_attempts.max(1)
    }

    fn verified(&self) -> bool {
        self.quiet >= QUIET_DUMPS
    }

    /// Keys merged from earlier dumps that the last one did not show.
    fn unconfirmed(&self) -> Vec<ServiceKey> {
        if self.attempts <= 1 {
            return Vec::new();
        }
        self.known
            .values()
            .filter(|k| k.seen_in != self.attempts)
            .map(|k| k.key)
            .collect()
    }

    /// The exact answer for an unconfirmed key: its entry, or `None` when it is gone.
    fn settle(&mut self, key: ServiceKey, entry: Option<ServiceEntry>) {
        match entry {
            Some(entry) => {
                self.services.insert(key, entry);
            }
            None => {
                self.services.remove(&key);
                self.known.retain(|_, k| k.key != key);
            }
        }
    }
}

/// The keys whose destinations are to be dumped, handed out to the workers as they come.
#[derive(Debug, Default)]
struct Queue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

#[derive(Debug, Default)]
struct QueueState {
    keys: Vec<ServiceKey>,
    next: usize,
    /// No more keys will come.
    closed: bool,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, keys: &[ServiceKey]) {
        if keys.is_empty() {
            return;
        }
        self.lock().keys.extend_from_slice(keys);
        self.ready.notify_all();
    }

    /// No more keys: the workers finish what is queued. With `abandon`, they stop at once.
    fn close(&self, abandon: bool) {
        let mut state = self.lock();
        state.closed = true;
        if abandon {
            state.next = state.keys.len();
        }
        drop(state);
        self.ready.notify_all();
    }

    /// The next key, waiting for one while the queue is open; `None` once it is closed and
    /// drained.
    fn take(&self) -> Option<ServiceKey> {
        let mut state = self.lock();
        loop {
            if let Some(&key) = state.keys.get(state.next) {
                state.next += 1;
                return Some(key);
            }
            if state.closed {
                return None;
            }
            state = self.ready.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Reads the table: the service list with up to `max_attempts` dumps on `lister` (a single,
/// unverified dump with 1), every service's destinations on `sockets`, one thread each; the
/// calling thread dumps the services, then takes the first of `sockets`.
pub(crate) fn read(
    lister: &mut NetlinkSocket,
    sockets: &mut [NetlinkSocket],
    family: u16,
    max_attempts: u32,
) -> Result<VerifiedTable, Error> {
    let Some((first, others)) = sockets.split_first_mut() else {
        return Err(Error::io(
            Operation::ListServices,
            io::Error::other("no socket to read the table with"),
        ));
    };
    let queue = Queue::default();
    let (services, destinations) = with_destination_workers(first, others, family, &queue, || {
        let services = read_services(lister, family, max_attempts, &queue);
        queue.close(services.is_err());
        services
    });
    let merge = services?;
    let destinations = destinations?;
    let verified = merge.verified();
    let attempts = merge.attempts;
    let table = join(merge.services.into_values(), destinations);
    Ok(VerifiedTable {
        table,
        attempts,
        verified,
    })
}

/// Reads the service list alone on `lister`, with up to `max_attempts` dumps merged as a
/// table read's are.
pub(crate) fn read_service_list(
    lister: &mut NetlinkSocket,
    family: u16,
    max_attempts: u32,
) -> Result<VerifiedServices, Error> {
    // Nobody takes the keys: no destination is dumped.
    let queue = Queue::default();
    let merge = read_services(lister, family, max_attempts, &queue)?;
    Ok(VerifiedServices {
        verified: merge.verified(),
        attempts: merge.attempts,
        services: merge.services.into_values().collect(),
    })
}

/// The destinations of services already read, dumped on `sockets`, one thread each (the
/// calling thread takes the first): the table of `services`, sorted by key, each once (a
/// dump disturbed by another namespace may have shown one twice).
pub(crate) fn read_destinations(
    sockets: &mut [NetlinkSocket],
    family: u16,
    mut services: Vec<ServiceEntry>,
) -> Result<Table, Error> {
    let Some((first, others)) = sockets.split_first_mut() else {
        return Err(Error::io(
            Operation::ListDestinations,
            io::Error::other("no socket to dump destinations with"),
        ));
    };
    services.sort_unstable_by_key(|entry| entry.service.key);
    services.dedup_by_key(|entry| entry.service.key);
    let keys: Vec<ServiceKey> = services.iter().map(|entry| entry.service.key).collect();
    let queue = Queue::default();
    queue.push(&keys);
    queue.close(false);
    let ((), destinations) = with_destination_workers(first, others, family, &queue, || ());
    Ok(join(services, destinations?))
}

/// Runs `meanwhile` while a destination worker on each of `others` dumps the destinations
/// of the keys `queue` hands out; then the calling thread dumps on `first` too, until the
/// queue is closed and drained. What `meanwhile` returned, and every worker's dumps (the
/// first error, if any).
fn with_destination_workers<T>(
    first: &mut NetlinkSocket,
    others: &mut [NetlinkSocket],
    family: u16,
    queue: &Queue,
    meanwhile: impl FnOnce() -> T,
) -> (T, Result<Dumps, Error>) {
    std::thread::scope(|scope| {
        let workers: Vec<_> = others
            .iter_mut()
            .map(|socket| scope.spawn(move || destinations_worker(socket, family, queue)))
            .collect();
        let done = meanwhile();
        let mut dumps = destinations_worker(first, family, queue);
        for worker in workers {
            let part = worker.join().unwrap_or_else(|_| {
                Err(Error::io(
                    Operation::ListDestinations,
                    io::Error::other("dump worker panicked"),
                ))
            });
            dumps = match (dumps, part) {
                (Ok(mut dumps), Ok(part)) => {
                    dumps.extend(part);
                    Ok(dumps)
                }
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
        }
        (done, dumps)
    })
}

/// Each service's dumped destinations, as a worker made them.
type Dumps = Vec<(ServiceKey, Vec<DestinationEntry>)>;

/// Every service of `services` (sorted by key) with its dumped destinations (none when it
/// has no dump). The dumps are sorted as the service list is and joined with it in one
/// pass, instead of hashing every key into a map made for the purpose and out again; a
/// dump whose service left the list (deleted while the list was verified) is dropped.
fn join(services: impl IntoIterator<Item = ServiceEntry>, mut destinations: Dumps) -> Table {
    destinations.sort_unstable_by_key(|(key, _)| *key);
    let mut destinations = destinations.into_iter().peekable();
    services
        .into_iter()
        .map(|entry| {
            let key = entry.service.key;
            while destinations.next_if(|(dumped, _)| *dumped < key).is_some() {}
            let dests = destinations
                .next_if(|(dumped, _)| *dumped == key)
                .map(|(_, dests)| dests)
                .unwrap_or_default();
            (entry, dests)
        })
        .collect()
}

/// Reads the service list on `socket`, queueing new keys for the destination workers.
fn read_services(
    socket: &mut NetlinkSocket,
    family: u16,
    max_attempts: u32,
    queue: &Queue,
) -> Result<Merge, Error> {
    let op = Operation::ListServices;
    // Both closures need the socket, never at the same time.
    let socket = std::cell::RefCell::new(socket);
    merge_dumps(
        max_attempts,
        |each| {
            let answer = socket
                .borrow_mut()
                .dump(
                    message::genl(family, IpvsMessage::get_services()),
                    |reply| each(record::service_record(reply.payload)),
                )
                .map_err(|e| Error::io(op, e))?;
            answer.map_err(|errno| Error::from_errno(op, &Object::Table, errno))
        },
        |key| get_service(&mut socket.borrow_mut(), family, key),
        |keys| queue.push(keys),
    )
}

/// Dumps services until the merge is complete (or `max_attempts` dumps), handing every
/// new key to `found` as soon as it is seen (in batches), then reads the unconfirmed ones
/// with `get`. `dump` runs one dump, calling its argument with every service record.
fn merge_dumps(
    max_attempts: u32,
    mut dump: impl FnMut(&mut dyn FnMut(Result<&[u8], WireError>)) -> Result<(), Error>,
    mut get: impl FnMut(&ServiceKey) -> Result<Option<ServiceEntry>, Error>,
    mut found: impl FnMut(&[ServiceKey]),
) -> Result<Merge, Error> {
    let op = Operation::ListServices;
    let mut merge = Merge::default();
    let (mut key, mut config) = (Vec::new(), Vec::new());
    let mut fresh = Vec::new();
    loop {
        merge.begin_dump();
        let mut bad = None;
        dump(&mut |rec| {
            if bad.is_some() {
                return;
            }
            let result = rec.and_then(|rec| {
                if max_attempts <= 1 {
                    return record::decode_service(rec).map(|entry| merge.record_only(entry));
                }
                record::split_service(rec, &mut key, &mut config)?;
                merge.record(&key, &config, || record::decode_service(rec))
            });
            match result {
                Ok(Some(new)) => {
                    fresh.push(new);
                    // Hand keys out in batches, not one lock per service.
                    if fresh.len() >= 64 {
                        found(&fresh);
                        fresh.clear();
                    }
                }
                Ok(None) => {}
                Err(e) => bad = Some(e),
            }
        })?;
        if let Some(source) = bad {
            return Err(Error::Decode { op, source });
        }
        if !fresh.is_empty() {
            found(&fresh);
            fresh.clear();
        }
        if merge.end_dump(max_attempts) {
            break;
        }
    }
    for key in merge.unconfirmed() {
        let entry = get(&key)?;
        merge.settle(key, entry);
    }
    Ok(merge)
}

/// One service read with `GET_SERVICE` (exact, unaffected by the dump flaw); `None` when
/// it does not exist.
fn get_service(
    socket: &mut NetlinkSocket,
    family: u16,
    key: &ServiceKey,
) -> Result<Option<ServiceEntry>, Error> {
    let op = Operation::GetService;
    let object = Object::Service(*key);
    let msg = IpvsMessage::get_service(key).map_err(|e| Error::from_encode(op, &object, e))?;
    let mut found = None;
    let answer = socket
        .request(message::genl(family, msg), |reply| {
            if found.is_none() {
                found =
                    Some(record::service_record(reply.payload).and_then(record::decode_service));
            }
        })
        .map_err(|e| Error::io(op, e))?;
    match answer {
        Err(errno) => match Error::from_errno(op, &object, errno) {
            e if e.is_not_found() => Ok(None),
            e => Err(e),
        },
        Ok(()) => match found {
            Some(Ok(entry)) => Ok(Some(entry)),
            Some(Err(source)) => Err(Error::Decode { op, source }),
            None => Ok(None),
        },
    }
}

/// Dumps the destinations of queued keys until the queue is closed and drained.
fn destinations_worker(
    socket: &mut NetlinkSocket,
    family: u16,
    queue: &Queue,
) -> Result<Dumps, Error> {
    let mut out = Vec::new();
    // Services of one table tend to have as many destinations as each other: each list is
    // made at the previous one's length, instead of growing (and being copied) as it fills.
    let mut expected = 0;
    while let Some(key) = queue.take() {
        match destinations(socket, family, &key, expected) {
            Ok(dests) => {
                expected = dests.len();
                out.push((key, dests));
            }
            Err(e) => {
                queue.close(true);
                return Err(e);
            }
        }
    }
    Ok(out)
}

/// One service's destinations (a per-service dump: not affected by the dump flaw), in a
/// list made for `expected` of them.
fn destinations(
    socket: &mut NetlinkSocket,
    family: u16,
    key: &ServiceKey,
    expected: usize,
) -> Result<Vec<DestinationEntry>, Error> {
    let op = Operation::ListDestinations;
    let object = Object::Service(*key);
    let msg = IpvsMessage::get_destinations(key).map_err(|e| Error::from_encode(op, &object, e))?;
    let key_family = key.family();
    let mut dests = Vec::with_capacity(expected);
    let mut bad = None;
    let answer = socket
        .dump(
            message::genl(family, msg),
            |reply| match record::destination_record(reply.payload)
                .and_then(|rec| record::decode_destination(rec, key_family))
            {
                Ok(d) => dests.push(d),
                Err(e) => bad = Some(e),
            },
        )
        .map_err(|e| Error::io(op, e))?;
    if let Err(errno) = answer {
        return Err(Error::from_errno(op, &object, errno));
    }
    if let Some(source) = bad {
        return Err(Error::Decode { op, source });
    }
    Ok(dests)
}

#[cfg(test)]
mod tests;
