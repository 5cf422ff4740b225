//! The deployment kit parses as Kubernetes objects, and what it tells the daemon is something
//! the daemon accepts: the container's flags, and the KubeProxyConfiguration in the ConfigMap.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde::Deserialize;

const KIT: &str = include_str!("../../deploy/kubernetes/ipvs-proxier.yaml");
const ALERTS: &str = include_str!("../../deploy/kubernetes/alerts.yaml");
const METRICS_DOC: &str = include_str!("../../docs/metrics.md");
const LEAST_PRIVILEGE_DOC: &str = include_str!("../../docs/least-privilege.md");
/// The VM test that proves which capabilities the daemon needs.
const LEAST_PRIVILEGE_TEST: &str = include_str!("least_privilege.rs");

struct Kit {
    service_account: ServiceAccount,
    role: ClusterRole,
    binding: ClusterRoleBinding,
    config: ConfigMap,
    daemon_set: DaemonSet,
}

fn documents(text: &str) -> Vec<serde_yaml::Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| serde_yaml::Value::deserialize(doc).expect("every document is YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

fn typed<T: serde::de::DeserializeOwned>(doc: &serde_yaml::Value) -> T {
    serde_yaml::from_value(doc.clone()).expect("document parses as its Kubernetes type")
}

fn kit() -> Kit {
    let mut sa = None;
    let mut role = None;
    let mut binding = None;
    let mut config = None;
    let mut ds = None;
    for doc in documents(KIT) {
        let kind = doc["kind"]
            .as_str()
            .expect("every document has a kind")
            .to_owned();
        match kind.as_str() {
            "ServiceAccount" => sa = Some(typed(&doc)),
            "ClusterRole" => role = Some(typed(&doc)),
            "ClusterRoleBinding" => binding = Some(typed(&doc)),
            "ConfigMap" => config = Some(typed(&doc)),
            "DaemonSet" => ds = Some(typed(&doc)),
            other => panic!("unexpected kind {other} in the kit"),
        }
    }
    Kit {
        service_account: sa.expect("a ServiceAccount"),
        role: role.expect("a ClusterRole"),
        binding: binding.expect("a ClusterRoleBinding"),
        config: config.expect("a ConfigMap"),
        daemon_set: ds.expect("a DaemonSet"),
    }
}

fn grants(role: &ClusterRole, group: &str, resource: &str, verb: &str) -> bool {
    role.rules.iter().flatten().any(|rule| {
        rule.api_groups.iter().flatten().any(|g| g == group)
            && rule.resources.iter().flatten().any(|r| r == resource)
            && rule.verbs.iter().any(|v| v == verb)
    })
}

#[test]
fn rbac_lets_the_service_account_watch_what_the_daemon_watches() {
    let kit = kit();
    for (group, resource) in [
        ("", "services"),
        ("", "nodes"),
        ("discovery.k8s.io", "endpointslices"),
        // --bind-service-cidrs=auto
        ("networking.k8s.io", "servicecidrs"),
    ] {
        for verb in ["list", "watch"] {
            assert!(
                grants(&kit.role, group, resource, verb),
                "ClusterRole must grant {verb} on {group}/{resource}"
            );
        }
    }
    assert!(
        !grants(&kit.role, "", "services", "delete"),
        "read-only on services"
    );
    assert_eq!(
        kit.binding.role_ref.name,
        kit.role.metadata.name.clone().expect("role name")
    );
    let subject = &kit.binding.subjects.as_ref().expect("subjects")[0];
    assert_eq!(subject.kind, "ServiceAccount");
    assert_eq!(
        Some(&subject.name),
        kit.service_account.metadata.name.as_ref()
    );
    assert_eq!(subject.namespace, kit.service_account.metadata.namespace);
}

#[test]
fn daemon_set_runs_on_the_host_network_with_the_service_account() {
    let kit = kit();
    let pod = kit.daemon_set.spec.template.spec.expect("pod spec");
    assert_eq!(
        pod.host_network,
        Some(true),
        "a Service proxy programs the host's network"
    );
    assert_eq!(pod.service_account_name, kit.service_account.metadata.name);
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let container = &pod.containers[0];
    let probe = container.liveness_probe.as_ref().expect("liveness probe");
    let http = probe.http_get.as_ref().expect("HTTP liveness probe");
    assert_eq!(http.path.as_deref(), Some("/livez"));
    // The mounted ConfigMap is the one in the kit.
    let volumes = pod.volumes.expect("volumes");
    let config_volume = volumes
        .iter()
        .find(|v| v.config_map.is_some())
        .expect("a ConfigMap volume");
    assert_eq!(
        config_volume.config_map.as_ref().map(|c| c.name.as_str()),
        kit.config.metadata.name.as_deref()
    );
}

#[test]
fn container_flags_and_config_file_are_accepted_by_the_daemon() {
    let kit = kit();
    let pod = kit.daemon_set.spec.template.spec.expect("pod spec");
    let container = &pod.containers[0];
    let mut argv = vec!["ipvs-proxier".to_owned()];
    argv.extend(container.args.clone().unwrap_or_default());
    let cli = proxier_bin::cli::Cli::try_parse_args(&argv)
        .unwrap_or_else(|e| panic!("the DaemonSet's flags {argv:?} are rejected: {e}"));

    let text = kit
        .config
        .data
        .as_ref()
        .and_then(|d| d.get("config.conf"))
        .expect("config.conf in the ConfigMap");
    let file = proxier_bin::config::parse_config(text, std::path::Path::new("config.conf"))
        .expect("the ConfigMap holds a valid KubeProxyConfiguration");
    assert!(
        file.ignored_fields.is_empty(),
        "every field the kit sets is one the daemon uses, ignored: {:?}",
        file.ignored_fields
    );
    let settings = proxier_bin::settings::resolve(&cli, Some(&file), "node-a")
        .expect("flags and file resolve to settings");
    let port = |a: Option<std::net::SocketAddr>| a.map(|a| a.port());
    assert_eq!(port(settings.healthz_bind_address), Some(10256));
    assert_eq!(port(settings.metrics_bind_address), Some(10249));
}

#[test]
fn alerts_and_dashboard_use_metrics_the_daemon_exports() {
    // Every metric name the alerts and the dashboard list must be one the daemon registers.
    // The catalogue, and the per-Service traffic read at scrape time.
    let traffic = proxier_runtime::traffic::metric_names();
    let exported: Vec<&str> = proxier_runtime::metrics::METRICS
        .iter()
        .map(|m| m.name)
        .chain(traffic.iter().map(String::as_str))
        .collect();
    let mut checked = 0;
    for text in [ALERTS, METRICS_DOC] {
        for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            let base = word
                .strip_suffix("_bucket")
                .or_else(|| word.strip_suffix("_count"))
                .or_else(|| word.strip_suffix("_sum"))
                .unwrap_or(word);
            // A name ending in `_` is a prefix the text talks about (`kubeproxy_iptables_*`).
            if (base.starts_with("kubeproxy_") || base.starts_with("ipvs_proxier_"))
                && !base.ends_with('_')
            {
                assert!(
                    exported.contains(&base),
                    "{base} is not exported by the daemon"
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 10,
        "expected the docs to name the metrics, found {checked}"
    );
    let alerts = documents(ALERTS);
    assert_eq!(alerts.len(), 1);
    assert_eq!(alerts[0]["kind"].as_str(), Some("PrometheusRule"));
}

/// A container's capabilities: (added, dropped), as written.
fn capabilities(container: &Container) -> (Vec<String>, Vec<String>) {
    let caps = container
        .security_context
        .as_ref()
        .and_then(|s| s.capabilities.as_ref());
    (
        caps.and_then(|c| c.add.clone()).unwrap_or_default(),
        caps.and_then(|c| c.drop.clone()).unwrap_or_default(),
    )
}

fn assert_unprivileged(container: &Container) {
    let sc = container
        .security_context
        .as_ref()
        .unwrap_or_else(|| panic!("{}: a securityContext", container.name));
    assert_ne!(
        sc.privileged,
        Some(true),
        "{}: not privileged",
        container.name
    );
    assert_eq!(
        sc.allow_privilege_escalation,
        Some(false),
        "{}: no privilege escalation (no_new_privs)",
        container.name
    );
    let (_, drop) = capabilities(container);
    assert_eq!(drop, ["ALL"], "{}: drops every capability", container.name);
}

#[test]
fn daemon_runs_with_net_admin_alone() {
    let kit = kit();
    let pod = kit.daemon_set.spec.template.spec.expect("pod spec");
    let daemon = &pod.containers[0];
    assert_eq!(pod.containers.len(), 1, "one container");
    assert_unprivileged(daemon);
    let (add, _) = capabilities(daemon);
    assert_eq!(
        add,
        ["NET_ADMIN"],
        "the daemon's container adds exactly the capabilities the VM test proves sufficient"
    );
    // The VM test confines the daemon to that same set.
    assert!(
        LEAST_PRIVILEGE_TEST.contains("const NEEDED: u64 = 1 << CAP_NET_ADMIN;"),
        "tests/tests/least_privilege.rs confines the daemon to CAP_NET_ADMIN"
    );
    // No host directories it could only use with more capabilities: modules are loaded
    // before it starts, not by it.
    let mounts: Vec<&str> = daemon
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert!(
        !mounts.contains(&"/lib/modules"),
        "the daemon loads no modules: {mounts:?}"
    );
    for container in pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
    {
        let sc = container.security_context.as_ref();
        assert_ne!(
            sc.and_then(|s| s.privileged),
            Some(true),
            "{} must not be privileged",
            container.name
        );
    }
    assert_ne!(pod.host_pid, Some(true), "no host PID namespace");
    assert_ne!(pod.host_ipc, Some(true), "no host IPC namespace");
}

#[test]
fn module_loading_init_container_has_sys_module_alone() {
    let kit = kit();
    let pod = kit.daemon_set.spec.template.spec.expect("pod spec");
    let inits = pod.init_containers.unwrap_or_default();
    let loader = inits
        .iter()
        .find(|c| c.name == "load-modules")
        .expect("a load-modules init container (or the doc's node preloading instead)");
    assert_eq!(inits.len(), 1, "one init container");
    assert_unprivileged(loader);
    let (add, _) = capabilities(loader);
    assert_eq!(add, ["SYS_MODULE"]);
    let script = loader
        .command
        .iter()
        .flatten()
        .chain(loader.args.iter().flatten())
        .cloned()
        .collect::<Vec<_>>()
        .join(" ");
    for module in [
        "ip_vs",
        "ip_vs_rr",
        "dummy",
        "nf_tables",
        "nf_conntrack_netlink",
    ] {
        assert!(
            script.split_whitespace().any(|w| w == module),
            "{module} is loaded: {script}"
        );
    }
    let mounts = loader.volume_mounts.clone().unwrap_or_default();
    let modules = mounts
        .iter()
        .find(|m| m.mount_path == "/lib/modules")
        .expect("/lib/modules mounted");
    assert_eq!(modules.read_only, Some(true));
}

#[test]
fn least_privilege_doc_covers_capabilities_modules_and_sysctls() {
    for needle in [
        "CAP_NET_ADMIN",
        "CAP_SYS_MODULE",
        "/etc/modules-load.d",
        "/etc/sysctl.d",
        "net.ipv4.vs.conntrack",
        "net.ipv4.ip_forward",
        "least_privilege",
        "10256",
    ] {
        assert!(
            LEAST_PRIVILEGE_DOC.contains(needle),
            "docs/least-privilege.md must mention {needle}"
        );
    }
}
