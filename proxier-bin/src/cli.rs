//! Every setting, defined once: kube-proxy's flags that apply to IPVS mode (same names and
//! meanings) plus ipvs-proxier's own, each with the `KubeProxyConfiguration` field that sets it
//! (its `serde` name, a dotted path into the file; `skip` where the file has none). The flags
//! and the config file fill the same optional [`Cli`]; [`crate::settings`] takes a flag over
//! the file's value over the default.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use clap::builder::BoolishValueParser;
use ipnet::IpNet;
use ipvs_netlink::Scheduler;
use proxier_runtime::go_duration::parse_go_duration;
use proxier_runtime::plan_printer::PlanFormat;
use proxier_runtime::traffic::TrafficLevel;
use serde::Deserialize;

use crate::file_value as file;

fn parse_traffic_level(value: &str) -> Result<TrafficLevel, String> {
    value.parse()
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// How `--dry-run` prints the plan: the flag's values for the runtime's [`PlanFormat`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum OutputFormat {
    /// A summary and one row per virtual server (for people).
    #[default]
    Table,
    /// The plan as JSON (schema in docs/dry-run.md); with --watch, one document per line.
    Json,
    /// The plan as YAML (same schema); with --watch, one `---` document per sync.
    Yaml,
}

impl From<OutputFormat> for PlanFormat {
    fn from(format: OutputFormat) -> Self {
        match format {
            OutputFormat::Table => PlanFormat::Table,
            OutputFormat::Json => PlanFormat::Json,
            OutputFormat::Yaml => PlanFormat::Yaml,
        }
    }
}

/// `ipvs-proxier`: a Kubernetes Service proxy for the Linux IPVS data plane, a drop-in
/// replacement for `kube-proxy --proxy-mode=ipvs`.
#[derive(Debug, Clone, Default, Parser, Deserialize)]
#[command(name = "ipvs-proxier", version, about, long_about = None)]
#[serde(default)]
pub struct Cli {
    /// Path to a KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1). Flags given
    /// on the command line override its values.
    #[arg(long, value_name = "PATH")]
    #[serde(skip)]
    pub config: Option<PathBuf>,

