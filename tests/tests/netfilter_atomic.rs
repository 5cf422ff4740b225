//! The table is replaced in one transaction: a reader listing it in a loop while the
//! proxier rewrites it many times never sees a missing or half-built table. Also: cleanup
//! removes every table of ours, in both families, and nothing else.

#![allow(clippy::unwrap_used)]

mod netfilter_support;

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ipvs_proxier_tests::{Netns, require_kernel};
use netfilter_support::*;
use proxier_core::desired::Protocol;
use proxier_core::model::NodeContext;
use proxier_core::netfilter::{self, Netfilter, NftBackend, RenderOptions};

/// Elements of set `name` in an `nft list table` listing; `None` when the set is missing.
fn set_elements(listing: &str, name: &str) -> Option<usize> {
    let start = listing.find(&format!("set {name} {{"))?;
    let body = &listing[start..];
    let end = body.find('}')?;
    let body = &body[..end];
    Some(match body.find("elements = {") {
        None => 0,
        Some(at) => body[at..].matches(',').count() + 1,
    })
}

/// Plan `k` of the writer: `n = 1 + k % 40` Services, each with one ClusterIP port, so every
/// one of `cluster-ips` and `service-ips` holds exactly `n` elements.
fn plan(k: usize) -> netfilter::NetfilterPlan {
    let n = 1 + k % 40;
    let services = (0..n)
        .map(|i| {
            service(
                &format!("s{i}"),
                &format!("10.96.{}.{}", i / 200, i % 200 + 1),
                80,
                Protocol::Tcp,
                None,
            )
        })
        .collect();
    let node = NodeContext::new(NODE_NAME, vec![ip(NODE_IP)], vec![ip(NODE_IP)]);
    netfilter::plan(&state(services, vec![]), &node, &config())
}

#[test]
fn readers_never_see_a_half_replaced_table() {
    require_kernel!();
    load_nft_modules();
    let node = Netns::new();
    const WRITES: usize = 120;

    // First version, so the table exists before the reader starts.
    node.block_on(|| async {
        let mut nf = Netfilter::new(NftBackend::default(), RenderOptions::default()).unwrap();
        nf.sync(&plan(0)).await.unwrap();
    });

    let done = Arc::new(AtomicBool::new(false));
    let reader_done = Arc::clone(&done);
    let reader_ns = node.name().to_owned();
    let reader = std::thread::spawn(move || {
        let mut reads = 0usize;
        let mut sizes = std::collections::BTreeSet::new();
        while !reader_done.load(Ordering::Relaxed) || reads == 0 {
            let out = std::process::Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &reader_ns,
                    "nft",
                    "list",
                    "table",
                    "ip",
                    "ipvs-proxier",
                ])
                .output()
                .unwrap();
            let listing = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "table missing during replacement (read {reads}): {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let counts: Vec<Option<usize>> = ["cluster-ips", "service-ips"]
                .iter()
                .map(|s| set_elements(&listing, s))
                .collect();
            let n = counts[0].unwrap_or_else(|| panic!("no cluster-ips set:\n{listing}"));
            assert!(
                counts.iter().all(|c| *c == Some(n)),
                "half a table (read {reads}): {counts:?}\n{listing}"
            );
            for chain in [
                "nat-prerouting",
                "nat-postrouting",
                "filter-input",
                "service-address-ports",
                "filter-output",
            ] {
                assert!(
                    listing.contains(&format!("chain {chain} {{")),
                    "no {chain}:\n{listing}"
                );
            }
            sizes.insert(n);
            reads += 1;
        }
        (reads, sizes)
    });

    node.block_on(|| async {
        let mut nf = Netfilter::new(NftBackend::default(), RenderOptions::default()).unwrap();
        for k in 1..=WRITES {
            assert!(nf.sync(&plan(k)).await.unwrap(), "plan {k} was not applied");
        }
    });
    done.store(true, Ordering::Relaxed);
    let (reads, sizes) = reader.join().unwrap();
    // The reader really overlapped the writes: it saw several versions.
    assert!(reads >= 5, "only {reads} reads");
    assert!(sizes.len() >= 3, "reader saw too few versions: {sizes:?}");

    // The final table is the last plan.
    let listing = node.sh_ok("nft list table ip ipvs-proxier");
    assert_eq!(set_elements(&listing, "cluster-ips"), Some(1 + WRITES % 40));
}

