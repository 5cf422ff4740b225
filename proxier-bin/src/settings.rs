//! One typed [`Settings`] resolved from built-in defaults, the config file and the flags, in
//! that order of precedence (flags win), with contradictions refused.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use proxier_core::engine::driver::DriverConfig;
/// Which node addresses serve NodePorts: the planner's own type.
pub use proxier_core::model::NodePortAddresses;
use proxier_core::model::config::{DetectLocal, InterfaceName};
use proxier_core::model::{AddressFamily, Config, ConfigError, IpvsTimeouts};
use proxier_core::sysctl::ConntrackSettings;
use proxier_runtime::go_duration::format_go_duration;
use proxier_runtime::traffic::TrafficLevel;

use crate::cli::{Cli, LogFormat, OutputFormat, ServiceCidrsEntry};
use crate::config::{KubeProxyConfiguration, kube_proxy_path};

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
/// kube-proxy's `oomScoreAdj` (the kubelet's `KubeProxyOOMScoreAdj`).
pub const DEFAULT_OOM_SCORE_ADJ: i32 = -999;
/// The IPVS schedulers a scheduler setting may name: kube-proxy's list (`rr wrr lc wlc lblc
/// lblcr sh dh sed nq`) and the kernel's others (`mh fo ovf twos`).
pub const IPVS_SCHEDULERS: [&str; 14] = [
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "mh", "fo", "ovf", "twos",
];

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
    /// With the API server source: streaming lists (the default) instead of paginated ones.
    pub api_streaming_lists: bool,
    /// With the API server source: Services and EndpointSlices listed and watched in
    /// protobuf (`--kube-api-content-type=application/vnd.kubernetes.protobuf`, the default as
    /// in kube-proxy; `application/json` turns it off): streamed with
    /// [`Settings::api_streaming_lists`], paginated without.
    pub api_protobuf_lists: bool,
    /// With the API server source: watch ServiceCIDR objects and route their ranges
    /// (`--bind-service-cidrs=auto`).
    pub follow_service_cidrs: bool,
    /// This node's name (lower-cased, as kube-proxy does).
    pub hostname: String,
    /// What the planner needs: scheduler, excluded CIDRs, NodePort addresses, strict ARP,
    /// IPVS timeouts, masquerading and how local traffic is recognised.
    pub planner: Config,
    /// The sync loop's timing: sync period, minimum sync period and burst.
    pub driver: DriverConfig,
    /// Metrics server address; none disables it.
    pub metrics_bind_address: Option<SocketAddr>,
    /// `--ipvs-traffic-metrics`.
    pub traffic_metrics: TrafficLevel,
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
    /// Conntrack sysctls applied at start (not in a dry run).
    pub conntrack: ConntrackSettings,
    /// The process's `oom_score_adj`, applied at start (not in a dry run).
    pub oom_score_adj: i32,
}

