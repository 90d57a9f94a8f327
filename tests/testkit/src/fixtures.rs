//! A fixture controller that behaves like a real owner bouncer meets: an app that keeps bare pods
//! alive under fixed names (mcpd). The operator that reverts restartedAt is the real one
//! ([`crate::toolhive`]).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use tokio::time::MissedTickBehavior;

use crate::{BackgroundTask, count, is_conflict, selector_string};

/// Field manager of the bare-pod app.
pub const MCPD_MANAGER: &str = "mcpd";

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
