//! Prints the IPVS table the way `ipvsadm -Ln` does.
//!
//! Usage: `ipvs-list [--netns PATH]` (e.g. `--netns /run/netns/blue`).

use std::net::IpAddr;

use anyhow::Context;
use ipvs_netlink::{
    AddressFamily, DestinationEntry, IpvsHandle, Netmask, ServiceEntry, ServiceFlags, ServiceKey,
};

/// `ipvsadm -Ln` style address: `10.0.0.1:80` or `[fd00::1]:80`.
fn endpoint(addr: IpAddr, port: u16) -> String {
    match addr {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

fn service_line(entry: &ServiceEntry) -> String {
    let svc = &entry.service;
    let mut line = match svc.key {
        ServiceKey::Tuple {
            addr,
            port,
            protocol,
        } => format!(
            "{:<5}{} {}",
            protocol.to_string(),
            endpoint(addr, port),
            svc.scheduler
        ),
        ServiceKey::Fwmark { mark, family } => {
            let fam = if family == AddressFamily::Inet6 {
                " IPv6"
            } else {
                ""
            };
            format!("FWM  {mark}{fam} {}", svc.scheduler)
        }
    };
    let mut sched_flags = Vec::new();
    if svc.flags.contains(ServiceFlags::SH_FALLBACK) {
        sched_flags.push("flag-1");
    }
    if svc.flags.contains(ServiceFlags::SH_PORT) {
        sched_flags.push("flag-2");
    }
    if svc.flags.contains(ServiceFlags::SCHED3) {
        sched_flags.push("flag-3");
    }
    if !sched_flags.is_empty() {
        line.push_str(&format!(" ({})", sched_flags.join(",")));
    }
    if svc.flags.contains(ServiceFlags::PERSISTENT) {
        line.push_str(&format!(" persistent {}", svc.timeout));
        if svc.netmask != Netmask::host(svc.key.family()) {
            line.push_str(&format!(" mask {}", svc.netmask));
        }
    }
    if let Some(pe) = &svc.pe_name {
        line.push_str(&format!(" pe {pe}"));
    }
    if svc.flags.contains(ServiceFlags::ONE_PACKET) {
        line.push_str(" ops");
    }
    line
}

fn dest_line(d: &DestinationEntry) -> String {
    let dest = &d.destination;
    format!(
        "  -> {:<28} {:<7} {:<6} {:<10} {:<10}",
        endpoint(dest.addr, dest.port),
        dest.forward.to_string(),
        dest.weight,
        d.active_conns,
        d.inactive_conns
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let handle = match (args.next().as_deref(), args.next()) {
        (Some("--netns"), Some(path)) => IpvsHandle::new_in_netns(path.as_str())
            .await
            .with_context(|| format!("connecting to IPVS in {path}"))?,
        (None, _) => IpvsHandle::new().await.context("connecting to IPVS")?,
        _ => anyhow::bail!("usage: ipvs-list [--netns PATH]"),
    };
    let info = handle.info().await?;
    println!("{info}");
    println!("Prot LocalAddress:Port Scheduler Flags");
    println!("  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn");
    let mut table = handle.table().await?;
    table.sort_by_key(|entry| entry.0.service.key);
    for (svc, dests) in &table {
        println!("{}", service_line(svc));
        for d in dests {
            println!("{}", dest_line(d));
        }
    }
    Ok(())
}
