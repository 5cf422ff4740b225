//! Feeds arbitrary bytes to every IPVS parser and decoder: none may panic.
#![no_main]

use ipvs_netlink::message::{
    DaemonAttr, DestAttr, IpvsMessage, ServiceAttr, StatsAttr, destination_entry, parse_nlas,
    service_entry, stats, sync_daemon,
};
use ipvs_netlink::{AddressFamily, ServiceKey};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(nlas) = parse_nlas::<ServiceAttr>(data) {
        let _ = service_entry(&nlas);
    }
    if let Ok(nlas) = parse_nlas::<DestAttr>(data) {
        let _ = destination_entry(&nlas, AddressFamily::Inet);
        let _ = destination_entry(&nlas, AddressFamily::Inet6);
    }
    if let Ok(nlas) = parse_nlas::<StatsAttr>(data) {
        let _ = stats(&nlas);
    }
    if let Ok(nlas) = parse_nlas::<DaemonAttr>(data) {
        let _ = sync_daemon(&nlas);
    }
    let cmd = data.first().copied().unwrap_or(0);
    if let Ok(msg) = IpvsMessage::parse(cmd, data) {
        let _ = msg.service_entry();
        let key = ServiceKey::fwmark(1, AddressFamily::Inet6);
        let _ = msg.destination_entry(key.family());
        let _ = msg.sync_daemon();
        let _ = msg.info();
        let _ = msg.timeouts();
        let _ = msg.to_bytes();
    }
});