    /// Path to a kubeconfig file with authorization information.
    #[arg(long, value_name = "PATH")]
    #[serde(
        rename = "clientConnection.kubeconfig",
        deserialize_with = "file::text"
    )]
    pub kubeconfig: Option<PathBuf>,

    /// The address of the Kubernetes API server (overrides any value in kubeconfig).
    #[arg(long, value_name = "URL")]
    #[serde(skip)]
    pub master: Option<String>,

    /// Fetch Services, EndpointSlices and the Node with streaming lists (Kubernetes WatchList;
    /// the default, as client-go's since Kubernetes 1.35) instead of paginated lists; an API
    /// server that refuses or ignores them gets paginated lists. `=false`: paginated lists.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    #[serde(skip)]
    pub api_streaming_lists: Option<bool>,

    /// The content type asked of the API server for the lists and watches of Services and
    /// EndpointSlices: `application/vnd.kubernetes.protobuf` (the default, as kube-proxy's; a
    /// fraction of JSON's decoding CPU) or `application/json`. The Node and ServiceCIDRs are
    /// read in JSON either way.
    #[arg(long, value_name = "TYPE")]
    #[serde(
        rename = "clientConnection.contentType",
        deserialize_with = "file::text"
    )]
    pub kube_api_content_type: Option<String>,

    /// Use this name instead of the machine's hostname to identify this node.
    #[arg(long, value_name = "NAME")]
    #[serde(rename = "hostnameOverride", deserialize_with = "file::text")]
    pub hostname_override: Option<String>,

    /// The node's primary IP address family selector: 0.0.0.0 for IPv4, :: for IPv6.
    #[arg(long, value_name = "IP")]
    #[serde(rename = "bindAddress", deserialize_with = "file::text")]
    pub bind_address: Option<IpAddr>,

    /// The CIDR range(s) of the pods in the cluster (comma-separated, one per family). Traffic to
    /// a Service from outside this range is masqueraded.
    #[arg(long, value_name = "CIDR,...", value_delimiter = ',')]
    #[serde(rename = "clusterCIDR", deserialize_with = "file::comma_cidrs")]
    pub cluster_cidr: Option<Vec<IpNet>>,

    /// How traffic from local pods is recognised (traffic to a ClusterIP from anything else is
    /// masqueraded): ClusterCIDR (sources in --cluster-cidr; the default), NodeCIDR (sources
    /// in the Node's spec.podCIDRs), BridgeInterface (arriving on --pod-bridge-interface) or
    /// InterfaceNamePrefix (arriving on an interface named --pod-interface-name-prefix*).
    #[arg(long, value_name = "MODE")]
    #[serde(rename = "detectLocalMode", deserialize_with = "file::text")]
    pub detect_local_mode: Option<String>,

    /// With --detect-local-mode=BridgeInterface: the bridge the node's pods are attached to.
    #[arg(long, value_name = "NAME")]
    #[serde(
        rename = "detectLocal.bridgeInterface",
        deserialize_with = "file::text"
    )]
    pub pod_bridge_interface: Option<String>,

    /// With --detect-local-mode=InterfaceNamePrefix: the name prefix of the node's pod
    /// interfaces (e.g. veth, cali).
    #[arg(long, value_name = "PREFIX")]
    #[serde(
        rename = "detectLocal.interfaceNamePrefix",
        deserialize_with = "file::text"
    )]
    pub pod_interface_name_prefix: Option<String>,

    /// SNAT all traffic sent via Service cluster IPs.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    #[serde(rename = "iptables.masqueradeAll")]
    pub masquerade_all: Option<bool>,

    /// Addresses on which NodePort Services are served: comma-separated CIDRs, or `primary`
    /// for the node's primary IPs. Empty means all local addresses.
    #[arg(long, value_name = "CIDR,...|primary", value_delimiter = ',')]
    #[serde(rename = "nodePortAddresses")]
    pub nodeport_addresses: Option<Vec<String>>,

    /// The IPVS scheduler (rr, wrr, lc, wlc, lblc, lblcr, dh, sh, sed, nq, mh, ...).
    #[arg(long, value_name = "NAME")]
    #[serde(rename = "ipvs.scheduler", deserialize_with = "file::text")]
    pub ipvs_scheduler: Option<Scheduler>,

    /// Maximum interval between full resyncs of the IPVS rules (Go duration, e.g. 30s). Must be
    /// > 0 (in the config file, 0 means the default, 30s).
    #[arg(long, value_name = "DURATION", value_parser = parse_go_duration)]
    #[serde(
        rename = "ipvs.syncPeriod",
        deserialize_with = "file::duration_zero_is_default"
    )]
    pub ipvs_sync_period: Option<Duration>,

    /// Minimum interval between rule syncs as Services and EndpointSlices change (Go
    /// duration). 0 syncs on every change.
    #[arg(long, value_name = "DURATION", value_parser = parse_go_duration)]
    #[serde(rename = "ipvs.minSyncPeriod", deserialize_with = "file::duration")]
    pub ipvs_min_sync_period: Option<Duration>,

    /// Comma-separated CIDRs the proxier must never touch when cleaning up IPVS rules.
    #[arg(long, value_name = "CIDR,...", value_delimiter = ',')]
    #[serde(rename = "ipvs.excludeCIDRs", deserialize_with = "file::cidrs")]
    pub ipvs_exclude_cidrs: Option<Vec<IpNet>>,

    /// Set arp_ignore=1 and arp_announce=2 so Service VIPs on the dummy link are not announced.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    #[serde(rename = "ipvs.strictARP")]
    pub ipvs_strict_arp: Option<bool>,

    /// IPVS timeout for idle TCP connections (Go duration), 0 leaves the kernel value.
    #[arg(long, value_name = "DURATION", value_parser = parse_go_duration)]
    #[serde(rename = "ipvs.tcpTimeout", deserialize_with = "file::duration")]
    pub ipvs_tcp_timeout: Option<Duration>,

    /// IPVS timeout for TCP connections after receiving FIN (Go duration), 0 leaves it as is.
    #[arg(long, value_name = "DURATION", value_parser = parse_go_duration)]
    #[serde(rename = "ipvs.tcpFinTimeout", deserialize_with = "file::duration")]
    pub ipvs_tcpfin_timeout: Option<Duration>,

    /// IPVS timeout for UDP packets (Go duration), 0 leaves the kernel value.
    #[arg(long, value_name = "DURATION", value_parser = parse_go_duration)]
    #[serde(rename = "ipvs.udpTimeout", deserialize_with = "file::duration")]
    pub ipvs_udp_timeout: Option<Duration>,

    /// Maximum number of NAT connections to track per CPU core (0 leaves nf_conntrack_max as
    /// it is and ignores --conntrack-min). Default 32768.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    #[serde(rename = "conntrack.maxPerCore")]
    pub conntrack_max_per_core: Option<i32>,

    /// Minimum number of conntrack entries to allocate, regardless of
    /// --conntrack-max-per-core. Default 131072.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    #[serde(rename = "conntrack.min")]
    pub conntrack_min: Option<i32>,

    /// Idle timeout for established TCP connections (Go duration; 0 leaves the kernel's
    /// value). Default 24h0m0s.
    #[arg(long, value_name = "DURATION", value_parser = parse_go_duration)]
    #[serde(
        rename = "conntrack.tcpEstablishedTimeout",
        deserialize_with = "file::duration"
    )]
    pub conntrack_tcp_timeout_established: Option<Duration>,

    /// NAT timeout for TCP connections in the CLOSE_WAIT state (Go duration; 0 leaves the
    /// kernel's value). Default 1h0m0s.
    #[arg(long, value_name = "DURATION", value_parser = parse_go_duration)]
    #[serde(
        rename = "conntrack.tcpCloseWaitTimeout",
        deserialize_with = "file::duration"
    )]
    pub conntrack_tcp_timeout_close_wait: Option<Duration>,

    /// Set nf_conntrack_tcp_be_liberal to 1 (packets outside the TCP window are not marked
    /// INVALID).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    #[serde(rename = "conntrack.tcpBeLiberal")]
    pub conntrack_tcp_be_liberal: Option<bool>,

    /// Idle timeout for UNREPLIED UDP connections (Go duration; 0 leaves the kernel's value).
    #[arg(long, value_name = "DURATION", value_parser = parse_go_duration)]
    #[serde(rename = "conntrack.udpTimeout", deserialize_with = "file::duration")]
    pub conntrack_udp_timeout: Option<Duration>,

    /// Idle timeout for ASSURED UDP connections (Go duration; 0 leaves the kernel's value).
    #[arg(long, value_name = "DURATION", value_parser = parse_go_duration)]
    #[serde(
        rename = "conntrack.udpStreamTimeout",
        deserialize_with = "file::duration"
    )]
    pub conntrack_udp_timeout_stream: Option<Duration>,

    /// The oom_score_adj value for this process, in [-1000, 1000]. Default -999.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    #[serde(rename = "oomScoreAdj")]
    pub oom_score_adj: Option<i32>,

    /// How many syncs may run back to back before --ipvs-min-sync-period applies (>= 1).
    #[arg(long, value_name = "N")]
    #[serde(skip)]
    pub ipvs_sync_burst: Option<u32>,

    /// Per-Service IPVS traffic on the metrics server (off, service or endpoint): the
    /// kernel's counters read at each scrape, labelled with the Service (docs/metrics.md).
    #[arg(long, value_name = "LEVEL", value_parser = parse_traffic_level)]
    #[serde(skip)]
    pub ipvs_traffic_metrics: Option<TrafficLevel>,

    /// Address (ip:port, or ip for the default port 10249) of the metrics server; empty disables it.
    #[arg(long, value_name = "IP:PORT")]
    #[serde(rename = "metricsBindAddress", deserialize_with = "file::text")]
    pub metrics_bind_address: Option<String>,

    /// Address (ip:port, or ip for the default port 10256) of the health server; empty disables it.
    #[arg(long, value_name = "IP:PORT")]
    #[serde(rename = "healthzBindAddress", deserialize_with = "file::text")]
    pub healthz_bind_address: Option<String>,

    /// Which proxy mode to use. Only `ipvs` is supported (accepted for kube-proxy compatibility).
    #[arg(long, value_name = "MODE")]
    #[serde(rename = "mode", deserialize_with = "file::text")]
    pub proxy_mode: Option<String>,

    /// Remove everything this proxier created (IPVS services, VIPs, the dummy link, its
    /// nftables tables) and exit.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    #[serde(skip)]
    pub cleanup: Option<bool>,

    /// Take the node over from kube-proxy's IPVS mode: adopt its virtual servers and VIPs,
    /// then, once this proxier's nftables tables are in place, remove kube-proxy's iptables
    /// chains, their jump rules and its ipsets (nothing else). With --dry-run: list them.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    #[serde(skip)]
    pub take_over_kube_proxy: Option<bool>,

    /// Read Services, EndpointSlices and Nodes from this YAML file (as `kubectl get -o yaml`
    /// writes them) instead of the API server. The file is watched for changes.
    #[arg(long, value_name = "PATH")]
    #[serde(skip)]
    pub source_file: Option<PathBuf>,

    /// Plan but change nothing in the kernel; print what would be programmed.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    #[serde(skip)]
    pub dry_run: Option<bool>,

    /// With --dry-run: keep following the source after the first plan and print only what
    /// each later sync changes (without it, a dry run prints the plan once and exits).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    #[serde(skip)]
    pub watch: Option<bool>,

    /// How --dry-run prints the plan: table, json or yaml.
    #[arg(long, short = 'o', value_enum, value_name = "FORMAT")]
    #[serde(skip)]
    pub output: Option<OutputFormat>,

    /// Run a single sync once the sources have synced, then exit.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    #[serde(skip)]
    pub once: Option<bool>,

    /// Name of the dummy link that holds Service VIPs.
    #[arg(long, value_name = "NAME")]
    #[serde(skip)]
    pub dummy_interface: Option<String>,

    /// Comma-separated Service CIDRs to take whole with one local route each on the dummy
    /// link instead of binding every ClusterIP in them (opt-in; needs --ipvs-strict-arp).
    /// Addresses in them that no Service has are rejected. `auto` follows the cluster's
    /// networking.k8s.io/v1 ServiceCIDR objects at run time (API server source only; may be
    /// listed with CIDRs). A range holding a node address or overlapping --cluster-cidr is
    /// never routed.
    #[arg(long, value_name = "auto|CIDR,...", value_delimiter = ',',
          value_parser = ServiceCidrsEntry::parse)]
    #[serde(skip)]
    pub bind_service_cidrs: Option<Vec<ServiceCidrsEntry>>,

    /// Log line format.
    #[arg(long, value_enum, value_name = "FORMAT")]
    #[serde(skip)]
    pub log_format: Option<LogFormat>,

    /// Log verbosity, as klog's -v (0: info, 2..4: debug, 5+: trace).
    #[arg(short = 'v', long = "v", value_name = "LEVEL")]
    #[serde(skip)]
    pub verbosity: Option<u8>,
}

