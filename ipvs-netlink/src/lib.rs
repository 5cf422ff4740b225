//! Async client for the Linux kernel's IPVS generic-netlink family.
