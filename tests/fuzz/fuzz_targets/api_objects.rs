//! Fuzzes the cluster edge's input: any bytes, read as the API server's answer (one object of every
//! kind bouncer reads, or a LIST response arriving in pieces), must convert into the core's types
//! or fail with an error, never panic; and whatever converts must survive the planner.
#![no_main]

use std::sync::{Arc, OnceLock};

use bouncer::cluster::list::ListSplitter;
use bouncer::cluster::{convert, kinds, wire};
use bouncer::core::model::{Inventory, Kind, MetricsState, Pdb, Workload, WorkloadRef};
use bouncer::core::plan::{Limits, plan};
use bouncer::core::policy::{Policy, parse_str};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

/// One policy of each trigger that reads workloads and pods: everything the fuzzed objects convert
/// into is planned against both.
const POLICIES: &str = r#"
apiVersion: bouncer.dev/v1alpha1
kind: BouncePolicy
metadata: {name: memory}
spec:
  target:
    selector: {matchExpressions: [{key: app, operator: Exists}]}
    kinds: [Deployment, StatefulSet, DaemonSet, Pod]
  triggers: {memory: {above: 1Mi}}
  cooldown: 1m
---
apiVersion: bouncer.dev/v1alpha1
kind: BouncePolicy
metadata: {name: nightly}
spec:
  target:
    selector: {matchLabels: {app: web}}
    kinds: [Deployment, StatefulSet, DaemonSet, Pod]
  triggers: {schedule: {cron: "0 2 * * *"}}
  allowDowntime: true
"#;

fn policies() -> &'static [Policy] {
    static POLICIES_PARSED: OnceLock<Vec<Policy>> = OnceLock::new();
    POLICIES_PARSED
        .get_or_init(|| parse_str("fuzz.yaml", POLICIES).expect("the fixed policies load"))
}

/// Everything one object's JSON converts into, read as each kind in turn.
#[derive(Default)]
struct Converted {
    workloads: Vec<Workload>,
    pdbs: Vec<Pdb>,
}

fn convert_object(text: &str, out: &mut Converted) {
    for kind in Kind::ALL {
        let target = WorkloadRef {
            kind,
            namespace: "fuzz".into(),
            name: "object".into(),
        };
        // GET, PATCH and watch answers: one decoder per kind, the same conversion as LIST items.
        if let Ok((w, _resource_version)) = kinds::decode(&target, text) {
            assert_eq!(w.target.kind, kind);
            let _ = bouncer::core::rollout::state(kind, w.strategy, &w.status);
            let _ = w.pod_selector.len();
            out.workloads.push(w);
        }
    }
    if let Ok(p) = wire::decode::<wire::Pod>(text, "Pod", "fuzz", "object") {
        let mut shared = bouncer::cluster::shared::Shared::default();
        let first = convert::pod(p.clone(), &mut shared);
        // A pod with the same labels shares one map (the snapshot's memory saving).
        let second = convert::pod(p, &mut shared);
        assert!(Arc::ptr_eq(&first.labels, &second.labels));
        // Give every controller read from the same bytes this pod, so the gates count it.
        for w in out
            .workloads
            .iter_mut()
            .filter(|w| w.target.kind != Kind::Pod)
        {
            w.pods.push(second.clone());
        }
    }
    if let Ok(p) =
        wire::decode::<wire::PodDisruptionBudget>(text, "PodDisruptionBudget", "fuzz", "object")
    {
        let pdb = Pdb::from(p);
        for w in &out.workloads {
            let _ = pdb.selector.matches(&w.template_labels);
        }
        let _ = pdb.selector.to_string();
        out.pdbs.push(pdb);
    }
    if let Ok(m) = wire::decode::<wire::Managed>(text, "Deployment", "fuzz", "object") {
        for entry in m.metadata.managed_fields {
            let _ = convert::field_write(entry);
        }
    }
}

