//! A watcher whose lists come in Kubernetes' protobuf encoding ([`super::protobuf`]): the
//! same events as kube-runtime's paginated watcher (`Init`, one `InitApply` per object,
//! `InitDone`, then `Apply` and `Delete` from a watch that resumes at the list's
//! resourceVersion; a 410 Gone relists), for the two kinds whose lists are large (Services
//! and EndpointSlices).
//!
//! Only the lists ask for protobuf: they are where a restart spends its CPU (every object at
//! once), while a watch carries one change at a time and stays on kube's JSON decoding. An API
//! server that answers a list in JSON anyway is read as JSON. Errors are kube-runtime's
//! watcher errors, so the caller's backoff treats them alike.

use std::fmt::Debug;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{FutureExt as _, Stream, StreamExt};
use http::header::{ACCEPT, CONTENT_TYPE};
use kube::api::{ListParams, ObjectList, WatchEvent, WatchParams};
use kube::core::Status;
use kube::core::response::{StatusCause, StatusDetails};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::protobuf::{
    PROTOBUF_CONTENT_TYPE, ProtobufError, ProtobufStatus, read_list, read_status_body,
};

/// Objects asked for in one list request (kube-runtime's default page).
const PAGE_SIZE: u32 = 500;

/// What a list asks for: protobuf, or JSON from a server that does not serve it.
const LIST_ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";

/// How long a watch may stay silent before it is taken for dead and reopened: the server
/// ends a watch after its timeout (kube's default asks for 290 s), so a longer silence means
/// the connection is gone.
pub(super) const WATCH_IDLE: Duration = Duration::from_secs(290 + 30);

/// `future`'s output, or `Err` when it is not ready within `limit` of waiting for it. A
/// future ready at once is taken without a timer: a list streams thousands of events in a
/// burst, and arming a timer for each reads the clock for each (a system call where the
/// clock has no vDSO, as in the TCG VM the benchmarks run in: about 40,000 of them in a
/// restart's adoption at 10,000 Services).
pub(super) async fn within<F: Future>(
    limit: Duration,
    future: F,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    let mut future = std::pin::pin!(future);
    if let Some(ready) = future.as_mut().now_or_never() {
        return Ok(ready);
    }
    tokio::time::timeout(limit, future).await
}

/// Where the watcher is.
enum State<K, W> {
    /// Nothing listed: list from the start.
    Empty,
    /// Listing: the page being handed out, then the next one (`continue_token`), or, after
    /// the last, the list's resourceVersion to watch from. One page is held at a time, as
    /// kube-runtime's paginated watcher holds it.
    Paging {
        objects: std::vec::IntoIter<K>,
        continue_token: Option<String>,
        resource_version: Option<String>,
    },
    /// Listed and handed out: open a watch from `resource_version`.
    Resume { resource_version: String },
    /// A watch open.
    Watching {
        resource_version: String,
        stream: BoxStream<'static, kube::Result<WatchEvent<W>>>,
    },
}

