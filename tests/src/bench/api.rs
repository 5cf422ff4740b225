//! The Kubernetes API server double serving inside a network namespace (where the daemon
//! reaches it on 127.0.0.1), filled with a benchmark cluster.

use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context;

use crate::Netns;
use crate::apiserver::{FakeApiServer, Kind};

use super::cluster::{self, NAMESPACE};

/// The double on a thread that entered the namespace and runs a tokio runtime there until
/// this is dropped.
pub struct ApiInNetns {
    api: Option<FakeApiServer>,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ApiInNetns {
    /// Starts the double in `netns`.
    pub fn start(netns: &Netns) -> anyhow::Result<ApiInNetns> {
        let path = netns.path();
        let (ready_tx, ready_rx) = mpsc::channel::<anyhow::Result<FakeApiServer>>();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let started = (|| {
                let file = std::fs::File::open(&path)
                    .with_context(|| format!("open netns file {}", path.display()))?;
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .with_context(|| format!("setns into {}", path.display()))?;
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .context("tokio runtime for the API double")
            })();
            let runtime = match started {
                Ok(runtime) => runtime,
                Err(error) => {
                    let _ = ready_tx.send(Err(error));
                    return;
                }
            };
            let api = runtime.block_on(FakeApiServer::start());
            if ready_tx.send(Ok(api)).is_err() {
                return;
            }
            let _ = stop_rx.recv();
            runtime.shutdown_timeout(Duration::from_secs(2));
        });
        let api = ready_rx
            .recv_timeout(Duration::from_secs(30))
            .context("the API double did not start")??;
        Ok(ApiInNetns {
            api: Some(api),
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The double.
    pub fn api(&self) -> &FakeApiServer {
        match &self.api {
            Some(api) => api,
            None => unreachable!("the double lives until drop"),
        }
    }

    /// Fills the double with the Node and `services` Services with `m` endpoints each,
    /// without recording watch events (nothing watches yet).
    pub fn fill(&self, services: usize, m: usize) {
        let api = self.api();
        api.apply_silently(Kind::Node, cluster::node_object());
        for i in 0..services {
            api.apply_silently(Kind::Service, cluster::service_object(i));
            api.apply_silently(
                Kind::EndpointSlice,
                cluster::slice_object(i, &cluster::initial_endpoints(i, m)),
            );
        }
    }

    /// Replaces service `i`'s slice (watchers are told).
    pub fn set_endpoints(&self, i: usize, endpoints: &[std::net::Ipv4Addr]) {
        self.api()
            .apply(Kind::EndpointSlice, cluster::slice_object(i, endpoints));
    }

    /// Adds service `i` with its slice (watchers are told).
    pub fn add_service(&self, i: usize, endpoints: &[std::net::Ipv4Addr]) {
        self.api().apply(Kind::Service, cluster::service_object(i));
        self.set_endpoints(i, endpoints);
    }

    /// Deletes service `i` and its slice (watchers are told).
    pub fn delete_service(&self, i: usize) {
        let name = cluster::service_name(i);
        self.api()
            .delete(Kind::EndpointSlice, NAMESPACE, &format!("{name}-1"));
        self.api().delete(Kind::Service, NAMESPACE, &name);
    }
}

impl Drop for ApiInNetns {
    fn drop(&mut self) {
        drop(self.api.take());
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
