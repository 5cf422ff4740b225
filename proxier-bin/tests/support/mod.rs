//! Test support shared by the integration tests of proxier-bin.

pub mod apiserver;