/// The watch of one kind (`W` as kube decodes its watch events, converted to `K`), its lists
/// asked for in protobuf and read by `decode`; `config` gives the selectors.
pub(crate) fn protobuf_list_watcher<W, K>(
    client: kube::Client,
    api: Api<W>,
    config: watcher::Config,
    decode: fn(&[u8]) -> Result<K, ProtobufError>,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send
where
    W: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K: From<W> + Send + 'static,
{
    let watch_params = WatchParams {
        label_selector: config.label_selector.clone(),
        field_selector: config.field_selector.clone(),
        timeout: config.timeout,
        bookmarks: config.bookmarks,
        ..WatchParams::default()
    };
    let list_params = ListParams {
        label_selector: config.label_selector,
        field_selector: config.field_selector,
        limit: Some(PAGE_SIZE),
        ..ListParams::default()
    };
    let context = Context {
        client,
        api,
        list_params,
        watch_params,
        decode,
    };
    // The context boxed: the unfold moves its state with every event.
    futures::stream::unfold(
        (Box::new(context), State::Empty),
        |(context, state)| async move {
            let (event, state) = step(&context, state).await;
            Some((event, (context, state)))
        },
    )
}

/// What every step needs.
struct Context<W, K> {
    client: kube::Client,
    api: Api<W>,
    list_params: ListParams,
    watch_params: WatchParams,
    decode: fn(&[u8]) -> Result<K, ProtobufError>,
}

/// Advances the watcher to its next event.
async fn step<W, K>(
    context: &Context<W, K>,
    mut state: State<K, W>,
) -> (watcher::Result<Event<K>>, State<K, W>)
where
    W: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K: From<W> + Send + 'static,
{
    loop {
        state = match state {
            State::Empty => {
                let paging = State::Paging {
                    objects: Vec::new().into_iter(),
                    continue_token: None,
                    resource_version: None,
                };
                return (Ok(Event::Init), paging);
            }
            State::Paging {
                mut objects,
                continue_token,
                resource_version,
            } => {
                if let Some(object) = objects.next() {
                    let paging = State::Paging {
                        objects,
                        continue_token,
                        resource_version,
                    };
                    return (Ok(Event::InitApply(object)), paging);
                }
                if continue_token.is_none()
                    && let Some(resource_version) = resource_version
                {
                    return (Ok(Event::InitDone), State::Resume { resource_version });
                }
                let mut params = context.list_params.clone();
                params.continue_token = continue_token;
                match list_page(context, &params).await {
                    Ok(page)
                        if page.continue_token.is_none() && page.resource_version.is_none() =>
                    {
                        return (Err(watcher::Error::NoResourceVersion), State::Empty);
                    }
                    Ok(page) => State::Paging {
                        objects: page.objects.into_iter(),
                        continue_token: page.continue_token,
                        resource_version: page.resource_version,
                    },
                    // The list starts over (a new `Init`): its pages so far are dropped.
                    Err(error) => {
                        return (Err(watcher::Error::InitialListFailed(error)), State::Empty);
                    }
                }
            }
            State::Resume { resource_version } => {
                match context
                    .api
                    .watch(&context.watch_params, &resource_version)
                    .await
                {
                    Ok(stream) => State::Watching {
                        resource_version,
                        stream: stream.boxed(),
                    },
                    Err(kube::Error::Api(status)) if status.code == 410 => {
                        return (
                            Err(watcher::Error::WatchStartFailed(kube::Error::Api(status))),
                            State::Empty,
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
                resource_version,
                mut stream,
            } => {
                let next = within(WATCH_IDLE, stream.next()).await.ok().flatten();
                match next {
                    Some(Ok(WatchEvent::Added(object) | WatchEvent::Modified(object))) => {
                        return changed(object, Event::Apply, stream);
                    }
                    Some(Ok(WatchEvent::Deleted(object))) => {
                        return changed(object, Event::Delete, stream);
                    }
                    Some(Ok(WatchEvent::Bookmark(bookmark))) => State::Watching {
                        resource_version: bookmark.metadata.resource_version,
                        stream,
                    },
                    Some(Ok(WatchEvent::Error(status))) => {
                        // 410 Gone: the resourceVersion is too old to resume from; relist.
                        let next = if status.code == 410 {
                            State::Empty
                        } else {
                            State::Watching {
                                resource_version,
                                stream,
                            }
                        };
                        return (Err(watcher::Error::WatchError(status)), next);
                    }
                    Some(Err(error)) => {
                        let watching = State::Watching {
                            resource_version,
                            stream,
                        };
                        return (Err(watcher::Error::WatchFailed(error)), watching);
                    }
                    None => State::Resume { resource_version },
                }
            }
        };
    }
}

/// A watched object's change as `event`, the watch going on from its resourceVersion (a
/// change without one starts over with a list).
fn changed<W, K>(
    object: W,
    event: fn(K) -> Event<K>,
    stream: BoxStream<'static, kube::Result<WatchEvent<W>>>,
) -> (watcher::Result<Event<K>>, State<K, W>)
where
    W: Resource,
    K: From<W>,
{
    match object.resource_version() {
        Some(resource_version) => (
            Ok(event(object.into())),
            State::Watching {
                resource_version,
                stream,
            },
        ),
        None => (Err(watcher::Error::NoResourceVersion), State::Empty),
    }
}

/// One page of a list.
struct Page<K> {
    objects: Vec<K>,
    resource_version: Option<String>,
    continue_token: Option<String>,
}

/// Asks for one page in protobuf (JSON accepted) and reads it in what the server chose.
async fn list_page<W, K>(context: &Context<W, K>, params: &ListParams) -> kube::Result<Page<K>>
where
    W: Resource + Clone + DeserializeOwned + Debug,
    K: From<W>,
{
    let request = kube::core::Request::new(context.api.resource_url())
        .list(params)
        .map_err(kube::Error::BuildRequest)?;
    let (body, protobuf) = send_accepting_protobuf(&context.client, request).await?;
    let body = body.collect_bytes().await?;
    if protobuf {
        let list = read_list(&body).map_err(|e| protobuf_error(context, e))?;
        let mut objects = Vec::with_capacity(list.items.len());
        for item in &list.items {
            objects.push((context.decode)(item).map_err(|e| protobuf_error(context, e))?);
        }
        return Ok(Page {
            objects,
            resource_version: list.resource_version,
            continue_token: list.continue_token,
        });
    }
    let list: ObjectList<W> = serde_json::from_slice(&body).map_err(kube::Error::SerdeError)?;
    Ok(Page {
        objects: list.items.into_iter().map(K::from).collect(),
        resource_version: list.metadata.resource_version.filter(|s| !s.is_empty()),
        continue_token: list.metadata.continue_.filter(|s| !s.is_empty()),
    })
}

/// Sends `request` asking for protobuf ([`LIST_ACCEPT`]): the response's body, and whether
/// the server answered in protobuf (else JSON); a failed request is the error kube reports.
pub(super) async fn send_accepting_protobuf(
    client: &kube::Client,
    request: http::Request<Vec<u8>>,
) -> kube::Result<(kube::client::Body, bool)> {
    send_accepting(client, request, LIST_ACCEPT).await
}

/// Sends `request` with `accept` as its `Accept`: the response's body, and whether the server
/// answered in protobuf (else JSON). A failed request is the error kube reports, the server's
/// `Status` read in the encoding its `Content-Type` names.
pub(super) async fn send_accepting(
    client: &kube::Client,
    mut request: http::Request<Vec<u8>>,
    accept: &'static str,
) -> kube::Result<(kube::client::Body, bool)> {
    request
        .headers_mut()
        .insert(ACCEPT, http::HeaderValue::from_static(accept));
    let response = client.send(request.map(kube::client::Body::from)).await?;
    let status = response.status();
    let protobuf = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with(PROTOBUF_CONTENT_TYPE));
    if !status.is_success() {
        let body = response.into_body().collect_bytes().await?;
        return Err(api_error(status, &body, protobuf));
    }
    Ok((response.into_body(), protobuf))
}

/// A failed request as kube reports one: the server's `Status`, read from the body in the
/// encoding the server chose (`protobuf`, else JSON). A body that holds no readable Status
/// becomes one with the HTTP status's code and reason, and the body (or, in protobuf, why it
/// could not be read) as the message.
fn api_error(http_status: http::StatusCode, body: &[u8], protobuf: bool) -> kube::Error {
    let code = http_status.as_u16();
    let reason = http_status.canonical_reason().unwrap_or("Unknown");
    let read = if protobuf {
        match read_status_body(body) {
            Ok(Some(status)) => Ok(kube_status(status)),
            Ok(None) => Err("an error answer in protobuf that is not a Status".to_owned()),
            Err(error) => Err(format!(
                "an error answer in protobuf that cannot be read: {error}"
            )),
        }
    } else {
        serde_json::from_slice::<Status>(body)
            .map_err(|_| String::from_utf8_lossy(body).trim().to_owned())
    };
    let mut status = read.unwrap_or_else(|message| {
        Status::failure(&message, reason.replace(' ', "").as_str()).with_code(code)
    });
    if status.code == 0 {
        status.code = code;
    }
    kube::Error::Api(Box::new(status))
}

/// A `metav1.Status` read from protobuf, as kube gives one read from JSON.
pub(super) fn kube_status(status: ProtobufStatus) -> Status {
    let ProtobufStatus {
        status: summary,
        message,
        reason,
        code,
        details,
    } = status;
    let mut status = if summary == "Success" {
        Status::success()
    } else {
        Status::failure(&message, &reason)
    };
    status.message = message;
    status.reason = reason;
    status.code = code;
    status.details = details.map(|details| StatusDetails {
        name: details.name,
        group: details.group,
        kind: details.kind,
        uid: details.uid,
        retry_after_seconds: details.retry_after_seconds,
        causes: details
            .causes
            .into_iter()
            .map(|cause| StatusCause {
                reason: cause.reason,
                message: cause.message,
                field: cause.field,
            })
            .collect(),
    });
    status
}

fn protobuf_error<W: Resource, K>(context: &Context<W, K>, error: ProtobufError) -> kube::Error {
    invalid(format!(
        "reading the protobuf list of {}: {error}",
        context.api.resource_url()
    ))
}

pub(super) fn invalid(message: String) -> kube::Error {
    kube::Error::Api(Box::new(
        Status::failure(&message, "InvalidResponse").with_code(0),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ready_future_is_taken_without_a_timer() {
        // Outside any async runtime a timer cannot even be made (tokio panics): the output
        // comes, so none was.
        let output = futures::executor::block_on(within(Duration::ZERO, async { 7 }));
        assert_eq!(output.ok(), Some(7));
    }

    #[tokio::test(start_paused = true)]
    async fn a_future_not_ready_within_the_limit_is_given_up() {
        let started = tokio::time::Instant::now();
        let output = within(Duration::from_secs(10), std::future::pending::<()>()).await;
        assert!(output.is_err());
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_future_ready_later_within_the_limit_gives_its_output() {
        let later = async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            "late"
        };
        assert_eq!(
            within(Duration::from_secs(10), later).await.ok(),
            Some("late")
        );
    }
}
