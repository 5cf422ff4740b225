//! Kernel test kit shared by the suites in `tests/tests/`.
