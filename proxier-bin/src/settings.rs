//! One typed [`Settings`] resolved from built-in defaults, the config file and the flags, in
//! that order of precedence (flags win), with contradictions refused.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use ipvs_netlink::Scheduler;
use proxier_core::model::config::{DetectLocal, InterfaceName};

use crate::cli::{Cli, LogFormat, OutputFormat};
use crate::config::KubeProxyConfiguration;
use crate::go_duration::format_go_duration;

/// kube-proxy's health server port.
pub const DEFAULT_HEALTHZ_PORT: u16 = 10256;
/// kube-proxy's metrics server port.
pub const DEFAULT_METRICS_PORT: u16 = 10249;
/// kube-proxy's default sync period.
pub const DEFAULT_SYNC_PERIOD: Duration = Duration::from_secs(30);
/// kube-proxy's default minimum sync period.
pub const DEFAULT_MIN_SYNC_PERIOD: Duration = Duration::from_secs(1);
/// kube-proxy's IPVS proxier allows two syncs back to back.
pub const DEFAULT_SYNC_BURST: u32 = 2;
/// kube-proxy's dummy link for Service VIPs.
pub const DEFAULT_DUMMY_INTERFACE: &str = "kube-ipvs0";

/// Settings that cannot be used together or make no sense. All map to exit code 2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// Two settings contradict each other.
    #[error("{0}")]
    Conflict(String),
    /// A value is out of range or malformed.
    #[error("invalid value for {field}: {reason}")]
    Invalid {
        /// The flag or config field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl SettingsError {
    /// The process exit code for this error: 2, as for any usage error.
    pub fn exit_code(&self) -> i32 {
        2
    }
}

/// Where Services, EndpointSlices and the Node come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSettings {
    /// A YAML file of manifests, watched for changes.
    File {
        /// The file.
        path: PathBuf,
    },
    /// The Kubernetes API server.
    Kube {
        /// `--kubeconfig` (or `clientConnection.kubeconfig`); none means in-cluster, then the
        /// default kubeconfig.
        kubeconfig: Option<PathBuf>,
        /// `--master`: the API server URL, overriding the kubeconfig's.
        master: Option<String>,
    },
}

/// Which node addresses serve NodePorts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NodePortAddresses {
    /// Every local address (kube-proxy's behaviour when the setting is empty).
    #[default]
    All,
    /// The node's primary IP of each family (`primary`).
    Primary,
    /// Local addresses inside these CIDRs.
    Cidrs(Vec<IpNet>),
}

/// IPVS-specific settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsSettings {
    /// Scheduler for every virtual server.
    pub scheduler: Scheduler,
    /// Interval of the periodic full resync (also bounds the time between syncs).
    pub sync_period: Duration,
    /// Minimum interval between syncs triggered by changes (0: none).
    pub min_sync_period: Duration,
    /// How many syncs may run back to back before `min_sync_period` applies.
    pub sync_burst: u32,
    /// Addresses the proxier never touches.
    pub exclude_cidrs: Vec<IpNet>,
    /// Whether to set arp_ignore/arp_announce for the VIPs.
    pub strict_arp: bool,
    /// IPVS TCP idle timeout (0: leave the kernel's).
    pub tcp_timeout: Duration,
    /// IPVS TCP FIN timeout (0: leave the kernel's).
    pub tcp_fin_timeout: Duration,
    /// IPVS UDP timeout (0: leave the kernel's).
    pub udp_timeout: Duration,
}

/// What the process is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunMode {
    /// Keep the data plane in sync until a signal arrives.
    Daemon,
    /// Sync once after the sources have synced, then exit.
    Once,
    /// Remove what the proxier created, then exit.
    Cleanup,
}

/// Logging settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogSettings {
    /// Text or JSON.
    pub format: LogFormat,
    /// klog-style verbosity.
    pub verbosity: u8,
}