impl Cli {
    /// Parses arguments (the first one is the program name). Errors carry clap's exit code 2.
    pub fn try_parse_args<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Cli::try_parse_from(args)
    }
}

/// `ipvs-proxier explain NAMESPACE/SERVICE`: why a Service does or does not answer on this
/// node. Takes the daemon's flags (or its --config file) to plan as it does; reads the
/// kernel, writes nothing (needs CAP_NET_ADMIN only).
#[derive(Debug, Clone, Parser)]
#[command(name = "ipvs-proxier explain", version, long_about = None)]
pub struct ExplainCli {
    /// The Service to explain.
    #[arg(value_name = "NAMESPACE/SERVICE")]
    pub service: String,

    /// A client address: say whether the load-balancer source ranges let it in.
    #[arg(long, value_name = "IP")]
    pub client: Option<IpAddr>,

    /// The daemon's flags (--output picks text, json or yaml).
    #[command(flatten)]
    pub daemon: Cli,
}

/// One entry of `--bind-service-cidrs`: a CIDR, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceCidrsEntry {
    /// Follow the cluster's ServiceCIDR objects.
    Auto,
    /// This range.
    Cidr(IpNet),
}

impl ServiceCidrsEntry {
    fn parse(value: &str) -> Result<ServiceCidrsEntry, String> {
        if value == "auto" {
            return Ok(ServiceCidrsEntry::Auto);
        }
        value
            .parse()
            .map(ServiceCidrsEntry::Cidr)
            .map_err(|error| format!("{value:?} is neither `auto` nor a CIDR: {error}"))
    }
}
