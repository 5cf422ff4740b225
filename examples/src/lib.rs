//! Example programs live in `src/bin/`; this library holds what they share that is not about
//! embedding proxier-core.

pub mod cni_input;
