//! Fixture controllers that behave like the real owners bouncer meets: an operator that reverts
//! pod-template annotations (ToolHive <= v0.44.0, and its fixed mode) and an app that keeps
//! bare pods alive under fixed names (mcpd).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use serde_json::{Map, Value, json};
use tokio::time::MissedTickBehavior;

use crate::{BackgroundTask, RESTARTED_AT, count, is_conflict, selector_string};

/// Field manager of the reverting operator, as the real ToolHive operator shows in managedFields.
pub const TOOLHIVE_MANAGER: &str = "toolhive-operator";
/// Field manager of the bare-pod app.
pub const MCPD_MANAGER: &str = "mcpd";
/// Watches deliver changes in milliseconds; the tick only covers a watch that silently stalls.
const RESYNC: Duration = Duration::from_secs(5);

/// How the reverting operator treats `kubectl.kubernetes.io/restartedAt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RevertMode {
    /// ToolHive <= v0.44.0: the template's annotations are reset to exactly the desired set,
    /// so a `rollout restart` is undone within a second.
    Strict,
    /// ToolHive after PR #6378: `restartedAt` is kept, any other extra annotation is reverted.
    KeepRestartedAt,
}

/// An operator owning one Deployment whose pod-template annotations it keeps at a desired set.
///
/// The ToolHive claims are proven on the real operator ([`crate::toolhive`]). This look-alike
/// stays where the real one would only make a test slower without showing more: it needs no
/// CRDs (so its tests run in parallel, where the real operator's run one at a time), its pods
/// stop in 2 s (the real vMCP's take their 30 s grace period per eviction), and it reverts any
/// Deployment a test builds, e.g. one guarded by a PodDisruptionBudget or queued before a plain
/// workload to show a revert halting the run.
pub struct RevertingOperator;

impl RevertingOperator {
    /// Creates `deployment` in `ns` as `toolhive-operator` (or adopts an existing one of that
    /// name), takes its template annotations as the desired set, and reconciles on every change.
    /// `actions()` of the handle counts reverts.
    pub async fn spawn(
        client: Client,
        ns: &str,
        deployment: Deployment,
        mode: RevertMode,
    ) -> Result<BackgroundTask> {
        let api = Api::<Deployment>::namespaced(client, ns);
        let name = deployment.name_any();
        let params = PostParams {
            field_manager: Some(TOOLHIVE_MANAGER.into()),
            ..Default::default()
        };
        match api.create(&params, &deployment).await {
            Ok(_) => {}
            Err(e) if is_conflict(&e) => {}
            Err(e) => return Err(e).with_context(|| format!("creating deployment {ns}/{name}")),
        }
        let desired = template_annotations(&deployment);
        let actions = Arc::new(AtomicUsize::new(0));
        let counter = actions.clone();
        Ok(BackgroundTask::spawn(actions, async move {
            let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
            let mut events = std::pin::pin!(
                watcher::watcher(api.clone(), config)
                    .default_backoff()
                    .applied_objects()
            );
            let mut tick = tokio::time::interval(RESYNC);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                let current = tokio::select! {
                    event = events.next() => match event {
                        Some(Ok(d)) => Some(d),
                        Some(Err(e)) => { tracing::warn!("reverting operator: watch: {e}"); None }
                        None => return,
                    },
                    _ = tick.tick() => api.get_opt(&name).await.ok().flatten(),
                };
                let Some(current) = current else { continue };
                let Some(patch) = revert_patch(&template_annotations(&current), &desired, mode)
                else {
                    continue;
                };
                let params = PatchParams {
                    field_manager: Some(TOOLHIVE_MANAGER.into()),
                    ..Default::default()
                };
                match api.patch(&name, &params, &Patch::Merge(&patch)).await {
                    Ok(_) => count(&counter),
                    Err(e) => tracing::warn!("reverting operator: patching {name}: {e}"),
                }
            }
        }))
    }
}

fn template_annotations(d: &Deployment) -> BTreeMap<String, String> {
    d.spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default()
}

/// The JSON merge patch that brings `current` back to `desired` (`null` deletes a key), or
/// `None` when nothing needs changing.
pub fn revert_patch(
    current: &BTreeMap<String, String>,
    desired: &BTreeMap<String, String>,
    mode: RevertMode,
) -> Option<Value> {
    let mut target = desired.clone();
    if mode == RevertMode::KeepRestartedAt
        && let Some(v) = current.get(RESTARTED_AT)
    {
        target.insert(RESTARTED_AT.to_string(), v.clone());
    }
    if *current == target {
        return None;
    }
    let mut annotations = Map::new();
    for key in current.keys().filter(|k| !target.contains_key(*k)) {
        annotations.insert(key.clone(), Value::Null);
    }
    for (k, v) in target.iter().filter(|(k, v)| current.get(*k) != Some(*v)) {
        annotations.insert(k.clone(), Value::String(v.clone()));
    }
    Some(json!({"spec": {"template": {"metadata": {"annotations": annotations}}}}))
}