/// Everything the daemon needs, typed and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Where cluster objects come from.
    pub source: SourceSettings,
    /// This node's name (lower-cased, as kube-proxy does).
    pub hostname: String,
    /// `--bind-address`: selects the primary IP family.
    pub bind_address: IpAddr,
    /// Pod CIDRs (at most one per family).
    pub cluster_cidrs: Vec<IpNet>,
    /// Masquerade all traffic to cluster IPs.
    pub masquerade_all: bool,
    /// How traffic from local pods is recognised (`--detect-local-mode`).
    pub detect_local: DetectLocal,
    /// Addresses that serve NodePorts.
    pub nodeport_addresses: NodePortAddresses,
    /// IPVS settings.
    pub ipvs: IpvsSettings,
    /// Metrics server address; none disables it.
    pub metrics_bind_address: Option<SocketAddr>,
    /// Health server address; none disables it.
    pub healthz_bind_address: Option<SocketAddr>,
    /// Daemon, once or cleanup.
    pub run_mode: RunMode,
    /// Plan and print, never touch the kernel.
    pub dry_run: bool,
    /// How the dry run prints (`--output`).
    pub output: OutputFormat,
    /// The dummy link holding VIPs.
    pub dummy_interface: String,
    /// Remove kube-proxy's IPVS-mode netfilter part after the first sync (`--take-over-kube-proxy`).
    pub take_over_kube_proxy: bool,
    /// Logging.
    pub log: LogSettings,
}

impl Settings {
    /// The planner's configuration (proxier-core's model) for these settings.
    pub fn planner_config(&self) -> proxier_core::model::Config {
        use proxier_core::model::{
            AddressFamily, Config, IpvsTimeouts, NodePortAddresses as CoreNpa,
        };
        let non_zero = |d: Duration| (!d.is_zero()).then_some(d);
        Config {
            scheduler: self.ipvs.scheduler.clone(),
            exclude_cidrs: self.ipvs.exclude_cidrs.clone(),
            node_port_addresses: match &self.nodeport_addresses {
                NodePortAddresses::All => CoreNpa::All,
                NodePortAddresses::Primary => CoreNpa::Primary,
                NodePortAddresses::Cidrs(cidrs) => CoreNpa::Cidrs(cidrs.clone()),
            },
            strict_arp: self.ipvs.strict_arp,
            timeouts: IpvsTimeouts {
                tcp: non_zero(self.ipvs.tcp_timeout),
                tcp_fin: non_zero(self.ipvs.tcp_fin_timeout),
                udp: non_zero(self.ipvs.udp_timeout),
            },
            masquerade_all: self.masquerade_all,
            cluster_cidrs: self.cluster_cidrs.clone(),
            families: AddressFamily::ALL.into_iter().collect(),
            detect_local: self.detect_local.clone(),
        }
    }

    /// How long a queued change may wait for a sync before /healthz reports unhealthy:
    /// twice the sync period, as kube-proxy does.
    pub fn health_timeout(&self) -> Duration {
        self.ipvs.sync_period.saturating_mul(2)
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> SettingsError {
    SettingsError::Invalid {
        field,
        reason: reason.into(),
    }
}

/// Parses a bind address as kube-proxy accepts it: `ip:port`, `[v6]:port`, or a bare IP that
/// gets `default_port`.
pub fn parse_bind_address(
    field: &'static str,
    text: &str,
    default_port: u16,
) -> Result<SocketAddr, SettingsError> {
    let text = text.trim();
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let bare = text.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, default_port))
        .map_err(|_| {
            invalid(
                field,
                format!("{text:?} is neither ip:port nor an IP address"),
            )
        })
}

fn parse_cidrs(field: &'static str, items: &[String]) -> Result<Vec<IpNet>, SettingsError> {
    items
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<IpNet>()
                .map_err(|_| invalid(field, format!("{s:?} is not a CIDR")))
        })
        .collect()
}

fn parse_nodeport_addresses(
    field: &'static str,
    items: &[String],
) -> Result<NodePortAddresses, SettingsError> {
    let items: Vec<String> = items
        .iter()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    if items.is_empty() {
        return Ok(NodePortAddresses::All);
    }
    if items.iter().any(|s| s == "primary") {
        if items.len() > 1 {
            return Err(invalid(field, "\"primary\" cannot be combined with CIDRs"));
        }
        return Ok(NodePortAddresses::Primary);
    }
    parse_cidrs(field, &items).map(NodePortAddresses::Cidrs)
}

