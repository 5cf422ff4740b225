//! A watcher whose streaming list comes in Kubernetes' protobuf encoding: one watch with
//! `sendInitialEvents=true` (Kubernetes' WatchList), every object an `ADDED` event, the end of
//! the picture a bookmark annotated `k8s.io/initial-events-end`, then the changes, each event
//! a length-prefixed `WatchEvent` frame read with only what the conversions read
//! ([`super::protobuf`]). This is how kube-proxy lists since Kubernetes 1.35 (client-go's
//! streaming lists in its default content type): the API server sends the picture from its
//! watch cache one object at a time, and the node decodes a fraction of what the JSON text
//! costs.
//!
//! The events are kube-runtime's watcher's (`Init`, one `InitApply` per object, `InitDone`,
//! then `Apply` and `Delete`). A watch that ends after the picture resumes from the last
//! resourceVersion seen (a plain watch, in protobuf too); one that ends before it lists again
//! no older than it listed before, and a 410 Gone lists again with a consistent read
//! (`resourceVersion=""`), as client-go's reflector does: a relist never goes back in time.
//! A server that answers in JSON is read as JSON, and [`json_stream_watcher`] is the same
//! watcher asking for JSON, for the kinds without a protobuf decoder. A refusal of the
//! streaming list (422) and a server that ignores `sendInitialEvents` are for the caller to
//! tell: [`super::kube`] falls back to paginated lists.

use std::fmt::Debug;
use std::marker::PhantomData;

use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use http::header::ACCEPT_ENCODING;
use http_body_util::BodyExt;
use kube::api::{WatchEvent, WatchParams};
use kube::core::Status;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::protobuf::{
    INITIAL_EVENTS_END, ProtobufError, WatchFrame, read_bookmark, read_status, read_watch_frame,
};
use super::protobuf_watch::{WATCH_IDLE, invalid, kube_status, send_accepting, within};

/// The largest frame a protobuf watch is believed to send. An object is at most a few MiB
/// (etcd's request limit is 1.5 MiB); a length beyond this is a stream out of step.
const MAX_FRAME: usize = 64 << 20;

/// Where the watcher is.
enum State<W, K> {
    /// Nothing listed, or the picture to be made anew: open a streaming list of a picture not
    /// older than `not_older_than` (client-go's reflector's rule: the resourceVersion last
    /// synced, or `""`, a consistent read, at first and after a 410 Gone: a relist never asks
    /// for an older picture than the one it replaces).
    Empty { not_older_than: String },
    /// A watch open: the streaming list until its initial events end (`initial`), then
    /// changes; `resource_version` is the last one seen, `listed_from` what the streaming
    /// list asked for (asked again if its picture breaks off).
    Watching {
        events: Events<W, K>,
        resource_version: Option<String>,
        initial: bool,
        listed_from: String,
    },
    /// Listed, the watch ended: open a plain watch from `resource_version`.
    Resume { resource_version: String },
}

