//! Test support shared by the integration tests of proxier-bin (each test binary uses a
//! part of it).
#![allow(dead_code)]

pub mod process;
