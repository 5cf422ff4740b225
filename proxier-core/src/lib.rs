//! Turns Kubernetes Service state into IPVS virtual servers and keeps the kernel converged.