impl Settings {
    /// How long a queued change may wait for a sync before /healthz reports unhealthy:
    /// twice the sync period, as kube-proxy does.
    pub fn health_timeout(&self) -> Duration {
        self.driver.sync_period.saturating_mul(2)
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> SettingsError {
    SettingsError::Invalid {
        field,
        reason: reason.into(),
    }
}

fn conflict(message: &str) -> SettingsError {
    SettingsError::Conflict(message.to_owned())
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

fn parse_nodeport_addresses(
    field: &'static str,
    items: &[String],
) -> Result<NodePortAddresses, SettingsError> {
    let items: Vec<&str> = items
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .collect();
    if items.is_empty() {
        return Ok(NodePortAddresses::All);
    }
    if items.contains(&"primary") {
        if items.len() > 1 {
            return Err(invalid(field, "\"primary\" cannot be combined with CIDRs"));
        }
        return Ok(NodePortAddresses::Primary);
    }
    items
        .iter()
        .map(|s| {
            s.parse::<IpNet>()
                .map_err(|_| invalid(field, format!("{s:?} is not a CIDR")))
        })
        .collect::<Result<_, _>>()
        .map(NodePortAddresses::Cidrs)
}

/// kube-proxy's `--detect-local-mode` values.
pub const DETECT_LOCAL_MODES: [&str; 4] = [
    "ClusterCIDR",
    "NodeCIDR",
    "BridgeInterface",
    "InterfaceNamePrefix",
];

/// The flag's value (named by `flag`) over the file's (named by `field`), for the settings
/// whose errors name where the value came from; blank values are absent.
fn layered<'a>(
    (flag, flag_value): (&'static str, &'a Option<String>),
    (field, file_value): (&'static str, &'a Option<String>),
) -> Option<(&'static str, &'a str)> {
    let given = |v: &'a Option<String>| v.as_deref().map(str::trim).filter(|s| !s.is_empty());
    given(flag_value)
        .map(|v| (flag, v))
        .or_else(|| given(file_value).map(|v| (field, v)))
}

/// The flag's value (named by `flag`) over the file's (named by kube-proxy's path for
/// `field`), for the settings whose errors name where the value came from.
fn origin<T: Clone>(
    (flag, flag_value): (&'static str, &Option<T>),
    (field, file_value): (&'static str, &Option<T>),
) -> Option<(&'static str, T)> {
    flag_value.clone().map(|v| (flag, v)).or_else(|| {
        file_value
            .clone()
            .map(|v| (kube_proxy_path(field).unwrap_or(field), v))
    })
}

/// Resolves `--detect-local-mode` (or `detectLocalMode`) and the interface setting its mode
/// needs; the other mode's interface setting is ignored, as kube-proxy ignores it.
fn resolve_detect_local(cli: &Cli, file: &Cli) -> Result<DetectLocal, SettingsError> {
    let mode = layered(
        ("--detect-local-mode", &cli.detect_local_mode),
        ("detectLocalMode", &file.detect_local_mode),
    );
    let interface = |flag, flag_value, field, file_value, mode: &str| {
        let (source, name) = layered((flag, flag_value), (field, file_value)).ok_or_else(|| {
            invalid(
                flag,
                format!("--detect-local-mode={mode} needs {flag} (or {field})"),
            )
        })?;
        InterfaceName::new(name).map_err(|e| invalid(source, e.to_string()))
    };
    match mode {
        None | Some((_, "ClusterCIDR")) => Ok(DetectLocal::ClusterCidr),
        Some((_, "NodeCIDR")) => Ok(DetectLocal::NodeCidr),
        Some((_, mode @ "BridgeInterface")) => interface(
            "--pod-bridge-interface",
            &cli.pod_bridge_interface,
            "detectLocal.bridgeInterface",
            &file.pod_bridge_interface,
            mode,
        )
        .map(DetectLocal::BridgeInterface),
        Some((_, mode @ "InterfaceNamePrefix")) => interface(
            "--pod-interface-name-prefix",
            &cli.pod_interface_name_prefix,
            "detectLocal.interfaceNamePrefix",
            &file.pod_interface_name_prefix,
            mode,
        )
        .map(DetectLocal::InterfaceNamePrefix),
        Some((source, other)) => Err(invalid(
            source,
            format!("{other:?} is not one of {}", DETECT_LOCAL_MODES.join(", ")),
        )),
    }
}

/// Resolves flags over the config file over defaults. `system_hostname` is the machine's
/// hostname, used when neither `--hostname-override` nor `hostnameOverride` is set.
pub fn resolve(
    cli: &Cli,
    file: Option<&KubeProxyConfiguration>,
    system_hostname: &str,
) -> Result<Settings, SettingsError> {
    let empty = Cli::default();
    let file = file.map_or(&empty, |f| &f.values);
    // The flag over the file's value; the default is applied by each caller.
    macro_rules! value {
        ($field:ident) => {
            cli.$field.clone().or_else(|| file.$field.clone())
        };
    }

    // Proxy mode: only ipvs, compared exactly as kube-proxy compares it.
    if let Some((source, mode)) = origin(
        ("--proxy-mode", &cli.proxy_mode),
        ("mode", &file.proxy_mode),
    ) {
        match mode.trim() {
            "" | "ipvs" => {}
            "iptables" | "nftables" => {
                return Err(SettingsError::Conflict(format!(
                    "proxy mode {mode:?} is not supported: ipvs-proxier only implements \"ipvs\""
                )));
            }
            other => {
                return Err(invalid(
                    source,
                    format!(
                        "Invalid value: {other:?}: must be iptables,ipvs,nftables or blank \
                         (ipvs-proxier implements \"ipvs\", and blank means ipvs)"
                    ),
                ));
            }
        }
    }

    // Source: the flags only, a kubeconfig in the file does not compete with --source-file.
    if cli.source_file.is_some() && (cli.master.is_some() || cli.kubeconfig.is_some()) {
        return Err(conflict(
            "--source-file cannot be combined with --master or --kubeconfig: pick one source",
        ));
    }
    let source = match &cli.source_file {
        Some(path) => SourceSettings::File { path: path.clone() },
        None => SourceSettings::Kube {
            kubeconfig: value!(kubeconfig),
            master: cli.master.clone().filter(|m| !m.trim().is_empty()),
        },
    };

    // Run mode.
    let [cleanup, once, dry_run, watch] =
        [cli.cleanup, cli.once, cli.dry_run, cli.watch].map(|flag| flag.unwrap_or(false));
    if cleanup && (once || dry_run) {
        return Err(conflict(
            "--cleanup cannot be combined with --once or --dry-run",
        ));
    }
    if cleanup && cli.source_file.is_some() {
        return Err(conflict("--cleanup needs no source: drop --source-file"));
    }
    if watch && !dry_run {
        return Err(conflict(
            "--watch only applies to --dry-run (the daemon always follows its source)",
        ));
    }
    if watch && once {
        return Err(conflict(
            "--watch and --once contradict each other: pick one",
        ));
    }
    if cli.output.is_some() && !dry_run {
        return Err(conflict("--output only applies to --dry-run"));
    }
    // A dry run prints one plan and exits (as `terraform plan`), unless asked to watch.
    let run_mode = if cleanup {
        RunMode::Cleanup
    } else if once || (dry_run && !watch) {
        RunMode::Once
    } else {
        RunMode::Daemon
    };

    let hostname = value!(hostname_override)
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
    let bind_address = value!(bind_address).unwrap_or(Ipv4Addr::UNSPECIFIED.into());
    let (healthz_host, metrics_host): (IpAddr, IpAddr) = match bind_address {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED.into(), Ipv4Addr::LOCALHOST.into()),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED.into(), Ipv6Addr::LOCALHOST.into()),
    };
    // A flag set to "" disables the server (a blank file field is absent: the default).
    let server_address = |given: Option<(&'static str, String)>, default: SocketAddr| {
        match given {
            Some((_, text)) if text.trim().is_empty() => Ok(None),
            Some((field, text)) => parse_bind_address(field, &text, default.port()).map(Some),
            // A dry run serves nothing unless asked: it must run beside a live proxier that
            // holds the default ports.
            None => Ok((!dry_run).then_some(default)),
        }
    };
    // kube-proxy refuses port 0 (validateHostPort); a flag may ask for it (an ephemeral
    // port, for tests), a file may not.
    for (field, text) in [
        ("healthzBindAddress", &file.healthz_bind_address),
        ("metricsBindAddress", &file.metrics_bind_address),
    ] {
        let field = kube_proxy_path(field).unwrap_or(field);
        if let Some(text) = text.as_deref()
            && parse_bind_address(field, text, 1)?.port() == 0
        {
            return Err(invalid(field, "Invalid value: \"0\": must be a valid port"));
        }
    }
    let healthz_bind_address = server_address(
        origin(
            ("--healthz-bind-address", &cli.healthz_bind_address),
            ("healthzBindAddress", &file.healthz_bind_address),
        ),
        SocketAddr::new(healthz_host, DEFAULT_HEALTHZ_PORT),
    )?;
    let metrics_bind_address = server_address(
        origin(
            ("--metrics-bind-address", &cli.metrics_bind_address),
            ("metricsBindAddress", &file.metrics_bind_address),
        ),
        SocketAddr::new(metrics_host, DEFAULT_METRICS_PORT),
    )?;

    let cluster_cidrs = value!(cluster_cidr).unwrap_or_default();
    let v4 = cluster_cidrs
        .iter()
        .filter(|c| matches!(c, IpNet::V4(_)))
        .count();
    if v4 > 1 || cluster_cidrs.len() - v4 > 1 {
        let field = if cli.cluster_cidr.is_some() {
            "--cluster-cidr"
        } else {
            "KubeProxyConfiguration.ClusterCIDR"
        };
        return Err(invalid(
            field,
            "at most one CIDR per IP family is allowed (a valid DualStack CIDR is one of each)",
        ));
    }

    let node_port_addresses = match (&cli.nodeport_addresses, &file.nodeport_addresses) {
        (Some(items), _) => parse_nodeport_addresses("--nodeport-addresses", items)?,
        (None, Some(items)) => {
            parse_nodeport_addresses("KubeProxyConfiguration.NodePortAddresses", items)?
        }
        (None, None) => NodePortAddresses::All,
    };

    // IPVS.
    let sync_period = value!(ipvs_sync_period).unwrap_or(DEFAULT_SYNC_PERIOD);
    if sync_period.is_zero() {
        return Err(invalid("--ipvs-sync-period", "must be greater than 0"));
    }
    let min_sync_period =
        value!(ipvs_min_sync_period).unwrap_or(DEFAULT_MIN_SYNC_PERIOD.min(sync_period));
    if min_sync_period > sync_period
        && cli.ipvs_sync_period.is_none()
        && cli.ipvs_min_sync_period.is_none()
    {
        // Both from the file: kube-proxy's message.
        return Err(invalid(
            "KubeProxyConfiguration.KubeProxyIPVSConfiguration.SyncPeriod",
            format!(
                "Invalid value: {:?}: must be greater than or equal to \
                 KubeProxyConfiguration.KubeProxyIPVSConfiguration.MinSyncPeriod",
                format_go_duration(min_sync_period)
            ),
        ));
    }
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
    let non_zero = |d: Option<Duration>| d.filter(|d| !d.is_zero());
    let mut follow_service_cidrs = false;
    let mut service_cidr_routes: Vec<IpNet> = Vec::new();
    for entry in cli.bind_service_cidrs.iter().flatten() {
        match entry {
            ServiceCidrsEntry::Auto => follow_service_cidrs = true,
            ServiceCidrsEntry::Cidr(net) => service_cidr_routes.push(net.trunc()),
        }
    }
    let scheduler = match origin(
        ("--ipvs-scheduler", &cli.ipvs_scheduler),
        ("ipvs.scheduler", &file.ipvs_scheduler),
    ) {
        None => Default::default(),
        Some((_, scheduler)) if IPVS_SCHEDULERS.contains(&scheduler.name()) => scheduler,
        Some((source, scheduler)) => {
            return Err(invalid(
                source,
                format!(
                    "Invalid value: {:?}: must be in [{}], blank means the default \
                     algorithm method (currently rr)",
                    scheduler.name(),
                    IPVS_SCHEDULERS.join(" ")
                ),
            ));
        }
    };
    let conntrack = resolve_conntrack(cli, file)?;
    let oom_score_adj = match origin(
        ("--oom-score-adj", &cli.oom_score_adj),
        ("oomScoreAdj", &file.oom_score_adj),
    ) {
        None => DEFAULT_OOM_SCORE_ADJ,
        Some((_, value)) if (-1000..=1000).contains(&value) => value,
        Some((source, value)) => {
            return Err(invalid(
                source,
                format!("Invalid value: {value}: must be within the range [-1000, 1000]"),
            ));
        }
    };
    let planner = Config {
        scheduler,
        exclude_cidrs: value!(ipvs_exclude_cidrs).unwrap_or_default(),
        node_port_addresses,
        strict_arp: value!(ipvs_strict_arp).unwrap_or(false),
        timeouts: IpvsTimeouts {
            tcp: non_zero(value!(ipvs_tcp_timeout)),
            tcp_fin: non_zero(value!(ipvs_tcpfin_timeout)),
            udp: non_zero(value!(ipvs_udp_timeout)),
        },
        masquerade_all: value!(masquerade_all).unwrap_or(false),
        cluster_cidrs,
        families: AddressFamily::ALL.into_iter().collect(),
        detect_local: resolve_detect_local(cli, file)?,
        service_cidr_routes,
    };
    planner.check().map_err(|error| match error {
        ConfigError::RouteOverClusterCidr { .. } => {
            invalid("--bind-service-cidrs", error.to_string())
        }
        ConfigError::RoutesWithoutStrictArp => conflict(&error.to_string()),
    })?;
    if follow_service_cidrs {
        if !planner.strict_arp {
            return Err(conflict(&ConfigError::RoutesWithoutStrictArp.to_string()));
        }
        if !matches!(source, SourceSettings::Kube { .. }) {
            return Err(conflict(
                "--bind-service-cidrs=auto follows the API server's ServiceCIDR objects: \
                 it cannot be used with --source-file (list the CIDRs instead)",
            ));
        }
    }

    let dummy_interface = cli
        .dummy_interface
        .as_deref()
        .unwrap_or(DEFAULT_DUMMY_INTERFACE);
    let dummy_interface = InterfaceName::new(dummy_interface)
        .map_err(|e| invalid("--dummy-interface", e.to_string()))?
        .to_string();

    let content_type = origin(
        ("--kube-api-content-type", &cli.kube_api_content_type),
        ("clientConnection.contentType", &file.kube_api_content_type),
    );
    let api_protobuf_lists = match content_type.as_ref().map(|(o, v)| (*o, v.trim())) {
        // Unset or blank (kubeadm's value) is kube-proxy's default: protobuf.
        None | Some((_, "" | "application/vnd.kubernetes.protobuf")) => true,
        Some((_, "application/json")) => false,
        Some((source, other)) => {
            return Err(invalid(
                source,
                format!(
                    "{other:?} is not a content type the API server serves lists in: \
                     application/vnd.kubernetes.protobuf or application/json"
                ),
            ));
        }
    };

    Ok(Settings {
        source,
        api_streaming_lists: cli.api_streaming_lists.unwrap_or(true),
        api_protobuf_lists,
        follow_service_cidrs,
        hostname,
        planner,
        driver: DriverConfig::new(sync_period, min_sync_period, sync_burst),
        metrics_bind_address,
        traffic_metrics: cli.ipvs_traffic_metrics.unwrap_or_default(),
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
        conntrack,
        oom_score_adj,
    })
}

/// The conntrack settings, flags over the file over kube-proxy's defaults; negative counts
/// are refused as kube-proxy's validation refuses them.
fn resolve_conntrack(cli: &Cli, file: &Cli) -> Result<ConntrackSettings, SettingsError> {
    let defaults = ConntrackSettings::default();
    let count = |flag, flag_value, field, file_value, default: u32| match origin(
        (flag, flag_value),
        (field, file_value),
    ) {
        None => Ok(default),
        Some((source, value)) => u32::try_from(value).map_err(|_| {
            invalid(
                source,
                format!("Invalid value: {value}: must be greater than or equal to 0"),
            )
        }),
    };
    macro_rules! value {
        ($field:ident) => {
            cli.$field.or(file.$field)
        };
    }
    Ok(ConntrackSettings {
        max_per_core: count(
            "--conntrack-max-per-core",
            &cli.conntrack_max_per_core,
            "conntrack.maxPerCore",
            &file.conntrack_max_per_core,
            defaults.max_per_core,
        )?,
        min: count(
            "--conntrack-min",
            &cli.conntrack_min,
            "conntrack.min",
            &file.conntrack_min,
            defaults.min,
        )?,
        tcp_established_timeout: value!(conntrack_tcp_timeout_established)
            .unwrap_or(defaults.tcp_established_timeout),
        tcp_close_wait_timeout: value!(conntrack_tcp_timeout_close_wait)
            .unwrap_or(defaults.tcp_close_wait_timeout),
        tcp_be_liberal: value!(conntrack_tcp_be_liberal).unwrap_or(defaults.tcp_be_liberal),
        udp_timeout: value!(conntrack_udp_timeout).unwrap_or(defaults.udp_timeout),
        udp_stream_timeout: value!(conntrack_udp_timeout_stream)
            .unwrap_or(defaults.udp_stream_timeout),
    })
}

/// The machine's hostname, as the kernel reports it (empty when it cannot be read).
pub fn system_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_default()
}