/// kube-proxy's `--detect-local-mode` values.
pub const DETECT_LOCAL_MODES: [&str; 4] = [
    "ClusterCIDR",
    "NodeCIDR",
    "BridgeInterface",
    "InterfaceNamePrefix",
];

/// Resolves `--detect-local-mode` (or `detectLocalMode`) and the interface setting its mode
/// needs; the other mode's interface setting is ignored, as kube-proxy ignores it.
fn resolve_detect_local(
    cli: &Cli,
    file: &KubeProxyConfiguration,
) -> Result<DetectLocal, SettingsError> {
    let non_empty = |v: Option<&String>| {
        v.map(|s| s.trim().to_owned())
            .filter(|s: &String| !s.is_empty())
    };
    let (mode_field, mode) = match non_empty(cli.detect_local_mode.as_ref()) {
        Some(mode) => ("--detect-local-mode", Some(mode)),
        None => (
            "detectLocalMode",
            non_empty(file.detect_local_mode.as_ref()),
        ),
    };
    let interface = |flag: &'static str,
                     flag_value: &Option<String>,
                     file_field: &'static str,
                     file_value: &Option<String>,
                     mode: &str|
     -> Result<InterfaceName, SettingsError> {
        let (field, value) = match non_empty(flag_value.as_ref()) {
            Some(v) => (flag, Some(v)),
            None => (file_field, non_empty(file_value.as_ref())),
        };
        let value = value.ok_or_else(|| {
            invalid(
                flag,
                format!("--detect-local-mode={mode} needs {flag} (or {file_field})"),
            )
        })?;
        InterfaceName::new(&value).map_err(|e| invalid(field, e.to_string()))
    };
    match mode.as_deref() {
        None | Some("ClusterCIDR") => Ok(DetectLocal::ClusterCidr),
        Some("NodeCIDR") => Ok(DetectLocal::NodeCidr),
        Some(mode @ "BridgeInterface") => interface(
            "--pod-bridge-interface",
            &cli.pod_bridge_interface,
            "detectLocal.bridgeInterface",
            &file.detect_local.bridge_interface,
            mode,
        )
        .map(DetectLocal::BridgeInterface),
        Some(mode @ "InterfaceNamePrefix") => interface(
            "--pod-interface-name-prefix",
            &cli.pod_interface_name_prefix,
            "detectLocal.interfaceNamePrefix",
            &file.detect_local.interface_name_prefix,
            mode,
        )
        .map(DetectLocal::InterfaceNamePrefix),
        Some(other) => Err(invalid(
            mode_field,
            format!("{other:?} is not one of {}", DETECT_LOCAL_MODES.join(", ")),
        )),
    }
}

fn check_cluster_cidrs(cidrs: &[IpNet]) -> Result<(), SettingsError> {
    let v4 = cidrs.iter().filter(|c| matches!(c, IpNet::V4(_))).count();
    let v6 = cidrs.len() - v4;
    if v4 > 1 || v6 > 1 {
        return Err(invalid(
            "--cluster-cidr",
            "at most one CIDR per IP family is allowed",
        ));
    }
    Ok(())
}

