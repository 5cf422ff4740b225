//! Kernel test kit shared by the suites in `tests/tests/`.
//!
//! Kernel tests are ordinary `#[test]` functions that start with
//! [`require_kernel!`]. On a host without IPVS they print a visible `SKIP`
//! line and pass; inside the VM booted by `cargo xtask vm-test` (which sets
//! `IPVS_PROXIER_KERNEL_TESTS=1`) they run for real, and an unusable kernel
//! fails them instead of skipping.
//!
//! [`Netns`] gives each test its own network namespace, so tests running in
//! parallel do not see each other's IPVS services, links or addresses.
//!
//! [`RealApiServer`] starts a real Kubernetes API server (k8s.io/apiserver on etcd) for a
//! test; [`apiserver`] is the in-repo double, for the faults a real server cannot make.

pub mod apiserver;
mod background;
pub mod bench;
mod capabilities;
pub mod http_client;
mod kernel;
mod netns;
pub mod realapi;

pub use background::{Background, ShellProcess, load_modules, wait_until};
pub use capabilities::set_thread_capabilities;

pub use kernel::{KERNEL_TESTS_ENV, PROXIER_BIN_ENV, kernel_tests_enabled, proxier_bin};
pub use netns::Netns;
pub use realapi::RealApiServer;

/// Skips the current kernel test unless [`kernel_tests_enabled`] says the
/// kernel can run it.
///
/// Put it first in a `#[test]` function. For tests that return a value
/// (e.g. `Result`), pass the value to return when skipping:
/// `require_kernel!(Ok(()))`.
#[macro_export]
macro_rules! require_kernel {
    () => {
        $crate::require_kernel!(())
    };
    ($skip_value:expr) => {{
        fn __require_kernel_marker() {}
        let test = ::std::any::type_name_of_val(&__require_kernel_marker);
        let test = test
            .strip_suffix("::__require_kernel_marker")
            .unwrap_or(::std::module_path!());
        if !$crate::kernel_tests_enabled(test) {
            return $skip_value;
        }
    }};
}
