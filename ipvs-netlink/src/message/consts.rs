//! Numeric constants of the IPVS generic-netlink protocol (`include/uapi/linux/ip_vs.h`),
//! private to the message layer: the rest of the crate and its users work with the typed
//! commands and attributes. Values carried inside attributes (address families, flags,
//! tunnel types) belong to the domain types that hold them.
#![allow(missing_docs)]

/// Name of the generic-netlink family.
pub const IPVS_GENL_NAME: &str = "IPVS";
/// Version of the generic-netlink family.
pub const IPVS_GENL_VERSION: u8 = 1;

// Commands.
pub const IPVS_CMD_NEW_SERVICE: u8 = 1;
pub const IPVS_CMD_SET_SERVICE: u8 = 2;
pub const IPVS_CMD_DEL_SERVICE: u8 = 3;
pub const IPVS_CMD_GET_SERVICE: u8 = 4;
pub const IPVS_CMD_NEW_DEST: u8 = 5;
pub const IPVS_CMD_SET_DEST: u8 = 6;
pub const IPVS_CMD_DEL_DEST: u8 = 7;
pub const IPVS_CMD_GET_DEST: u8 = 8;
pub const IPVS_CMD_NEW_DAEMON: u8 = 9;
pub const IPVS_CMD_DEL_DAEMON: u8 = 10;
pub const IPVS_CMD_GET_DAEMON: u8 = 11;
pub const IPVS_CMD_SET_CONFIG: u8 = 12;
pub const IPVS_CMD_GET_CONFIG: u8 = 13;
pub const IPVS_CMD_SET_INFO: u8 = 14;
pub const IPVS_CMD_GET_INFO: u8 = 15;
pub const IPVS_CMD_ZERO: u8 = 16;
pub const IPVS_CMD_FLUSH: u8 = 17;

// Top-level attributes of commands.
pub const IPVS_CMD_ATTR_SERVICE: u16 = 1;
pub const IPVS_CMD_ATTR_DEST: u16 = 2;
pub const IPVS_CMD_ATTR_DAEMON: u16 = 3;
pub const IPVS_CMD_ATTR_TIMEOUT_TCP: u16 = 4;
pub const IPVS_CMD_ATTR_TIMEOUT_TCP_FIN: u16 = 5;
pub const IPVS_CMD_ATTR_TIMEOUT_UDP: u16 = 6;

// Service attributes (nested in IPVS_CMD_ATTR_SERVICE).
pub const IPVS_SVC_ATTR_AF: u16 = 1;
pub const IPVS_SVC_ATTR_PROTOCOL: u16 = 2;
pub const IPVS_SVC_ATTR_ADDR: u16 = 3;
pub const IPVS_SVC_ATTR_PORT: u16 = 4;
pub const IPVS_SVC_ATTR_FWMARK: u16 = 5;
pub const IPVS_SVC_ATTR_SCHED_NAME: u16 = 6;
pub const IPVS_SVC_ATTR_FLAGS: u16 = 7;
pub const IPVS_SVC_ATTR_TIMEOUT: u16 = 8;
pub const IPVS_SVC_ATTR_NETMASK: u16 = 9;
pub const IPVS_SVC_ATTR_STATS: u16 = 10;
pub const IPVS_SVC_ATTR_PE_NAME: u16 = 11;
pub const IPVS_SVC_ATTR_STATS64: u16 = 12;

// Destination attributes (nested in IPVS_CMD_ATTR_DEST).
pub const IPVS_DEST_ATTR_ADDR: u16 = 1;
pub const IPVS_DEST_ATTR_PORT: u16 = 2;
pub const IPVS_DEST_ATTR_FWD_METHOD: u16 = 3;
pub const IPVS_DEST_ATTR_WEIGHT: u16 = 4;
pub const IPVS_DEST_ATTR_U_THRESH: u16 = 5;
pub const IPVS_DEST_ATTR_L_THRESH: u16 = 6;
pub const IPVS_DEST_ATTR_ACTIVE_CONNS: u16 = 7;
pub const IPVS_DEST_ATTR_INACT_CONNS: u16 = 8;
pub const IPVS_DEST_ATTR_PERSIST_CONNS: u16 = 9;
pub const IPVS_DEST_ATTR_STATS: u16 = 10;
pub const IPVS_DEST_ATTR_ADDR_FAMILY: u16 = 11;
pub const IPVS_DEST_ATTR_STATS64: u16 = 12;
pub const IPVS_DEST_ATTR_TUN_TYPE: u16 = 13;
pub const IPVS_DEST_ATTR_TUN_PORT: u16 = 14;
pub const IPVS_DEST_ATTR_TUN_FLAGS: u16 = 15;

// Sync daemon attributes (nested in IPVS_CMD_ATTR_DAEMON).
pub const IPVS_DAEMON_ATTR_STATE: u16 = 1;
pub const IPVS_DAEMON_ATTR_MCAST_IFN: u16 = 2;
pub const IPVS_DAEMON_ATTR_SYNC_ID: u16 = 3;
pub const IPVS_DAEMON_ATTR_SYNC_MAXLEN: u16 = 4;
pub const IPVS_DAEMON_ATTR_MCAST_GROUP: u16 = 5;
pub const IPVS_DAEMON_ATTR_MCAST_GROUP6: u16 = 6;
pub const IPVS_DAEMON_ATTR_MCAST_PORT: u16 = 7;
pub const IPVS_DAEMON_ATTR_MCAST_TTL: u16 = 8;

// Statistics attributes (nested in *_ATTR_STATS and *_ATTR_STATS64).
pub const IPVS_STATS_ATTR_CONNS: u16 = 1;
pub const IPVS_STATS_ATTR_INPKTS: u16 = 2;
pub const IPVS_STATS_ATTR_OUTPKTS: u16 = 3;
pub const IPVS_STATS_ATTR_INBYTES: u16 = 4;
pub const IPVS_STATS_ATTR_OUTBYTES: u16 = 5;
pub const IPVS_STATS_ATTR_CPS: u16 = 6;
pub const IPVS_STATS_ATTR_INPPS: u16 = 7;
pub const IPVS_STATS_ATTR_OUTPPS: u16 = 8;
pub const IPVS_STATS_ATTR_INBPS: u16 = 9;
pub const IPVS_STATS_ATTR_OUTBPS: u16 = 10;

// GET_INFO reply attributes (top level).
pub const IPVS_INFO_ATTR_VERSION: u16 = 1;
pub const IPVS_INFO_ATTR_CONN_TAB_SIZE: u16 = 2;

// Sync daemon states.
pub const IP_VS_STATE_MASTER: u32 = 0x0001;
pub const IP_VS_STATE_BACKUP: u32 = 0x0002;

/// Longest persistence-engine name (`IP_VS_PENAME_MAXLEN` minus the NUL).
pub const PE_NAME_MAX: usize = 15;
/// Longest multicast interface name (`IP_VS_IFNAME_MAXLEN` minus the NUL).
pub const IFNAME_MAX: usize = 15;