#[test]
fn cleanup_removes_our_tables_in_both_families_and_nothing_else() {
    require_kernel!();
    load_nft_modules();
    let node = Netns::new();
    node.sh_ok("nft add table inet someone-else && nft add chain inet someone-else c");
    node.block_on(|| async {
        let mut nf = Netfilter::new(NftBackend::default(), RenderOptions::default()).unwrap();
        let mut dual = plan(3);
        dual.v6 = Some(netfilter::FamilyPlan::new(
            proxier_core::model::AddressFamily::V6,
            netfilter::ClusterIpMasquerade::All,
        ));
        nf.sync(&dual).await.unwrap();
    });
    let tables = node.sh_ok("nft list tables");
    assert!(tables.contains("table ip ipvs-proxier"), "{tables}");
    assert!(tables.contains("table ip6 ipvs-proxier"), "{tables}");

    node.block_on(|| async {
        let mut nf = Netfilter::new(NftBackend::default(), RenderOptions::default()).unwrap();
        nf.cleanup().await.unwrap();
        // Cleanup of nothing is not an error.
        nf.cleanup().await.unwrap();
    });
    let tables = node.sh_ok("nft list tables");
    assert!(!tables.contains("ipvs-proxier"), "left behind: {tables}");
    assert!(
        tables.contains("table inet someone-else"),
        "removed another table: {tables}"
    );
}

#[test]
fn a_refused_script_leaves_the_previous_table_intact() {
    require_kernel!();
    load_nft_modules();
    let node = Netns::new();
    node.block_on(|| async {
        let mut nf = Netfilter::new(NftBackend::default(), RenderOptions::default()).unwrap();
        nf.sync(&plan(4)).await.unwrap();
    });
    // A script that deletes our table and then fails: the whole transaction is refused.
    let err = node.block_on(|| async {
        use proxier_core::netfilter::NetfilterBackend;
        let mut nft = NftBackend::default();
        nft.apply(
            "add table ip ipvs-proxier\ndelete table ip ipvs-proxier\nadd rule ip nowhere c drop\n",
        )
        .await
        .unwrap_err()
    });
    assert!(err.to_string().contains("refused"), "{err}");
    let listing = node.sh_ok("nft list table ip ipvs-proxier");
    assert_eq!(set_elements(&listing, "cluster-ips"), Some(5));
}

/// The elements of `plan`'s IPv4 `cluster-ips` set, as a plan of their own (what a
/// tracker hands [`Netfilter::sync_changes`] as added or removed).
fn cluster_ips_only(plan: &netfilter::NetfilterPlan) -> netfilter::NetfilterPlan {
    let v4 = plan.v4.as_ref().unwrap();
    let mut only = netfilter::FamilyPlan::new(v4.family, v4.cluster_ip_masquerade.clone());
    only.cluster_ips = v4.cluster_ips.clone();
    netfilter::NetfilterPlan {
        v4: Some(only),
        v6: None,
    }
}

/// The digest `nft list set` shows in our IPv4 table.
fn kernel_digest(node: &Netns) -> Option<u64> {
    family_digest(node, "ip")
}

