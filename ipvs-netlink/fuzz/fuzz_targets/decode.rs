//! Feeds arbitrary bytes to every IPVS decoder: none may panic.
#![no_main]

use ipvs_netlink::message::{
    IpvsMessage, decode_daemon_message, decode_dest_message, decode_destination, decode_info,
    decode_service, decode_service_message, decode_stats, decode_timeouts,
};
use ipvs_netlink::{AddressFamily, ServiceKey};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode_service(data);
    let _ = decode_destination(data, AddressFamily::Inet);
    let _ = decode_destination(data, AddressFamily::Inet6);
    let _ = decode_stats(data);
    let msg = IpvsMessage {
        cmd: data.first().copied().unwrap_or(0),
        attrs: data.to_vec(),
    };
    let _ = decode_service_message(&msg);
    let key = ServiceKey::fwmark(1, AddressFamily::Inet6);
    let _ = decode_dest_message(&msg, &key);
    let _ = decode_daemon_message(&msg);
    let _ = decode_info(&msg);
    let _ = decode_timeouts(&msg);
});