/// An app that keeps bare pods `<prefix>-0..n` (no ownerReferences) alive, like mcpd: a pod that
/// is deleted or evicted is created again under the same name once the old object is gone.
pub struct BarePodApp;

impl BarePodApp {
    /// Creates the pods from `template` (its labels and annotations are copied to every pod)
    /// and keeps them alive. `actions()` of the handle counts pods created, the first ones too.
    pub async fn spawn(
        client: Client,
        ns: &str,
        prefix: &str,
        replicas: usize,
        template: PodTemplateSpec,
    ) -> Result<BackgroundTask> {
        let api = Api::<Pod>::namespaced(client, ns);
        let names: Vec<String> = (0..replicas).map(|i| format!("{prefix}-{i}")).collect();
        let make = move |name: &str| Pod {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: template.metadata.as_ref().and_then(|m| m.labels.clone()),
                annotations: template
                    .metadata
                    .as_ref()
                    .and_then(|m| m.annotations.clone()),
                ..Default::default()
            },
            spec: template.spec.clone(),
            ..Default::default()
        };
        let selector = selector_string(make("").labels());
        let actions = Arc::new(AtomicUsize::new(0));
        let counter = actions.clone();
        let params = PostParams {
            field_manager: Some(MCPD_MANAGER.into()),
            ..Default::default()
        };
        // A fresh namespace can refuse pods for a moment (on servers before 1.24 until the
        // apiserver's cache has the service account token), so the first creates retry briefly.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        for name in &names {
            loop {
                match api.create(&params, &make(name)).await {
                    Ok(_) => count(&counter),
                    Err(e) if is_conflict(&e) => {}
                    Err(e) if tokio::time::Instant::now() < deadline => {
                        tracing::debug!("bare-pod app: creating {name}, will retry: {e}");
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        continue;
                    }
                    Err(e) => return Err(e).with_context(|| format!("creating pod {ns}/{name}")),
                }
                break;
            }
        }
        Ok(BackgroundTask::spawn(actions, async move {
            let config = watcher::Config::default().labels(&selector);
            let mut events =
                std::pin::pin!(watcher::watcher(api.clone(), config).default_backoff());
            let mut present: BTreeSet<String> = BTreeSet::new();
            let mut listed: BTreeSet<String> = BTreeSet::new();
            let mut ready = false;
            // A failed create (the old pod still terminating) is retried on the next tick.
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    event = events.next() => match event {
                        Some(Ok(Event::Init)) => listed.clear(),
                        Some(Ok(Event::InitApply(p))) => drop(listed.insert(p.name_any())),
                        Some(Ok(Event::InitDone)) => { present = std::mem::take(&mut listed); ready = true; }
                        Some(Ok(Event::Apply(p))) => drop(present.insert(p.name_any())),
                        Some(Ok(Event::Delete(p))) => drop(present.remove(&p.name_any())),
                        Some(Err(e)) => tracing::warn!("bare-pod app: watch: {e}"),
                        None => return,
                    },
                    _ = tick.tick() => {}
                }
                if !ready {
                    continue;
                }
                let missing: Vec<&String> =
                    names.iter().filter(|n| !present.contains(*n)).collect();
                for name in missing {
                    match api.create(&params, &make(name)).await {
                        Ok(_) => {
                            count(&counter);
                            present.insert(name.clone());
                        }
                        Err(e) if is_conflict(&e) => {}
                        Err(e) => tracing::warn!("bare-pod app: creating {name}: {e}"),
                    }
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn strict_removes_restarted_at_and_restores_desired() {
        let desired = map(&[("hash", "1")]);
        let current = map(&[("hash", "2"), (RESTARTED_AT, "t")]);
        let patch = revert_patch(&current, &desired, RevertMode::Strict).unwrap();
        assert_eq!(
            patch["spec"]["template"]["metadata"]["annotations"],
            json!({"hash": "1", RESTARTED_AT: null})
        );
        assert_eq!(revert_patch(&desired, &desired, RevertMode::Strict), None);
    }

    #[test]
    fn keep_mode_keeps_restarted_at_only() {
        let desired = map(&[("hash", "1")]);
        let current = map(&[("hash", "1"), (RESTARTED_AT, "t")]);
        assert_eq!(
            revert_patch(&current, &desired, RevertMode::KeepRestartedAt),
            None
        );
        let extra = map(&[("hash", "1"), (RESTARTED_AT, "t"), ("other", "x")]);
        let patch = revert_patch(&extra, &desired, RevertMode::KeepRestartedAt).unwrap();
        assert_eq!(
            patch["spec"]["template"]["metadata"]["annotations"],
            json!({"other": null})
        );
    }
}