#[test]
fn a_restart_adopts_the_tables_its_plan_left_and_rewrites_any_other() {
    require_kernel!();
    load_nft_modules();
    let node = Netns::new();
    let options = RenderOptions::default();
    let empty = || netfilter::empty_plan(&config());
    let first = plan(4);
    // An update on top of the first replace: one more ClusterIP port, the tables' digest
    // follows by the change alone.
    let mut grown = first.clone();
    let extra = netfilter::AddrPort {
        address: ip("10.96.7.7"),
        protocol: Protocol::Tcp,
        port: 8080,
    };
    grown.v4.as_mut().unwrap().cluster_ips.insert(extra);
    let mut added = empty();
    added.v4.as_mut().unwrap().cluster_ips.insert(extra);
    node.block_on(|| async {
        let mut nf = Netfilter::new(NftBackend::default(), options.clone()).unwrap();
        let everything = netfilter::PlanChanges {
            added: cluster_ips_only(&first),
            removed: empty(),
        };
        assert!(nf.sync_changes(&first, &everything).await.unwrap());
        let change = netfilter::PlanChanges {
            added,
            removed: empty(),
        };
        assert!(nf.sync_changes(&grown, &change).await.unwrap());
    });
    let digest = netfilter::plan_digest(&grown, &options).unwrap();
    assert_eq!(
        kernel_digest(&node),
        Some(digest),
        "the kernel holds the whole plan's digest"
    );

    // A witness: an element only a rewrite would remove.
    node.sh_ok("nft add element ip ipvs-proxier health-check-node-ports { 31999 }");
    let witness = || {
        node.sh_ok("nft list set ip ipvs-proxier health-check-node-ports")
            .contains("31999")
    };
    // The next process with the same plan adopts the tables: nothing written.
    let written = node.block_on(|| async {
        let mut nf = Netfilter::new(NftBackend::default(), options.clone()).unwrap();
        let changes = netfilter::PlanChanges {
            added: cluster_ips_only(&grown),
            removed: empty(),
        };
        nf.sync_changes(&grown, &changes).await.unwrap()
    });
    assert!(
        !written,
        "the tables were rewritten although they hold the plan"
    );
    assert!(
        witness(),
        "the tables were rewritten although they hold the plan"
    );

    // With another plan it rewrites them whole, digest included.
    let written = node.block_on(|| async {
        let mut nf = Netfilter::new(NftBackend::default(), options.clone()).unwrap();
        let changes = netfilter::PlanChanges {
            added: cluster_ips_only(&first),
            removed: empty(),
        };
        nf.sync_changes(&first, &changes).await.unwrap()
    });
    assert!(written);
    assert!(!witness(), "a table holding another plan was kept");
    assert_eq!(
        kernel_digest(&node),
        Some(netfilter::plan_digest(&first, &options).unwrap())
    );
    let listing = node.sh_ok("nft list table ip ipvs-proxier");
    assert_eq!(set_elements(&listing, "cluster-ips"), Some(5));
}

/// The digest `NftBackend::read_digest` reads (over nfnetlink) from `table` in `netns`.
fn read_digest(netns: &Netns, table: &str) -> Result<Option<u64>, String> {
    use proxier_core::netfilter::NetfilterBackend;
    netns.block_on(|| async {
        let read = NftBackend::default().read_digest(table).unwrap();
        read.await.map_err(|error| error.to_string())
    })
}

#[test]
fn the_digest_read_over_netlink_is_the_one_nft_lists() {
    require_kernel!();
    load_nft_modules();
    let node = Netns::new();
    let options = RenderOptions::default();
    let empty = || netfilter::empty_plan(&config());
    let first = plan(4);
    node.block_on(|| async {
        let mut nf = Netfilter::new(NftBackend::default(), options.clone()).unwrap();
        let everything = netfilter::PlanChanges {
            added: cluster_ips_only(&first),
            removed: empty(),
        };
        assert!(nf.sync_changes(&first, &everything).await.unwrap());
    });
    let digest = netfilter::plan_digest(&first, &options).unwrap();
    for family in ["ip", "ip6"] {
        if first.family(family_of(family)).is_none() {
            continue;
        }
        assert_eq!(family_digest(&node, family), Some(digest), "nft, {family}");
        let table = format!("{family} ipvs-proxier");
        assert_eq!(read_digest(&node, &table), Ok(Some(digest)), "{table}");
    }
    // A table or a family that is not there: the kernel's error, as `nft list set` fails.
    assert!(read_digest(&node, "ip someone-else").is_err());
    assert!(read_digest(&node, "inet ipvs-proxier").is_err());
    // A second element: no digest, for nft's listing as for the read.
    node.sh_ok(&format!(
        "nft add element ip ipvs-proxier {} {{ 0x1 . 0x2 }}",
        netfilter::DIGEST_SET
    ));
    assert_eq!(family_digest(&node, "ip"), None);
    assert_eq!(read_digest(&node, "ip ipvs-proxier"), Ok(None));
    // Flushed: none either.
    node.sh_ok(&format!(
        "nft flush set ip ipvs-proxier {}",
        netfilter::DIGEST_SET
    ));
    assert_eq!(read_digest(&node, "ip ipvs-proxier"), Ok(None));
}