/// The streaming-list watch of one kind (`W` as kube decodes its JSON events, converted to
/// `K`), its protobuf objects read by `decode`; `config` gives the selectors.
pub(crate) fn protobuf_stream_watcher<W, K>(
    client: kube::Client,
    api: Api<W>,
    config: watcher::Config,
    decode: fn(&[u8]) -> Result<K, ProtobufError>,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send
where
    W: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K: From<W> + Resource + Send + 'static,
{
    stream_watcher(client, api, config, PROTOBUF_ACCEPT, Some(decode))
}

/// The streaming-list watch of one kind in JSON, every event decoded as `W`: the same
/// watcher as [`protobuf_stream_watcher`], for kinds without a protobuf decoder.
pub(crate) fn json_stream_watcher<W>(
    client: kube::Client,
    api: Api<W>,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<Event<W>>> + Send
where
    W: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    stream_watcher(client, api, config, JSON_ACCEPT, None)
}

/// Reads one object of a protobuf answer.
type Decode<K> = fn(&[u8]) -> Result<K, ProtobufError>;

/// What a protobuf streaming list asks for: protobuf, or JSON from a server without it.
const PROTOBUF_ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";

/// What a JSON streaming list asks for.
const JSON_ACCEPT: &str = "application/json";

fn stream_watcher<W, K>(
    client: kube::Client,
    api: Api<W>,
    config: watcher::Config,
    accept: &'static str,
    decode: Option<Decode<K>>,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send
where
    W: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K: From<W> + Resource + Send + 'static,
{
    let resume = WatchParams {
        label_selector: config.label_selector.clone(),
        field_selector: config.field_selector.clone(),
        timeout: config.timeout,
        bookmarks: true,
        ..WatchParams::default()
    };
    let context = Context {
        client,
        api,
        list: WatchParams {
            send_initial_events: true,
            ..resume.clone()
        },
        resume,
        accept,
        decode,
    };
    let empty = State::Empty {
        not_older_than: String::new(),
    };
    // The context boxed: the unfold moves its state with every event.
    futures::stream::unfold((Box::new(context), empty), |(context, state)| async move {
        let (event, state) = step(&context, state).await;
        Some((event, (context, state)))
    })
}

/// What every step needs.
struct Context<W, K> {
    client: kube::Client,
    api: Api<W>,
    /// The streaming list's parameters (`sendInitialEvents`, bookmarks; with them kube asks
    /// for `resourceVersionMatch=NotOlderThan`).
    list: WatchParams,
    /// A resumed watch's parameters.
    resume: WatchParams,
    /// The requests' `Accept`.
    accept: &'static str,
    /// Reads an object of a protobuf answer (`None`: protobuf is not asked for).
    decode: Option<Decode<K>>,
}

/// Where a watcher starts over after a 410 Gone: a consistent picture, never an older one
/// than it had.
fn relist_consistently<W, K>() -> State<W, K> {
    State::Empty {
        not_older_than: String::new(),
    }
}

/// Advances the watcher to its next event.
async fn step<W, K>(
    context: &Context<W, K>,
    mut state: State<W, K>,
) -> (watcher::Result<Event<K>>, State<W, K>)
where
    W: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K: From<W> + Resource + Send + 'static,
{
    loop {
        state = match state {
            State::Empty { not_older_than } => {
                return match open(context, &context.list, &not_older_than).await {
                    Ok(events) => (
                        Ok(Event::Init),
                        State::Watching {
                            events,
                            resource_version: None,
                            initial: true,
                            listed_from: not_older_than,
                        },
                    ),
                    Err(kube::Error::Api(status)) if status.code == 410 => (
                        Err(watcher::Error::WatchStartFailed(kube::Error::Api(status))),
                        relist_consistently(),
                    ),
                    Err(error) => (
                        Err(watcher::Error::WatchStartFailed(error)),
                        State::Empty { not_older_than },
                    ),
                };
            }
            State::Resume { resource_version } => {
                match open(context, &context.resume, &resource_version).await {
                    Ok(events) => State::Watching {
                        events,
                        resource_version: Some(resource_version.clone()),
                        initial: false,
                        listed_from: resource_version,
                    },
                    Err(kube::Error::Api(status)) if status.code == 410 => {
                        return (
                            Err(watcher::Error::WatchStartFailed(kube::Error::Api(status))),
                            relist_consistently(),
                        );
                    }
                    Err(error) => {
                        return (
                            Err(watcher::Error::WatchStartFailed(error)),
                            State::Resume { resource_version },
                        );
                    }
                }
            }
            State::Watching {
                mut events,
                resource_version,
                initial,
                listed_from,
            } => {
                let next = within(WATCH_IDLE, events.next()).await.ok().flatten();
                match next {
                    Some(Ok(change)) => {
                        let watch = Watch {
                            events,
                            resource_version,
                            initial,
                            listed_from,
                        };
                        match on_change(change, watch) {
                            Next::Event(event, state) => return (event, state),
                            Next::Quiet(state) => state,
                        }
                    }
                    // An event that cannot be read in the picture starts the picture over:
                    // handed out with a hole, it would delete what the missing object
                    // programs (as a list page that cannot be read fails the whole list).
                    // After the picture, the change is skipped and the watch goes on.
                    Some(Err(error)) if initial => {
                        return (
                            Err(watcher::Error::WatchFailed(error)),
                            State::Empty {
                                not_older_than: listed_from,
                            },
                        );
                    }
                    Some(Err(error)) => {
                        let watching = State::Watching {
                            events,
                            resource_version,
                            initial,
                            listed_from,
                        };
                        return (Err(watcher::Error::WatchFailed(error)), watching);
                    }
                    // Ended (or silent past the server's timeout): the picture starts over
                    // if it was not whole, else the watch resumes.
                    None => match resource_version {
                        Some(resource_version) if !initial => State::Resume { resource_version },
                        _ => State::Empty {
                            not_older_than: listed_from,
                        },
                    },
                }
            }
        };
    }
}

/// What one change of a watch leads to.
enum Next<W, K> {
    /// An event to hand out, and where the watcher goes on from.
    Event(watcher::Result<Event<K>>, State<W, K>),
    /// Nothing to hand out (a bookmark): where the watcher goes on from.
    Quiet(State<W, K>),
}

/// An open watch, between its changes.
struct Watch<W, K> {
    events: Events<W, K>,
    resource_version: Option<String>,
    initial: bool,
    listed_from: String,
}

/// The event a change of the watch is, the watch going on (or the list starting over).
fn on_change<W, K>(change: Change<K>, watch: Watch<W, K>) -> Next<W, K>
where
    K: Resource,
{
    let Watch {
        events,
        resource_version,
        initial,
        listed_from,
    } = watch;
    let watching = |resource_version, initial| State::Watching {
        events,
        resource_version,
        initial,
        listed_from,
    };
    match change {
        Change::Applied(object) if initial => Next::Event(
            Ok(Event::InitApply(object)),
            watching(resource_version, true),
        ),
        Change::Applied(object) | Change::Deleted(object)
            if object.resource_version().is_none() =>
        {
            Next::Event(
                Err(watcher::Error::NoResourceVersion),
                relist_consistently(),
            )
        }
        Change::Applied(object) => {
            let version = object.resource_version();
            Next::Event(Ok(Event::Apply(object)), watching(version, false))
        }
        Change::Deleted(object) => {
            let version = object.resource_version();
            Next::Event(Ok(Event::Delete(object)), watching(version, initial))
        }
        Change::Bookmark {
            resource_version: Some(version),
            initial_events_end: true,
        } if initial => Next::Event(Ok(Event::InitDone), watching(Some(version), false)),
        Change::Bookmark {
            initial_events_end: true,
            ..
        } if initial => Next::Event(
            Err(watcher::Error::NoResourceVersion),
            relist_consistently(),
        ),
        Change::Bookmark {
            resource_version: version,
            ..
        } => Next::Quiet(watching(version.or(resource_version), initial)),
        // 410 Gone: the resourceVersion is too old to resume from; list again.
        Change::Error(status) if status.code == 410 => Next::Event(
            Err(watcher::Error::WatchError(status)),
            relist_consistently(),
        ),
        Change::Error(status) => Next::Event(
            Err(watcher::Error::WatchError(status)),
            watching(resource_version, initial),
        ),
    }
}

/// One change a watch reports, its object decoded.
enum Change<K> {
    /// `ADDED` or `MODIFIED`.
    Applied(K),
    /// `DELETED`.
    Deleted(K),
    /// `BOOKMARK`: the resourceVersion reached, and whether the initial events end here.
    Bookmark {
        resource_version: Option<String>,
        initial_events_end: bool,
    },
    /// `ERROR`.
    Error(Box<Status>),
}

/// Opens a watch with `params` from `version`, asking for protobuf (JSON accepted).
async fn open<W, K>(
    context: &Context<W, K>,
    params: &WatchParams,
    version: &str,
) -> kube::Result<Events<W, K>>
where
    W: Resource,
{
    let mut request = kube::core::Request::new(context.api.resource_url())
        .watch(params, version)
        .map_err(kube::Error::BuildRequest)?;
    // One event after another, never compressed (as kube asks for its watches).
    request
        .headers_mut()
        .insert(ACCEPT_ENCODING, http::HeaderValue::from_static("identity"));
    let (body, protobuf) = send_accepting(&context.client, request, context.accept).await?;
    Ok(Events {
        body: body.into_data_stream().boxed(),
        pending: Pending::default(),
        protobuf,
        broken: false,
        decode: context.decode,
        json: PhantomData,
    })
}

/// The events of one watch's response: length-prefixed protobuf frames, or JSON lines.
struct Events<W, K> {
    body: BoxStream<'static, kube::Result<Bytes>>,
    /// What arrived and is not yet read as an event.
    pending: Pending,
    protobuf: bool,
    /// A frame's length was beyond belief: nothing after it can be read.
    broken: bool,
    /// Reads an object of a protobuf answer (`None`: protobuf was not asked for).
    decode: Option<Decode<K>>,
    json: PhantomData<fn() -> W>,
}

impl<W, K> Events<W, K>
where
    W: Clone + DeserializeOwned,
    K: From<W>,
{
    /// The next change; `None` when the watch ended (a torn last event is dropped).
    async fn next(&mut self) -> Option<kube::Result<Change<K>>> {
        loop {
            if self.broken {
                return None;
            }
            match self.split_event() {
                Ok(Some(event)) => return Some(self.read(&event)),
                Ok(None) => {}
                Err(error) => return Some(Err(error)),
            }
            match self.body.try_next().await {
                Ok(Some(chunk)) => self.pending.push(chunk),
                Ok(None) => return None,
                Err(error) => {
                    self.broken = true;
                    return Some(Err(error));
                }
            }
        }
    }

    /// The next whole event's bytes, if they all arrived.
    fn split_event(&mut self) -> kube::Result<Option<Bytes>> {
        if !self.protobuf {
            return Ok(self.pending.next_line());
        }
        self.pending.next_frame().map_err(|length| {
            self.broken = true;
            invalid(format!(
                "a protobuf watch frame of {length} bytes (more than {MAX_FRAME}): the stream is out of step"
            ))
        })
    }

    /// One event read in the response's encoding.
    fn read(&self, event: &[u8]) -> kube::Result<Change<K>> {
        if !self.protobuf {
            return Ok(
                match serde_json::from_slice::<WatchEvent<W>>(event)
                    .map_err(kube::Error::SerdeError)?
                {
                    WatchEvent::Added(object) | WatchEvent::Modified(object) => {
                        Change::Applied(object.into())
                    }
                    WatchEvent::Deleted(object) => Change::Deleted(object.into()),
                    WatchEvent::Bookmark(bookmark) => Change::Bookmark {
                        initial_events_end: bookmark
                            .metadata
                            .annotations
                            .get(INITIAL_EVENTS_END)
                            .is_some_and(|value| value == "true"),
                        resource_version: Some(bookmark.metadata.resource_version)
                            .filter(|version| !version.is_empty()),
                    },
                    WatchEvent::Error(status) => Change::Error(status),
                },
            );
        }
        let frame_error =
            |error: ProtobufError| invalid(format!("reading a protobuf watch event: {error}"));
        let WatchFrame { event_type, object } = read_watch_frame(event).map_err(frame_error)?;
        let Some(decode) = self.decode else {
            return Err(invalid(
                "a protobuf watch event in answer to a request for JSON".to_owned(),
            ));
        };
        let decode = |object| decode(object).map_err(frame_error);
        Ok(match event_type {
            "ADDED" | "MODIFIED" => Change::Applied(decode(object)?),
            "DELETED" => Change::Deleted(decode(object)?),
            "BOOKMARK" => {
                let (resource_version, initial_events_end) =
                    read_bookmark(object).map_err(frame_error)?;
                Change::Bookmark {
                    resource_version,
                    initial_events_end,
                }
            }
            "ERROR" => {
                let status = read_status(object).map_err(frame_error)?;
                Change::Error(Box::new(kube_status(status)))
            }
            other => {
                return Err(invalid(format!(
                    "a protobuf watch event of unknown type {other:?}"
                )));
            }
        })
    }
}

/// The bytes of a response not yet read as events: what is left of the last chunk, read in
/// place (an event that lies whole in a chunk is a view of it, not a copy: a streaming list
/// is tens of MiB at 10,000 objects, which come faster than they are decoded), and the
/// beginning of an event that goes on in the next chunk, gathered.
#[derive(Default)]
struct Pending {
    /// What is left of the last chunk (empty when its end begins an event being gathered).
    chunk: Bytes,
    /// The bytes of an event begun in an earlier chunk.
    gathered: BytesMut,
}

impl Pending {
    /// Takes the next chunk: call it once the last one was read (no event is left whole in
    /// it).
    fn push(&mut self, chunk: Bytes) {
        debug_assert!(self.chunk.is_empty(), "a chunk pushed over an unread one");
        self.chunk = chunk;
    }

    /// The next length-prefixed frame's message (after its 4-byte big-endian length), if it
    /// all arrived; `Err(length)` for a frame longer than [`MAX_FRAME`].
    fn next_frame(&mut self) -> Result<Option<Bytes>, usize> {
        let length_of = |prefix: &[u8; 4]| {
            let length = u32::from_be_bytes(*prefix) as usize;
            if length > MAX_FRAME {
                Err(length)
            } else {
                Ok(length)
            }
        };
        if self.gathered.is_empty() {
            if let Some(prefix) = self.chunk.first_chunk::<4>() {
                let length = length_of(prefix)?;
                if self.chunk.len() >= 4 + length {
                    let mut frame = self.chunk.split_to(4 + length);
                    let _prefix = frame.split_to(4);
                    return Ok(Some(frame));
                }
                self.gathered.reserve(4 + length);
            }
            // The chunk ends inside a frame: gathered until the frame ends.
            self.gathered
                .extend_from_slice(&std::mem::take(&mut self.chunk));
            return Ok(None);
        }
        // A frame begun in an earlier chunk: what it misses from this one, its length first.
        if self.gathered.len() < 4 {
            let take = (4 - self.gathered.len()).min(self.chunk.len());
            self.gathered.extend_from_slice(&self.chunk.split_to(take));
        }
        let Some(prefix) = self.gathered.first_chunk::<4>() else {
            return Ok(None);
        };
        let wanted = 4 + length_of(prefix)?;
        let take = (wanted - self.gathered.len()).min(self.chunk.len());
        self.gathered.reserve(wanted - self.gathered.len());
        self.gathered.extend_from_slice(&self.chunk.split_to(take));
        if self.gathered.len() < wanted {
            return Ok(None);
        }
        let mut frame = std::mem::take(&mut self.gathered).freeze();
        let _prefix = frame.split_to(4);
        Ok(Some(frame))
    }

    /// The next line that is not blank, with its newline, if it all arrived.
    fn next_line(&mut self) -> Option<Bytes> {
        while let Some(end) = self.chunk.iter().position(|&b| b == b'\n') {
            let piece = self.chunk.split_to(end + 1);
            let line = if self.gathered.is_empty() {
                piece
            } else {
                self.gathered.extend_from_slice(&piece);
                std::mem::take(&mut self.gathered).freeze()
            };
            if !line.trim_ascii().is_empty() {
                return Some(line);
            }
        }
        // No newline left: what remains begins a line, gathered until it ends.
        self.gathered
            .extend_from_slice(&std::mem::take(&mut self.chunk));
        None
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Service;

    use super::*;
    use crate::source::protobuf::decode_service;

    /// A protobuf field: its key, then a length and the bytes.
    fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![(number << 3) | 2, u8::try_from(bytes.len()).expect("short")];
        out.extend_from_slice(bytes);
        out
    }

    /// One frame of a protobuf watch: the length, then the `WatchEvent` whose object is
    /// `message` in its envelope.
    fn frame(event_type: &str, message: &[u8]) -> Vec<u8> {
        let mut raw = b"k8s\0".to_vec();
        raw.extend(field(2, message));
        let mut event = field(1, event_type.as_bytes());
        event.extend(field(2, &field(1, &raw)));
        let mut frame = u32::try_from(event.len())
            .expect("short")
            .to_be_bytes()
            .to_vec();
        frame.extend(event);
        frame
    }

    /// A Service named `name` at `version`, or a bookmark's metadata alone.
    fn meta(name: &str, version: &str) -> Vec<u8> {
        let mut meta = field(1, name.as_bytes());
        meta.extend(field(6, version.as_bytes()));
        field(1, &meta)
    }

    fn events(chunks: Vec<Vec<u8>>, protobuf: bool) -> Events<Service, Service> {
        let chunks = chunks.into_iter().map(|chunk| Ok(Bytes::from(chunk)));
        Events {
            body: futures::stream::iter(chunks).boxed(),
            pending: Pending::default(),
            protobuf,
            broken: false,
            decode: Some(decode_service),
            json: PhantomData,
        }
    }

    /// Every change of `events` as text, and whether the stream ended in an error.
    async fn read_all(mut events: Events<Service, Service>) -> (Vec<String>, bool) {
        let mut seen = Vec::new();
        while let Some(change) = events.next().await {
            seen.push(match change {
                Ok(Change::Applied(s)) => format!("applied {}", s.metadata.name.expect("named")),
                Ok(Change::Deleted(s)) => format!("deleted {}", s.metadata.name.expect("named")),
                Ok(Change::Bookmark {
                    resource_version,
                    initial_events_end,
                }) => format!("bookmark {resource_version:?} {initial_events_end}"),
                Ok(Change::Error(status)) => format!("error {}", status.code),
                Err(_) => return (seen, true),
            });
        }
        (seen, false)
    }

    #[tokio::test]
    async fn frames_read_alike_whatever_pieces_they_arrive_in() {
        let mut end = meta("", "9");
        end.extend(field(12, b"")); // an empty annotation entry: not the end marker
        let mut stream = frame("ADDED", &meta("web", "7"));
        stream.extend(frame("MODIFIED", &meta("db", "8")));
        stream.extend(frame("BOOKMARK", &end));
        stream.extend(frame("DELETED", &meta("web", "10")));
        let expected = [
            "applied web",
            "applied db",
            "bookmark Some(\"9\") false",
            "deleted web",
        ];
        let whole = read_all(events(vec![stream.clone()], true)).await;
        assert_eq!(whole, (expected.map(str::to_owned).to_vec(), false));
        for cut in 1..stream.len() {
            let pieces = vec![stream[..cut].to_vec(), stream[cut..].to_vec()];
            assert_eq!(read_all(events(pieces, true)).await, whole, "cut at {cut}");
        }
        let bytes = stream.iter().map(|b| vec![*b]).collect();
        assert_eq!(read_all(events(bytes, true)).await, whole, "byte by byte");
        // A torn last frame is dropped, as the watch ended inside it.
        let torn = stream[..stream.len() - 2].to_vec();
        assert_eq!(
            read_all(events(vec![torn], true)).await,
            (expected[..3].iter().map(|s| s.to_string()).collect(), false)
        );
    }

    #[test]
    fn a_frame_whole_in_a_chunk_is_read_in_place_and_one_across_chunks_gathered() {
        let first = frame("ADDED", &meta("web", "7"));
        let second = frame("ADDED", &meta("db", "8"));
        let cut = 9;
        let chunk = Bytes::from([first.clone(), second[..cut].to_vec()].concat());
        let mut pending = Pending::default();
        pending.push(chunk.clone());
        let read = pending.next_frame().expect("believable").expect("whole");
        assert_eq!(read[..], first[4..]);
        assert!(
            chunk.as_ptr_range().contains(&read.as_ptr()),
            "a view of the chunk"
        );
        assert_eq!(pending.next_frame(), Ok(None));
        pending.push(Bytes::from(second[cut..].to_vec()));
        let read = pending.next_frame().expect("believable").expect("whole");
        assert_eq!(read[..], second[4..]);
        assert_eq!(pending.next_frame(), Ok(None));
    }

    #[tokio::test]
    async fn a_frame_longer_than_believable_ends_the_stream_with_an_error() {
        let mut stream = frame("ADDED", &meta("web", "7"));
        stream.extend(u32::MAX.to_be_bytes());
        stream.extend(frame("ADDED", &meta("db", "8")));
        let (seen, failed) = read_all(events(vec![stream], true)).await;
        assert_eq!(seen, ["applied web"]);
        assert!(failed, "an error, then nothing");
    }

    #[tokio::test]
    async fn a_server_answering_in_json_is_read_as_json() {
        let lines = concat!(
            r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Service","metadata":{"name":"web","resourceVersion":"7"}}}"#,
            "\n\n",
            r#"{"type":"BOOKMARK","object":{"apiVersion":"v1","kind":"Service","metadata":{"resourceVersion":"9","annotations":{"k8s.io/initial-events-end":"true"}}}}"#,
            "\n",
            r#"{"type":"ERROR","object":{"apiVersion":"v1","kind":"Status","status":"Failure","reason":"Expired","code":410}}"#,
            "\n",
        );
        for size in [1, 37, lines.len()] {
            let pieces = lines.as_bytes().chunks(size).map(<[u8]>::to_vec).collect();
            let (seen, failed) = read_all(events(pieces, false)).await;
            assert_eq!(
                seen,
                ["applied web", "bookmark Some(\"9\") true", "error 410"],
                "in pieces of {size}"
            );
            assert!(!failed);
        }
    }
}