/// Feeds a LIST response to the splitter in pieces of the given sizes (then the rest at once):
/// the items it yields (until the first error) and how it ends.
fn split_list(
    bytes: &[u8],
    sizes: impl Iterator<Item = usize>,
) -> (Vec<Value>, Result<String, String>) {
    let mut splitter = ListSplitter::default();
    let mut items = Vec::new();
    let mut rest = bytes;
    let mut sizes = sizes;
    while !rest.is_empty() {
        let n = sizes.next().unwrap_or(rest.len()).clamp(1, rest.len());
        let (piece, tail) = rest.split_at(n);
        rest = tail;
        if let Err(e) = splitter.feed(piece, &mut |item: Value| items.push(item)) {
            return (items, Err(e.to_string()));
        }
    }
    let end = splitter
        .finish()
        .map(|m| format!("{m:?}"))
        .map_err(|e| e.to_string());
    (items, end)
}

/// Random text rarely spells the number that breaks some arithmetic, so the same bytes, read as
/// little-endian integers, also fill every count and rolling-update parameter of a workload (an
/// odd value as a percentage), which then goes through the same conversions.
fn numbered(bytes: &[u8]) -> Value {
    let mut ints = bytes
        .chunks(4)
        .map(|c| {
            let mut b = [0u8; 4];
            b[..c.len()].copy_from_slice(c);
            i32::from_le_bytes(b)
        })
        .chain(std::iter::repeat(0));
    let mut int = || ints.next().unwrap_or_default();
    let mut values = [0i32; 16];
    for v in &mut values {
        *v = int();
    }
    let int_or_percent = |n: i32| {
        if n & 1 == 1 {
            json!(format!("{}%", n >> 1))
        } else {
            json!(n >> 1)
        }
    };
    let strategy =
        ["RollingUpdate", "Recreate", "OnDelete"][values[15].unsigned_abs() as usize % 3];
    json!({
        "metadata": {"name": "numbers", "namespace": "fuzz", "generation": values[0]},
        "spec": {
            "replicas": values[1], "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}},
            "strategy": {"type": strategy, "rollingUpdate": {
                "maxSurge": int_or_percent(values[2]), "maxUnavailable": int_or_percent(values[3])}},
            "updateStrategy": {"type": strategy, "rollingUpdate": {
                "maxUnavailable": int_or_percent(values[3]), "partition": values[4]}}
        },
        "status": {
            "observedGeneration": values[5], "replicas": values[6], "updatedReplicas": values[7],
            "readyReplicas": values[8], "availableReplicas": values[9],
            "desiredNumberScheduled": values[10], "currentNumberScheduled": values[6],
            "updatedNumberScheduled": values[7], "numberReady": values[8],
            "numberAvailable": values[9], "disruptionsAllowed": values[11],
            "currentRevision": "a", "updateRevision": if values[12] & 1 == 1 { "b" } else { "a" }
        }
    })
}

fuzz_target!(|data: &[u8]| {
    // The first byte says where the network cuts the response; the rest is the response.
    let Some((&cut, bytes)) = data.split_first() else {
        return;
    };
    // The LIST reader must not care how the response is cut into pieces.
    let whole = split_list(bytes, std::iter::empty());
    let at = bytes.len() * usize::from(cut) / 255;
    let halves = split_list(bytes, [at].into_iter());
    assert_eq!(whole, halves, "cut at byte {at}");
    if bytes.len() <= 512 {
        let bytewise = split_list(bytes, std::iter::repeat(1));
        assert_eq!(whole, bytewise, "fed byte by byte");
    }

    let mut converted = Converted::default();
    // The items of a LIST, each converted as the snapshot does.
    for item in whole.0.iter().take(8) {
        convert_object(&item.to_string(), &mut converted);
    }
    // The API server's answers are UTF-8; a body that is not fails to decode before conversion.
    if let Ok(text) = std::str::from_utf8(bytes) {
        convert_object(text, &mut converted);
    }
    convert_object(&numbered(bytes).to_string(), &mut converted);
    if converted.workloads.is_empty() {
        return;
    }
    let inventory = Inventory {
        workloads: converted.workloads,
        unsupported: Vec::new(),
        excluded_namespaces: Default::default(),
        pdbs: converted.pdbs,
        metrics: MetricsState::Available,
    };
    let now: chrono::DateTime<chrono::Utc> = "2026-03-29T02:30:00Z".parse().unwrap();
    let _ = plan(policies(), &inventory, now, &Limits::max_bounces(3));
});