/// The address family nft's family word `ip` or `ip6` names.
fn family_of(family: &str) -> proxier_core::model::AddressFamily {
    match family {
        "ip" => proxier_core::model::AddressFamily::V4,
        _ => proxier_core::model::AddressFamily::V6,
    }
}

/// The tables `NftBackend::list_tables` lists (over nfnetlink) in `netns`.
fn listed_tables(netns: &Netns) -> std::collections::BTreeSet<String> {
    use proxier_core::netfilter::NetfilterBackend;
    netns.block_on(|| async {
        let listing = NftBackend::default().list_tables().unwrap();
        listing.await.unwrap()
    })
}

#[test]
fn the_table_listing_names_what_nft_list_tables_names_in_its_own_namespace() {
    require_kernel!();
    load_nft_modules();
    let node = Netns::new();
    let other = Netns::new();
    assert!(listed_tables(&node).is_empty());
    node.sh_ok(
        "nft add table ip ipvs-proxier && nft add table ip6 ipvs-proxier && \
         nft add table inet someone-else && nft add table bridge b && nft add table arp a && \
         nft add table netdev n",
    );
    let oracle = |netns: &Netns| netfilter::parse_table_list(&netns.sh_ok("nft list tables"));
    let want = oracle(&node);
    assert_eq!(want.len(), 6, "nft list tables: {want:?}");
    assert_eq!(listed_tables(&node), want);
    // Another namespace's tables are not this one's.
    assert!(listed_tables(&other).is_empty());

    node.sh_ok("nft delete table ip6 ipvs-proxier");
    let listed = listed_tables(&node);
    assert_eq!(listed, oracle(&node));
    assert!(!listed.contains("ip6 ipvs-proxier"), "{listed:?}");
    assert!(listed.contains("ip ipvs-proxier"), "{listed:?}");
}

/// A Service's share of the tables: one element in every single-value set of both
/// families, each made from `k`.
fn fragment(k: u8) -> netfilter::NetfilterPlan {
    let family = |family, address: IpAddr| {
        let mut plan = netfilter::FamilyPlan::new(family, netfilter::ClusterIpMasquerade::All);
        let at = |port: u16| netfilter::AddrPort {
            address,
            protocol: if k.is_multiple_of(2) {
                Protocol::Tcp
            } else {
                Protocol::Udp
            },
            port,
        };
        let port = 1000 + u16::from(k);
        let proto_port = netfilter::ProtoPort {
            protocol: Protocol::Sctp,
            port: 30_000 + u16::from(k),
        };
        plan.cluster_ips.insert(at(port));
        plan.external_ips.insert(at(port + 100));
        plan.external_ips_local.insert(at(port + 200));
        plan.load_balancer_ips.insert(at(port + 300));
        plan.load_balancer_ips_local.insert(at(port + 400));
        plan.node_ports.insert(proto_port);
        plan.node_ports_local.insert(netfilter::ProtoPort {
            port: proto_port.port + 100,
            ..proto_port
        });
        plan.firewalled.insert(at(port + 500));
        plan.node_allowed.insert(at(port + 600));
        plan.hairpin.insert(at(port + 700));
        plan.health_check_node_ports.insert(31_000 + u16::from(k));
        plan.bound_ips.insert(address);
        plan
    };
    netfilter::NetfilterPlan {
        v4: Some(family(
            proxier_core::model::AddressFamily::V4,
            ip(&format!("10.96.3.{}", k + 1)),
        )),
        v6: Some(family(
            proxier_core::model::AddressFamily::V6,
            ip(&format!("fd00:96::{:x}", 0xa0 + u16::from(k))),
        )),
    }
}

