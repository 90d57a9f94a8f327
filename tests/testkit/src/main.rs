//! The `bouncer-testkit` command for demos against the local cluster: a one-shot setup of
//! ToolHive-shaped and plain leaky workloads (their memory follows the KWOK model in their pod
//! annotations; metrics-server reports it).

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use bouncer_testkit::PodTemplateExt;
use bouncer_testkit::workloads::{McpServer, deployment, mcp_server, virtual_mcp_server};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client, Resource, ResourceExt};

const USAGE: &str = "\
usage: bouncer-testkit <command>

commands:
  demo-setup                 create the demo workloads

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
        ["demo-setup"] => demo_setup().await,
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

async fn demo_setup() -> Result<()> {
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

    // The demo waits about a minute before `bouncer run`; the figures below put the vMCP and
    // fetch's backend over the example policies' thresholds by then, and nothing else.
    // vMCP: 2 replicas starting at 1500Mi and leaking 40Mi/min: past `above: 1536Mi` in a minute.
    let mut vmcp = virtual_mcp_server("vmcp-main").with_memory("1500Mi", "40Mi");
    if let Some(spec) = vmcp.spec.as_mut() {
        spec.replicas = Some(2);
    }
    create(&client, "toolhive-system", &vmcp).await?;

    // github leaks slowly; fetch's backend passes 85% of its 512Mi limit (435Mi) about a minute
    // after it starts, which is what the percentOfLimit example needs.
    let github = mcp_server("github").with_memory("48Mi", "2Mi");
    let fetch = mcp_server("fetch");
    let fetch = McpServer {
        proxy: fetch.proxy.with_memory("32Mi", "1Mi"),
        backend: fetch
            .backend
            .with_memory("32Mi", "420Mi")
            .with_memory_limit(Some("512Mi")),
    };
    for server in [&github, &fetch] {
        create(&client, "toolhive", &server.proxy).await?;
        create(&client, "toolhive", &server.backend).await?;
    }

    let api = deployment("leaky-api", 3, &[("app", "leaky-api")])
        .with_memory("64Mi", "20Mi")
        .with_memory_limit(Some("1Gi"));
    create(&client, "shop", &api).await?;
    Ok(())
}

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
