//! `explain`: why one Service does or does not answer on this node. The engine plans the
//! source's first picture on in-memory backends (the node's addresses read from the kernel,
//! as the daemon reads them), then the kernel is read — IPVS, the dummy link, the nftables
//! sets, the scheduler modules, the health-check node ports — and
//! [`proxier_core::explain::explain`] compares the two. Read only: nothing is written.
//!
//! ```no_run
//! use proxier_core::model::{Config, ServiceName};
//! use proxier_core::ProxierConfig;
//! use proxier_runtime::explain::{ExplainRequest, explain};
//! use proxier_runtime::source::{self, file::FileSourceConfig};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let mut source = source::file::spawn(FileSourceConfig::new("cluster.yaml", "node-a"));
//! let first = source.events.recv().await.ok_or("the source stopped")?;
//! let request = ExplainRequest::new(
//!     ProxierConfig::new("node-a", Config::default()),
//!     ServiceName::new("default", "web"),
//! );
//! let explanation = explain(first, &request).await?;
//! println!("{}", proxier_core::explain::render::render_text(&explanation, &request.link));
//! # Ok(())
//! # }
//! ```

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use proxier_core::backend::{AddressBackend, KernelAddressBackend, MemoryAddressBackend};
use proxier_core::explain::kernel::{self, KernelQuery};
use proxier_core::explain::{EnginePicture, Explanation, HealthAnswer};
use proxier_core::kernel_modules::ModuleFiles;
use proxier_core::model::ServiceName;
use proxier_core::netfilter::{Netfilter, NftBackend, empty_plan};
use proxier_core::{Backends, EngineError, Proxier, ProxierConfig, SyncKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::source::SourceBatch;

/// The default dummy link.
pub const DEFAULT_LINK: &str = "kube-ipvs0";

/// How long a health-check node port has to answer.
pub const HEALTH_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// What to explain, and how the daemon is configured.
#[derive(Debug, Clone)]
pub struct ExplainRequest {
    /// The daemon's engine configuration (its planner configuration above all).
    pub config: ProxierConfig,
    /// The Service.
    pub service: ServiceName,
    /// A client address to check the load-balancer source ranges against.
    pub client: Option<IpAddr>,
    /// The dummy link.
    pub link: String,
    /// Where the health-check node ports are probed (the daemon listens on every address).
    pub health_check_address: IpAddr,
    /// Where the scheduler modules are looked up; `None`: the running kernel's files.
    pub module_files: Option<ModuleFiles>,
}

impl ExplainRequest {
    /// Explains `service` for an engine configured as `config`, on `kube-ipvs0`.
    pub fn new(config: ProxierConfig, service: ServiceName) -> Self {
        ExplainRequest {
            config,
            service,
            client: None,
            link: DEFAULT_LINK.to_owned(),
            health_check_address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            module_files: None,
        }
    }
}

/// Why [`explain`] could not explain.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The engine could not be built or could not plan.
    #[error("cannot plan: {0}")]
    Engine(#[from] EngineError),
}

/// Plans `first` (a source's first picture) as the daemon would and explains
/// `request.service` against the kernel.
pub async fn explain(
    first: SourceBatch,
    request: &ExplainRequest,
) -> Result<Explanation, ExplainError> {
    let addresses = MemoryAddressBackend::named(&request.link);
    match KernelAddressBackend::connect(request.link.clone()) {
        Ok(mut link) => match link.node_addresses().await {
            Ok(node) => addresses.set_node_addresses(node),
            Err(error) => tracing::warn!(%error, "cannot read the node's addresses"),
        },
        Err(error) => tracing::warn!(%error, "cannot read the node's addresses"),
    }
    let config = ProxierConfig {
        node_addresses_from_kernel: true,
        ..request.config.clone()
    };
    let table_name = config.netfilter.table_name.clone();
    let backends = Backends {
        addresses,
        ..Backends::in_memory()
    };
    let mut proxier = Proxier::new(config, backends)?;
    for change in first.changes {
        proxier.apply(change);
    }
    proxier.sync(SyncKind::Full).await?;
    let picture = EnginePicture {
        state: proxier.state(),
        node: proxier.node(),
        config: &proxier.config().planner,
        desired: proxier.desired(),
    };
    let module_files = request
        .module_files
        .clone()
        .unwrap_or_else(|| ModuleFiles::for_release(&kernel_release()));
    let query = KernelQuery::for_service(
        picture,
        &request.service,
        request.link.clone(),
        table_name,
        module_files,
    );
    let mut facts = kernel::read(&query, &NftBackend::default()).await;
    // The check a start makes before its first write (`KernelProxier::connect`), with the
    // same words.
    let check = Netfilter::new(NftBackend::default(), request.config.netfilter.clone())
        .map_err(EngineError::from)?;
    facts.netfilter_refused = check
        .check_plan(&empty_plan(&request.config.planner))
        .await
        .err()
        .map(|error| EngineError::NetfilterRefused(error).to_string());
    for port in &query.health_check_ports {
        let answer = probe(SocketAddr::new(request.health_check_address, *port)).await;
        facts.health_checks.insert(*port, answer);
    }
    Ok(proxier_core::explain::explain(
        picture,
        &request.service,
        &facts,
        request.client,
    ))
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default()
}

/// One `GET /` to a health-check node port: its HTTP status.
async fn probe(address: SocketAddr) -> Result<HealthAnswer, String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        stream
            .write_all(b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await?;
        let mut head = Vec::new();
        let mut buf = [0u8; 512];
        while !head.contains(&b'\n') {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(head)
    };
    let head = match tokio::time::timeout(HEALTH_CHECK_TIMEOUT, exchange).await {
        Ok(Ok(head)) => head,
        Ok(Err(error)) => return Err(format!("{address}: {error}")),
        Err(_) => {
            return Err(format!(
                "{address}: no answer within {HEALTH_CHECK_TIMEOUT:?}"
            ));
        }
    };
    let line = String::from_utf8_lossy(&head);
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| format!("{address}: not an HTTP answer: {:?}", line.lines().next()))?;
    Ok(HealthAnswer { status })
}