/// Every element of every single-value set of our tables (the sets `plan` has elements
/// in), as `nft list set` shows them, in the form `netfilter::render::set_elements` gives.
fn kernel_elements(
    node: &Netns,
    plan: &netfilter::NetfilterPlan,
) -> std::collections::BTreeSet<String> {
    let sets: std::collections::BTreeSet<(&str, &str)> = netfilter::render::set_elements(plan)
        .into_iter()
        .map(|(family, set, _)| (netfilter::render::nft_family(family), set))
        .collect();
    let mut elements = std::collections::BTreeSet::new();
    for (family, set) in sets {
        let listing = node.sh_ok(&format!("nft list set {family} ipvs-proxier {set}"));
        for element in netfilter::render::parse_set_elements(&listing) {
            elements.insert(format!("{family} {set} {element}"));
        }
    }
    elements
}

/// What `plan` puts in those sets, in the form of [`kernel_elements`].
fn planned_elements(plan: &netfilter::NetfilterPlan) -> std::collections::BTreeSet<String> {
    netfilter::render::set_elements(plan)
        .into_iter()
        .map(|(family, set, element)| {
            format!("{} {set} {element}", netfilter::render::nft_family(family))
        })
        .collect()
}

/// The digest `nft list set` shows in our table of `family` (`ip` or `ip6`).
fn family_digest(node: &Netns, family: &str) -> Option<u64> {
    let listing = node.sh_ok(&format!(
        "nft list set {family} ipvs-proxier {}",
        netfilter::DIGEST_SET
    ));
    netfilter::parse_digest(&listing)
}