/// Resolves flags over the config file over defaults. `system_hostname` is the machine's
/// hostname, used when neither `--hostname-override` nor `hostnameOverride` is set.
pub fn resolve(
    cli: &Cli,
    file: Option<&KubeProxyConfiguration>,
    system_hostname: &str,
) -> Result<Settings, SettingsError> {
    let empty = KubeProxyConfiguration::default();
    let file = file.unwrap_or(&empty);

    // Proxy mode: only ipvs.
    let mode = cli.proxy_mode.clone().or_else(|| file.mode.clone());
    if let Some(mode) = mode.as_deref().map(str::trim)
        && !mode.is_empty()
        && !mode.eq_ignore_ascii_case("ipvs")
    {
        return Err(SettingsError::Conflict(format!(
            "proxy mode {mode:?} is not supported: ipvs-proxier only implements \"ipvs\""
        )));
    }

    // Source.
    if cli.source_file.is_some() && (cli.master.is_some() || cli.kubeconfig.is_some()) {
        return Err(SettingsError::Conflict(
            "--source-file cannot be combined with --master or --kubeconfig: pick one source"
                .to_owned(),
        ));
    }
    let source = match &cli.source_file {
        Some(path) => SourceSettings::File { path: path.clone() },
        None => SourceSettings::Kube {
            kubeconfig: cli.kubeconfig.clone().or_else(|| {
                file.client_connection
                    .kubeconfig
                    .as_ref()
                    .map(PathBuf::from)
            }),
            master: cli.master.clone().filter(|m| !m.trim().is_empty()),
        },
    };

    // Run mode.
    let cleanup = cli.cleanup.unwrap_or(false);
    let once = cli.once.unwrap_or(false);
    let dry_run = cli.dry_run.unwrap_or(false);
    if cleanup && (once || dry_run) {
        return Err(SettingsError::Conflict(
            "--cleanup cannot be combined with --once or --dry-run".to_owned(),
        ));
    }
    if cleanup && cli.source_file.is_some() {
        return Err(SettingsError::Conflict(
            "--cleanup needs no source: drop --source-file".to_owned(),
        ));
    }
    let watch = cli.watch.unwrap_or(false);
    if watch && !dry_run {
        return Err(SettingsError::Conflict(
            "--watch only applies to --dry-run (the daemon always follows its source)".to_owned(),
        ));
    }
    if watch && once {
        return Err(SettingsError::Conflict(
            "--watch and --once contradict each other: pick one".to_owned(),
        ));
    }
    if cli.output.is_some() && !dry_run {
        return Err(SettingsError::Conflict(
            "--output only applies to --dry-run".to_owned(),
        ));
    }
    // A dry run prints one plan and exits (as `terraform plan`), unless asked to watch.
    let once = once || (dry_run && !watch);
    let run_mode = if cleanup {
        RunMode::Cleanup
    } else if once {
        RunMode::Once
    } else {
        RunMode::Daemon
    };

    // Hostname.
    let hostname = cli
        .hostname_override
        .clone()
        .or_else(|| file.hostname_override.clone())
        .unwrap_or_else(|| system_hostname.to_owned())
        .trim()
        .to_lowercase();
    if hostname.is_empty() {
        return Err(invalid(
            "--hostname-override",
            "the node name is empty (set --hostname-override)",
        ));
    }

    // Addresses.
    let bind_address = match (&cli.bind_address, &file.bind_address) {
        (Some(ip), _) => *ip,
        (None, Some(text)) => text
            .trim()
            .parse()
            .map_err(|_| invalid("bindAddress", format!("{text:?} is not an IP address")))?,
        (None, None) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    };
    let (healthz_host, metrics_host): (IpAddr, IpAddr) = match bind_address {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED.into(), Ipv4Addr::LOCALHOST.into()),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED.into(), Ipv6Addr::LOCALHOST.into()),
    };
    // A flag set to "" disables the server; an empty file field means the default.
    let server_address = |field: &'static str,
                          flag: &Option<String>,
                          from_file: &Option<String>,
                          default: SocketAddr|
     -> Result<Option<SocketAddr>, SettingsError> {
        match (flag, from_file) {
            (Some(text), _) if text.trim().is_empty() => Ok(None),
            (Some(text), _) => parse_bind_address(field, text, default.port()).map(Some),
            (None, Some(text)) if !text.trim().is_empty() => {
                parse_bind_address(field, text, default.port()).map(Some)
            }
            // A dry run serves nothing unless asked: it must run beside a live proxier that
            // holds the default ports.
            _ => Ok((!dry_run).then_some(default)),
        }
    };
    let healthz_bind_address = server_address(
        "--healthz-bind-address",
        &cli.healthz_bind_address,
        &file.healthz_bind_address,
        SocketAddr::new(healthz_host, DEFAULT_HEALTHZ_PORT),
    )?;
    let metrics_bind_address = server_address(
        "--metrics-bind-address",
        &cli.metrics_bind_address,
        &file.metrics_bind_address,
        SocketAddr::new(metrics_host, DEFAULT_METRICS_PORT),
    )?;

    let cluster_cidrs = match (&cli.cluster_cidr, &file.cluster_cidr) {
        (Some(cidrs), _) => cidrs.clone(),
        (None, Some(text)) => {
            let items: Vec<String> = text.split(',').map(str::to_owned).collect();
            parse_cidrs("clusterCIDR", &items)?
        }
        (None, None) => Vec::new(),
    };
    check_cluster_cidrs(&cluster_cidrs)?;
    let detect_local = resolve_detect_local(cli, file)?;

    let nodeport_addresses = match (&cli.nodeport_addresses, &file.node_port_addresses) {
        (Some(items), _) => parse_nodeport_addresses("--nodeport-addresses", items)?,
        (None, Some(items)) => parse_nodeport_addresses("nodePortAddresses", items)?,
        (None, None) => NodePortAddresses::All,
    };

    // IPVS.
    let scheduler = match (&cli.ipvs_scheduler, &file.ipvs.scheduler) {
        (Some(s), _) => s.clone(),
        (None, Some(name)) => name
            .parse()
            .map_err(|e| invalid("ipvs.scheduler", format!("{e}")))?,
        (None, None) => Scheduler::default(),
    };
    let sync_period = cli
        .ipvs_sync_period
        .or(file.ipvs.sync_period)
        .unwrap_or(DEFAULT_SYNC_PERIOD);
    if sync_period.is_zero() {
        return Err(invalid("--ipvs-sync-period", "must be greater than 0"));
    }
    let min_sync_period = cli
        .ipvs_min_sync_period
        .or(file.ipvs.min_sync_period)
        .unwrap_or(DEFAULT_MIN_SYNC_PERIOD.min(sync_period));
    if min_sync_period > sync_period {
        return Err(SettingsError::Conflict(format!(
            "--ipvs-min-sync-period ({}) must not be greater than --ipvs-sync-period ({})",
            format_go_duration(min_sync_period),
            format_go_duration(sync_period)
        )));
    }
    let sync_burst = cli.ipvs_sync_burst.unwrap_or(DEFAULT_SYNC_BURST);
    if sync_burst == 0 {
        return Err(invalid("--ipvs-sync-burst", "must be at least 1"));
    }
    let exclude_cidrs = match (&cli.ipvs_exclude_cidrs, &file.ipvs.exclude_cidrs) {
        (Some(cidrs), _) => cidrs.clone(),
        (None, Some(items)) => parse_cidrs("ipvs.excludeCIDRs", items)?,
        (None, None) => Vec::new(),
    };
    let ipvs = IpvsSettings {
        scheduler,
        sync_period,
        min_sync_period,
        sync_burst,
        exclude_cidrs,
        strict_arp: cli
            .ipvs_strict_arp
            .or(file.ipvs.strict_arp)
            .unwrap_or(false),
        tcp_timeout: cli
            .ipvs_tcp_timeout
            .or(file.ipvs.tcp_timeout)
            .unwrap_or_default(),
        tcp_fin_timeout: cli
            .ipvs_tcpfin_timeout
            .or(file.ipvs.tcp_fin_timeout)
            .unwrap_or_default(),
        udp_timeout: cli
            .ipvs_udp_timeout
            .or(file.ipvs.udp_timeout)
            .unwrap_or_default(),
    };

    let dummy_interface = cli
        .dummy_interface
        .clone()
        .unwrap_or_else(|| DEFAULT_DUMMY_INTERFACE.to_owned());
    // IFNAMSIZ is 16 including the NUL.
    if dummy_interface.is_empty()
        || dummy_interface.len() > 15
        || dummy_interface.contains(['/', ' ', '\0'])
    {
        return Err(invalid(
            "--dummy-interface",
            format!(
                "{dummy_interface:?} is not a valid interface name (1-15 bytes, no '/' or spaces)"
            ),
        ));
    }

    Ok(Settings {
        source,
        hostname,
        bind_address,
        cluster_cidrs,
        masquerade_all: cli.masquerade_all.or(file.masquerade_all).unwrap_or(false),
        detect_local,
        nodeport_addresses,
        ipvs,
        metrics_bind_address,
        healthz_bind_address,
        run_mode,
        dry_run,
        output: cli.output.unwrap_or_default(),
        dummy_interface,
        take_over_kube_proxy: cli.take_over_kube_proxy.unwrap_or(false),
        log: LogSettings {
            format: cli.log_format.unwrap_or_default(),
            verbosity: cli.verbosity.unwrap_or(0),
        },
    })
}

/// The machine's hostname, as the kernel reports it (empty when it cannot be read).
pub fn system_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_default()
}
