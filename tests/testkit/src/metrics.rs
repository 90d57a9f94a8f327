//! Pod memory as the real metrics-server reports it (`metrics.k8s.io/v1beta1`, served through the
//! API server's aggregation layer), and the memory model the test cluster's KWOK nodes follow
//! (`tests/cluster/kwok.yaml`), so tests can predict what metrics-server will report.

use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject};
use kube::{Api, Client, ResourceExt};

use crate::{MEMORY_BASE, MEMORY_CONTAINER, MEMORY_LEAK_PER_MINUTE, is_not_found};

const DEFAULT_BASE: u64 = 16 << 20;
/// What containers other than the modelled one report, small enough never to trigger anything.
pub const OTHER_CONTAINER: u64 = 4 << 20;

/// metrics-server's PodMetrics resource.
pub fn pod_metrics_resource() -> ApiResource {
    ApiResource {
        group: "metrics.k8s.io".into(),
        version: "v1beta1".into(),
        api_version: "metrics.k8s.io/v1beta1".into(),
        kind: "PodMetrics".into(),
        plural: "pods".into(),
    }
}

/// Parses a Kubernetes quantity (`128Mi`, `1.5Gi`, `500M`, `100m`, `1e3`) to a whole number,
/// rounding down: memory is counted in bytes.
pub fn parse_quantity(q: &str) -> Result<u64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let (mul, div): (u128, u128) = match suffix {
        "" => (1, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        "n" => (1, 1_000_000_000),
        "u" => (1, 1_000_000),
        "m" => (1, 1_000),
        "k" => (1_000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        s if s.starts_with(['e', 'E']) => {
            let exp: u32 = s[1..]
                .parse()
                .map_err(|_| anyhow!("bad exponent in quantity {q:?}"))?;
            (
                10u128
                    .checked_pow(exp)
                    .ok_or_else(|| anyhow!("quantity {q:?} too large"))?,
                1,
            )
        }
        _ => bail!("unknown suffix {suffix:?} in quantity {q:?}"),
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() {
        bail!("no number in quantity {q:?}");
    }
    let digits: u128 = format!("{int}{frac}")
        .parse()
        .map_err(|_| anyhow!("bad number in quantity {q:?}"))?;
    let scale = 10u128.pow(u32::try_from(frac.len())?);
    u64::try_from(digits * mul / (scale * div)).map_err(|_| anyhow!("quantity {q:?} too large"))
}

/// The memory model's value for each container of a pod at `now` (the KWOK usage expression in
/// `tests/cluster/kwok.yaml`, recomputed): the modelled container has `base + leak_per_minute *
/// age`, with the age counted from the pod's creation; the others have 4Mi. `None` for a pod that
/// is not Running (metrics-server reports none). Errors name a bad annotation.
pub fn model_usage(pod: &Pod, now: Timestamp) -> Result<Option<Vec<(String, u64)>>> {
    let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    let Some(created) = pod.metadata.creation_timestamp.as_ref().filter(|_| running) else {
        return Ok(None);
    };
    let annotations = pod.annotations();
    let quantity = |key: &str, default: u64| match annotations.get(key) {
        Some(v) => parse_quantity(v).with_context(|| format!("annotation {key}")),
        None => Ok(default),
    };
    let base = quantity(MEMORY_BASE, DEFAULT_BASE)?;
    let leak = quantity(MEMORY_LEAK_PER_MINUTE, 0)?;
    let names: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .map(|c| c.name.as_str())
        .collect();
    let carrier = match annotations.get(MEMORY_CONTAINER) {
        Some(c) if names.contains(&c.as_str()) => c.as_str(),
        Some(c) => bail!("annotation {MEMORY_CONTAINER} names {c:?}, not a container of the pod"),
        None => names.first().copied().unwrap_or_default(),
    };
    let age_ms = u128::try_from((now.as_millisecond() - created.0.as_millisecond()).max(0))?;
    let modelled = u64::try_from(u128::from(base) + u128::from(leak) * age_ms / 60_000)?;
    let usage = names
        .iter()
        .map(|n| {
            let bytes = if *n == carrier {
                modelled
            } else {
                OTHER_CONTAINER
            };
            (n.to_string(), bytes)
        })
        .collect();
    Ok(Some(usage))
}

/// Memory of a pod as metrics-server reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodMemory {
    /// Sum of the containers' `usage.memory`.
    pub bytes: u64,
    /// When metrics-server sampled it (the scrape of the pod's node).
    pub timestamp: Timestamp,
    pub containers: Vec<(String, u64)>,
}

fn read_pod_memory(obj: &DynamicObject) -> Result<PodMemory> {
    let timestamp = obj.data["timestamp"]
        .as_str()
        .context("PodMetrics without timestamp")?
        .parse()?;
    let mut containers = Vec::new();
    for c in obj.data["containers"]
        .as_array()
        .context("PodMetrics without containers")?
    {
        let name = c["name"].as_str().unwrap_or_default().to_string();
        let memory = parse_quantity(
            c["usage"]["memory"]
                .as_str()
                .context("container without usage.memory")?,
        )?;
        containers.push((name, memory));
    }
    Ok(PodMemory {
        bytes: containers.iter().map(|(_, m)| m).sum(),
        timestamp,
        containers,
    })
}

/// The pod's current PodMetrics, or `None` while metrics-server has none for it (a new pod has
/// none until its node has been scraped twice).
pub async fn pod_memory(client: &Client, ns: &str, pod: &str) -> Result<Option<PodMemory>> {
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), ns, &pod_metrics_resource());
    match api.get(pod).await {
        Ok(obj) => Ok(Some(read_pod_memory(&obj)?)),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading PodMetrics {ns}/{pod}")),
    }
}

