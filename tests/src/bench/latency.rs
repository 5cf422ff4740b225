//! Change-to-kernel latency: waiting in the kernel for a destination to appear, and
//! percentiles of the samples.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::bail;
use futures::TryStreamExt;
use ipvs_netlink::{IpvsHandle, ServiceKey};

/// Polls `key`'s destinations every millisecond until `address` is there with a non-zero
/// weight; returns when it was seen.
pub async fn wait_for_destination(
    handle: &IpvsHandle,
    key: &ServiceKey,
    address: IpAddr,
    timeout: Duration,
) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        let destinations: Vec<_> = handle.destinations(key).try_collect().await?;
        if destinations
            .iter()
            .any(|d| d.destination.addr == address && d.destination.weight > 0)
        {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            bail!("{address} not programmed on {key:?} within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Polls until the virtual server `key` exists (`present`) or is gone.
pub async fn wait_for_service(
    handle: &IpvsHandle,
    key: &ServiceKey,
    present: bool,
    timeout: Duration,
) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        let exists = match handle.service(key).await {
            Ok(_) => true,
            Err(ipvs_netlink::Error::ServiceNotFound { .. }) => false,
            Err(error) => return Err(error.into()),
        };
        if exists == present {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            bail!(
                "{key:?} still {} after {timeout:?}",
                if present { "absent" } else { "present" }
            );
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// p50, p99 and max of samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Percentiles {
    /// Number of samples.
    pub count: usize,
    /// Median.
    pub p50: Duration,
    /// 99th percentile (nearest rank).
    pub p99: Duration,
    /// Largest.
    pub max: Duration,
}

impl Percentiles {
    /// Of `samples` (`None` when empty).
    pub fn of(samples: &[Duration]) -> Option<Percentiles> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort();
        let rank = |q: f64| {
            let r = (q * sorted.len() as f64).ceil() as usize;
            sorted[r.clamp(1, sorted.len()) - 1]
        };
        Some(Percentiles {
            count: sorted.len(),
            p50: rank(0.50),
            p99: rank(0.99),
            max: sorted[sorted.len() - 1],
        })
    }
}

impl std::fmt::Display for Percentiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} samples)",
            self.p50.as_secs_f64() * 1e3,
            self.p99.as_secs_f64() * 1e3,
            self.max.as_secs_f64() * 1e3,
            self.count
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let p = Percentiles::of(&samples).expect("samples");
        assert_eq!(p.p50, Duration::from_millis(50));
        assert_eq!(p.p99, Duration::from_millis(99));
        assert_eq!(p.max, Duration::from_millis(100));
        assert_eq!(Percentiles::of(&[]), None);
        let one = Percentiles::of(&[Duration::from_millis(7)]).expect("one");
        assert_eq!(
            (one.p50, one.p99),
            (Duration::from_millis(7), Duration::from_millis(7))
        );
    }
}