#[test]
fn an_element_update_goes_without_nft_and_leaves_the_sets_as_the_script_would() {
    require_kernel!();
    load_nft_modules();
    let node = Netns::new();
    let options = RenderOptions::default();
    // `nft` behind a wrapper that logs each start, to tell a batch from a script.
    let dir = std::env::temp_dir().join(format!("nft-calls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let calls = dir.join("calls");
    let wrapper = dir.join("nft");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho \"$*\" >> {}\nexec nft \"$@\"\n",
            calls.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let starts = || {
        std::fs::read_to_string(&calls)
            .unwrap_or_default()
            .lines()
            .count()
    };
    let name = |n: &str| proxier_core::model::ServiceName::new("default", n);
    let empty = netfilter::NetfilterPlan {
        v4: Some(netfilter::FamilyPlan::new(
            proxier_core::model::AddressFamily::V4,
            netfilter::ClusterIpMasquerade::All,
        )),
        v6: Some(netfilter::FamilyPlan::new(
            proxier_core::model::AddressFamily::V6,
            netfilter::ClusterIpMasquerade::All,
        )),
    };
    let mut tracker = netfilter::NetfilterTracker::new(empty);
    tracker.set_service(&name("a"), Some(fragment(0)));
    tracker.set_service(&name("keep"), Some(fragment(2)));
    let first = tracker.take_changes();
    let before = tracker.plan().clone();
    // Service a goes, b comes: every single-value set of both families loses one element and
    // gains another.
    tracker.set_service(&name("a"), None);
    tracker.set_service(&name("b"), Some(fragment(1)));
    let change = tracker.take_changes();
    let after = tracker.plan().clone();

    node.block_on(|| async {
        let mut nf = Netfilter::new(NftBackend::new(&wrapper), options.clone()).unwrap();
        assert!(nf.sync_changes(&before, &first).await.unwrap());
        assert_eq!(kernel_elements(&node, &before), planned_elements(&before));
        let started = starts();
        assert!(started >= 1, "the first sync writes the tables with nft");

        // The update goes as one batch, detached as within a sync, and nft is not started.
        assert!(nf.start_changes(&after, &change).await.unwrap());
        let settled = nf.settle().await.unwrap();
        assert!(settled.is_ok(), "{settled:?}");
        assert_eq!(starts(), started, "an element update started nft");
        assert_eq!(kernel_elements(&node, &after), planned_elements(&after));
        // The digest (marks in host order) is the whole plan's, in both families' tables.
        let digest = netfilter::plan_digest(&after, &options).unwrap();
        assert_eq!(nf.digest(), Some(digest));
        assert_eq!(family_digest(&node, "ip"), Some(digest));
        assert_eq!(family_digest(&node, "ip6"), Some(digest));

        // Someone deletes one of b's elements behind our back; b's removal then deletes an
        // element the kernel does not hold: the kernel refuses the whole batch and keeps
        // every other element of b.
        node.sh_ok("nft delete element ip ipvs-proxier service-ips { 10.96.3.2 }");
        let mut tampered = planned_elements(&after);
        assert!(tampered.remove("ip service-ips 10.96.3.2"));
        tracker.set_service(&name("b"), None);
        let removal = tracker.take_changes();
        let last = tracker.plan().clone();
        assert!(nf.start_changes(&last, &removal).await.unwrap());
        let settled = nf.settle().await.unwrap();
        assert!(
            matches!(settled, Err(netfilter::NetfilterError::ElementBatch(_))),
            "{settled:?}"
        );
        assert_eq!(kernel_elements(&node, &after), tampered);
        assert_eq!(starts(), started, "a refused batch started nft");

        // The next sync replaces the tables with the plan, by script.
        let nothing = tracker.take_changes();
        assert!(nf.sync_changes(&last, &nothing).await.unwrap());
        assert!(starts() > started);
        assert_eq!(kernel_elements(&node, &after), planned_elements(&last));
        let digest = netfilter::plan_digest(&last, &options).unwrap();
        assert_eq!(family_digest(&node, "ip6"), Some(digest));
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Element batches go on one socket, kept between them (opening one cost about as much as a
/// small sync); the socket belongs to the namespace it was opened in, so a clone of the
/// backend made afterwards and used in another namespace writes there, not through the
/// kept socket into the first.
#[test]
fn element_batches_keep_their_socket_and_a_clone_writes_in_its_own_namespace() {
    require_kernel!();
    load_nft_modules();
    let (a, b) = (Netns::new(), Netns::new());
    let options = RenderOptions::default();
    let name = |n: &str| proxier_core::model::ServiceName::new("default", n);
    let empty = netfilter::NetfilterPlan {
        v4: Some(netfilter::FamilyPlan::new(
            proxier_core::model::AddressFamily::V4,
            netfilter::ClusterIpMasquerade::All,
        )),
        v6: None,
    };
    // Plans 0..=3: Service s0 alone, then s1, s2, s3 added one at a time.
    let mut tracker = netfilter::NetfilterTracker::new(empty);
    let mut steps = Vec::new();
    for k in 0..4u8 {
        let mut one = fragment(k);
        one.v6 = None;
        tracker.set_service(&name(&format!("s{k}")), Some(one));
        steps.push((tracker.plan().clone(), tracker.take_changes()));
    }
    let clone = a.block_on(|| async {
        let mut nf = Netfilter::new(NftBackend::new("nft"), options.clone()).unwrap();
        assert!(nf.sync_changes(&steps[0].0, &steps[0].1).await.unwrap());
        // Three batches in a row on the one backend: each lands whole.
        for (plan, changes) in &steps[1..] {
            assert!(nf.start_changes(plan, changes).await.unwrap());
            let settled = nf.settle().await.unwrap();
            assert!(settled.is_ok(), "{settled:?}");
            assert_eq!(kernel_elements(&a, plan), planned_elements(plan));
        }
        nf.backend().clone()
    });
    let in_a = kernel_elements(&a, &steps[3].0);
    b.block_on(|| async {
        let mut nf = Netfilter::new(clone, options.clone()).unwrap();
        assert!(nf.sync_changes(&steps[0].0, &steps[0].1).await.unwrap());
        assert!(nf.start_changes(&steps[1].0, &steps[1].1).await.unwrap());
        let settled = nf.settle().await.unwrap();
        assert!(settled.is_ok(), "{settled:?}");
    });
    assert_eq!(
        kernel_elements(&b, &steps[1].0),
        planned_elements(&steps[1].0)
    );
    assert_eq!(
        kernel_elements(&a, &steps[3].0),
        in_a,
        "the clone wrote into namespace a"
    );
}
