//! The `bouncer-testkit` command for the demo against the local cluster: the real ToolHive
//! operator and the resources it reconciles, and a plain leaky Deployment (their memory follows
//! the KWOK model in their pod annotations; metrics-server reports it).

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::time::Duration;

use bouncer_testkit::toolhive::{
    apply_runner_statefulset, mcp_group, mcp_server, virtual_mcp_server,
};
use bouncer_testkit::workloads::deployment;
use bouncer_testkit::{
    Kind, MEMORY_BASE, MEMORY_LEAK_PER_MINUTE, PodTemplateExt, TOOLHIVE_FIXED, ToolHiveOperator,
    wait_pods_ready, wait_rollout_complete,
};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};

const USAGE: &str = "\
usage: bouncer-testkit <command>

commands:
  demo [VERSION]             start the real ToolHive operator (default: the fixed release)
                             for toolhive-system and toolhive, create a VirtualMCPServer, two
                             MCPServers and a plain leaky Deployment, print demo ready, and
                             keep the operator running until SIGTERM or Ctrl-C

Uses KUBECONFIG like kubectl (e.g. after: eval \"$(scripts/cluster env)\").";

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber_init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["demo"] => demo(TOOLHIVE_FIXED).await,
        ["demo", version] => demo(version).await,
        ["help" | "--help" | "-h"] => {
            println!("{USAGE}");
            Ok(())
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bouncer-testkit: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Warnings go to stderr; `RUST_LOG` raises the level.
fn tracing_subscriber_init() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn client() -> Result<Client> {
    Client::try_default()
        .await
        .context("connecting to the cluster (is KUBECONFIG set?)")
}

async fn demo(version: &str) -> Result<()> {
    let client = client().await?;
    for ns in ["toolhive-system", "toolhive", "shop"] {
        let obj = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        report(
            Api::<Namespace>::all(client.clone())
                .create(&PostParams::default(), &obj)
                .await,
            "namespace",
            ns,
        )?;
    }
    let operator = ToolHiveOperator::start(version, "toolhive-system,toolhive").await?;
    println!(
        "started the ToolHive operator {version} for toolhive-system and toolhive (log {})",
        operator.log_path().display()
    );

    // The demo waits about a minute before `bouncer run`; the figures below put the vMCP and
    // fetch's backend over the example policies' thresholds by then, and nothing else.
    mcp_group(&client, "toolhive-system", "main").await?;
    virtual_mcp_server(&client, "toolhive-system", "vmcp-main", "main", 2).await?;
    println!("created VirtualMCPServer toolhive-system/vmcp-main (2 replicas) in MCPGroup main");

    // github leaks slowly; fetch's backend passes 85% of its 512Mi limit (435Mi) about a minute
    // after it starts, which is what the percentOfLimit example needs. The operator makes each
    // MCPServer's proxy Deployment; the backend StatefulSet is applied as its proxy runner would.
    mcp_group(&client, "toolhive", "tools").await?;
    for (name, proxy, backend) in [
        ("github", ("48Mi", "1Mi"), ("48Mi", "2Mi")),
        ("fetch", ("32Mi", "1Mi"), ("32Mi", "420Mi")),
    ] {
        let memory = |(base, leak): (&str, &str)| {
            BTreeMap::from([
                (MEMORY_BASE.to_string(), base.to_string()),
                (MEMORY_LEAK_PER_MINUTE.to_string(), leak.to_string()),
            ])
        };
        mcp_server(&client, "toolhive", name, "tools", &memory(proxy)).await?;
        apply_runner_statefulset(&client, "toolhive", name, &memory(backend), "512Mi").await?;
        println!("created MCPServer toolhive/{name} and its backend StatefulSet");
    }

    let api = deployment("leaky-api", 3, &[("app", "leaky-api")])
        .with_memory("64Mi", "20Mi")
        .with_memory_limit(Some("1Gi"));
    create(&client, "shop", &api).await?;

    for (kind, ns, name) in [
        (Kind::Deployment, "toolhive-system", "vmcp-main"),
        (Kind::Deployment, "toolhive", "github"),
        (Kind::StatefulSet, "toolhive", "github"),
        (Kind::Deployment, "toolhive", "fetch"),
        (Kind::StatefulSet, "toolhive", "fetch"),
        (Kind::Deployment, "shop", "leaky-api"),
    ] {
        wait_rollout_complete(&client, kind, ns, name, READY).await?;
    }
    // The VirtualMCPServer takes no pod annotations: its leak is put on the pods themselves
    // (1500Mi and 40Mi a minute: past `above: 1536Mi` within a minute). A restart resets it, as
    // a real restart resets the real leak.
    let vmcp = "app.kubernetes.io/instance=vmcp-main";
    for pod in wait_pods_ready(&client, "toolhive-system", vmcp, 2, READY).await? {
        let mut annotations = pod.metadata.annotations.unwrap_or_default();
        annotations.insert(MEMORY_BASE.into(), "1500Mi".into());
        annotations.insert(MEMORY_LEAK_PER_MINUTE.into(), "40Mi".into());
        let patch = serde_json::json!({"metadata": {"annotations": annotations}});
        Api::<Pod>::namespaced(client.clone(), "toolhive-system")
            .patch(
                &pod.metadata.name.unwrap_or_default(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
    }
    println!("{READY_LINE}");

    // The operator keeps reconciling (and, at v0.44.0, reverting) until the demo ends.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    drop(operator);
    Ok(())
}

/// What `demo` prints once everything runs; scripts/demo waits for it.
const READY_LINE: &str = "demo ready";
const READY: Duration = Duration::from_secs(300);

fn report<T>(result: kube::Result<T>, kind: &str, name: &str) -> Result<()> {
    match result {
        Ok(_) => println!("created {kind} {name}"),
        Err(kube::Error::Api(s)) if s.code == 409 => println!("exists  {kind} {name}"),
        Err(e) => bail!("creating {kind} {name}: {e}"),
    }
    Ok(())
}

/// Creates a workload and prints it with the labels its pods carry (what policies select).
async fn create<K>(client: &Client, ns: &str, obj: &K) -> Result<()>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug
        + PodLabels,
{
    let api = Api::<K>::namespaced(client.clone(), ns);
    let what = format!("{} {ns}/{}", K::kind(&()).to_lowercase(), obj.name_any());
    report(
        api.create(&PostParams::default(), obj).await,
        &what,
        &obj.pod_labels(),
    )
}

/// The pod labels of a workload, printed so a reader can match them against the policies.
trait PodLabels {
    fn pod_labels(&self) -> String;
}

macro_rules! pod_labels {
    ($($t:ty),*) => {$(
        impl PodLabels for $t {
            fn pod_labels(&self) -> String {
                let labels = self.spec.as_ref().and_then(|s| s.template.metadata.as_ref()).and_then(|m| m.labels.as_ref());
                format!("(pods: {})", labels.map(bouncer_testkit::selector_string).unwrap_or_default())
            }
        }
    )*};
}
pod_labels!(Deployment, StatefulSet);