/// Polls the pod's PodMetrics until `cond` holds (`None` = no metrics yet, or no more) and
/// returns the state that satisfied it. metrics.k8s.io serves no watch, and metrics-server
/// refreshes every 10 s, so a 1 s poll misses nothing.
pub async fn wait_pod_memory(
    client: &Client,
    ns: &str,
    pod: &str,
    timeout: Duration,
    mut cond: impl FnMut(Option<&PodMemory>) -> bool,
) -> Result<Option<PodMemory>> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let now = pod_memory(client, ns, pod).await;
        if let Ok(m) = &now
            && cond(m.as_ref())
        {
            return now;
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("PodMetrics {ns}/{pod}: condition not met within {timeout:?}; last seen {now:?}");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("16Mi").unwrap(), 16 << 20);
        assert_eq!(parse_quantity("1.5Gi").unwrap(), 3 << 29);
        assert_eq!(parse_quantity("500M").unwrap(), 500_000_000);
        assert_eq!(parse_quantity("1500m").unwrap(), 1);
        assert_eq!(parse_quantity("1e3").unwrap(), 1000);
        assert_eq!(parse_quantity("123").unwrap(), 123);
        assert!(parse_quantity("12Zi").is_err());
        assert!(parse_quantity("Mi").is_err());
    }

    fn pod(annotations: &[(&str, &str)], created: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "creationTimestamp": created, "annotations": annotations.iter().cloned().collect::<std::collections::BTreeMap<_, _>>()},
            "spec": {"containers": [{"name": "app"}, {"name": "sidecar"}]},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn leak_grows_with_age() {
        let p = pod(
            &[(MEMORY_LEAK_PER_MINUTE, "60Mi")],
            "2025-01-01T00:00:00Z",
            "Running",
        );
        let at = |s: &str| model_usage(&p, s.parse().unwrap()).unwrap().unwrap();
        assert_eq!(
            at("2025-01-01T00:00:00Z"),
            vec![("app".into(), 16 << 20), ("sidecar".into(), 4 << 20)]
        );
        assert_eq!(at("2025-01-01T00:00:02Z")[0].1, (16 << 20) + (2 << 20));
        assert_eq!(at("2025-01-01T00:00:01Z")[0].1, (16 << 20) + (1 << 20));
        assert_eq!(at("2025-01-01T00:00:00.5Z")[0].1, (16 << 20) + (1 << 19));
    }

    #[test]
    fn named_container_carries_the_model() {
        let p = pod(
            &[(MEMORY_BASE, "100Mi"), (MEMORY_CONTAINER, "sidecar")],
            "2025-01-01T00:00:00Z",
            "Running",
        );
        let usage = model_usage(&p, "2025-01-01T01:00:00Z".parse().unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(
            usage,
            vec![("app".into(), 4 << 20), ("sidecar".into(), 100 << 20)]
        );
        let bad = pod(
            &[(MEMORY_CONTAINER, "nope")],
            "2025-01-01T00:00:00Z",
            "Running",
        );
        assert!(model_usage(&bad, Timestamp::now()).is_err());
    }

    #[test]
    fn pods_not_running_get_no_metrics() {
        let p = pod(&[], "2025-01-01T00:00:00Z", "Pending");
        assert_eq!(model_usage(&p, Timestamp::now()).unwrap(), None);
    }
}
