//! Slim wire types: only the fields bouncer reads, deserialized straight from the API server's
//! JSON. Field names and shapes mirror k8s-openapi's, so conversions read the same; everything
//! else (managedFields, full specs, container statuses) is skipped without being allocated.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::hash::Hasher;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use siphasher::sip::SipHasher13;

/// `null` reads as the default, like a missing field (Go encodes nil slices as null).
fn nullable<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A response that does not read as its slim form. Cannot happen for objects the API server
/// serves (the slim forms are subsets), but it is an error, not a panic: the caller fails closed
/// (skips the workload, or fails the bounce) and the message names the object.
#[derive(Debug, thiserror::Error)]
#[error("failed to read {kind} {namespace}/{name} from the API server's answer: {source}")]
pub struct DecodeError {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    #[source]
    pub source: serde_json::Error,
}

/// For the call sites that speak `kube::Error` (retries, fresh reads): a deserialization error
/// that keeps the message naming the object, and is never retried.
impl From<DecodeError> for kube::Error {
    fn from(e: DecodeError) -> kube::Error {
        kube::Error::SerdeError(<serde_json::Error as serde::de::Error>::custom(e))
    }
}

/// Reads one object's JSON (a GET, PATCH or watch answer) as its slim form `W`.
pub fn decode<W: DeserializeOwned>(
    json: &str,
    kind: &'static str,
    namespace: &str,
    name: &str,
) -> Result<W, DecodeError> {
    serde_json::from_str(json).map_err(|source| DecodeError {
        kind,
        namespace: namespace.to_string(),
        name: name.to_string(),
        source,
    })
}

/// Objects whose metadata a watch reads its resourceVersion from, and what of them a LIST asks for.
pub trait Object {
    /// The type holds nothing but the metadata, so its LISTs ask the API server for a
    /// `PartialObjectMetadataList`: a page of 5,000 ReplicaSets is then 15.0 MB instead of
    /// 21.9 MB, answered in half the time, without their pod templates.
    const METADATA_ONLY: bool = false;
    fn meta(&self) -> &ObjectMeta;
}

macro_rules! objects {
    ($($t:ty),* ; metadata only: $($m:ty),*) => {
        $(impl Object for $t { fn meta(&self) -> &ObjectMeta { &self.metadata } })*
        $(impl Object for $m {
            const METADATA_ONLY: bool = true;
            fn meta(&self) -> &ObjectMeta { &self.metadata }
        })*
    };
}
objects!(
    Pod,
    Controller,
    PodMetrics,
    PodDisruptionBudget;
    metadata only: ReplicaSet, Namespace
);

/// The metadata of a LIST page (its items are read one by one, see [`super::list`]).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListMeta {
    #[serde(rename = "continue")]
    pub continue_: Option<String>,
    pub resource_version: Option<String>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    pub name: Option<String>,
    pub namespace: Option<String>,
    pub uid: Option<String>,
    pub creation_timestamp: Option<Time>,
    pub generation: Option<i64>,
    pub labels: Option<BTreeMap<String, String>>,
    pub annotations: Option<BTreeMap<String, String>>,
    pub owner_references: Option<Vec<OwnerReference>>,
    pub deletion_timestamp: Option<Time>,
    pub resource_version: Option<String>,
    /// Only the managedFields entries that own the pod template's restartedAt; the others are
    /// read past without being kept.
    #[serde(default, deserialize_with = "restart_owners")]
    pub managed_fields: Vec<RestartOwner>,
}

/// A managedFields entry that owns `spec.template.metadata.annotations` restartedAt.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RestartOwner {
    pub manager: String,
    /// `operation: Apply` (server-side apply), not `Update`.
    pub apply: bool,
}

#[derive(Deserialize)]
struct OwnerEntry<'a> {
    #[serde(borrow, default)]
    manager: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    operation: Option<Cow<'a, str>>,
    #[serde(rename = "fieldsV1", default)]
    fields_v1: Option<FieldsSpec>,
}

/// The path of the key in fieldsV1, one level each; every other field is skipped unread.
#[derive(Deserialize)]
struct FieldsSpec {
    #[serde(rename = "f:spec")]
    spec: Option<FieldsTemplate>,
}
#[derive(Deserialize)]
struct FieldsTemplate {
    #[serde(rename = "f:template")]
    template: Option<FieldsMeta>,
}
#[derive(Deserialize)]
struct FieldsMeta {
    #[serde(rename = "f:metadata")]
    metadata: Option<FieldsAnnotations>,
}
#[derive(Deserialize)]
struct FieldsAnnotations {
    #[serde(rename = "f:annotations")]
    annotations: Option<FieldsRestartedAt>,
}
#[derive(Deserialize)]
struct FieldsRestartedAt {
    // `core::literals::RESTARTED_AT`, as fieldsV1 spells a key (a test holds them equal).
    #[serde(rename = "f:kubectl.kubernetes.io/restartedAt")]
    restarted_at: Option<IgnoredAny>,
}

impl FieldsSpec {
    fn owns_restarted_at(&self) -> bool {
        self.spec
            .as_ref()
            .and_then(|s| s.template.as_ref())
            .and_then(|t| t.metadata.as_ref())
            .and_then(|m| m.annotations.as_ref())
            .is_some_and(|a| a.restarted_at.is_some())
    }
}

fn restart_owners<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<RestartOwner>, D::Error> {
    struct Entries;
    impl<'de> Visitor<'de> for Entries {
        type Value = Vec<RestartOwner>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("managedFields entries")
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_seq(self)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut owners = Vec::new();
            while let Some(e) = seq.next_element::<OwnerEntry<'de>>()? {
                if e.fields_v1.is_some_and(|f| f.owns_restarted_at()) {
                    owners.push(RestartOwner {
                        manager: e.manager.unwrap_or_default().into_owned(),
                        apply: e.operation.as_deref() == Some("Apply"),
                    });
                }
            }
            Ok(owners)
        }
    }
    d.deserialize_option(Entries)
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerReference {
    #[serde(default, deserialize_with = "nullable")]
    pub api_version: String,
    #[serde(default, deserialize_with = "nullable")]
    pub kind: String,
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub uid: String,
    pub controller: Option<bool>,
}

/// Metadata of a pod template: its labels and annotations; of its spec only a digest.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct PodTemplateSpec {
    pub metadata: Option<ObjectMeta>,
    pub spec: Option<SpecDigest>,
}

/// A digest of a JSON value, computed while it is read past (nothing of it is kept): what
/// tells a pod template's spec (its images, commands, resources) from another one. Restarts
/// write only the template's metadata, so a restart leaves it as it was and a new image
/// changes it. SipHash-1-3 with fixed keys: the same value gives the same digest in every run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecDigest(pub u64);

impl<'de> Deserialize<'de> for SpecDigest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut h = SipHasher13::new();
        Hashing(&mut h).deserialize(d)?;
        Ok(SpecDigest(h.finish()))
    }
}

/// Feeds every token of a value into the hasher, each tagged with its type (and strings with
/// their length), so different values do not run together into the same input.
struct Hashing<'h>(&'h mut SipHasher13);

impl<'de> DeserializeSeed<'de> for Hashing<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Hashing<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.0.write(&[b'b', u8::from(v)]);
        Ok(())
    }
    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        self.0.write_u8(b'i');
        self.0.write_i64(v);
        Ok(())
    }
    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        self.0.write_u8(b'u');
        self.0.write_u64(v);
        Ok(())
    }
    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        self.0.write_u8(b'f');
        self.0.write_u64(v.to_bits());
        Ok(())
    }
    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        self.0.write_u8(b's');
        self.0.write_usize(v.len());
        self.0.write(v.as_bytes());
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        self.0.write_u8(b'n');
        Ok(())
    }
    fn visit_none<E>(self) -> Result<(), E> {
        self.0.write_u8(b'n');
        Ok(())
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let h = self.0;
        h.write_u8(b'[');
        while seq.next_element_seed(Hashing(&mut *h))?.is_some() {}
        h.write_u8(b']');
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let h = self.0;
        h.write_u8(b'{');
        while map.next_key_seed(Hashing(&mut *h))?.is_some() {
            map.next_value_seed(Hashing(&mut *h))?;
        }
        h.write_u8(b'}');
        Ok(())
    }
}

#[derive(Debug, Default, Clone, Deserialize)]
pub struct Pod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: Option<PodSpec>,
    pub status: Option<PodStatus>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default, deserialize_with = "nullable")]
    pub containers: Vec<Container>,
    /// Native sidecars among them (`restartPolicy: Always`) run beside the containers.
    #[serde(default, deserialize_with = "nullable")]
    pub init_containers: Vec<Container>,
    /// Pod-level resources (PodLevelResources, beta from v1.34): a limit for the whole pod.
    pub resources: Option<ResourceRequirements>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    pub resources: Option<ResourceRequirements>,
    pub restart_policy: Option<String>,
}

#[derive(Debug, Default, Clone, Deserialize)]
pub struct ResourceRequirements {
    pub limits: Option<Resources>,
}

/// A resource list (limits, usage); only memory matters.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct Resources {
    pub memory: Option<Quantity>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    pub phase: Option<String>,
    pub start_time: Option<Time>,
    pub conditions: Option<Vec<Condition>>,
}

/// A status condition (pods, Deployments).
#[derive(Debug, Default, Clone, Deserialize)]
pub struct Condition {
    #[serde(rename = "type", default, deserialize_with = "nullable")]
    pub type_: String,
    #[serde(default, deserialize_with = "nullable")]
    pub status: String,
    pub reason: Option<String>,
}

#[derive(Debug, Default, Clone, Deserialize)]
pub struct ReplicaSet {
    #[serde(default)]
    pub metadata: ObjectMeta,
}

/// A Deployment, StatefulSet or DaemonSet: the union of the fields bouncer reads of the three,
/// so that one type (and one conversion, `convert::controller`) serves every kind and every
/// kind of answer (LIST items, GET, PATCH, watch events).
#[derive(Debug, Default, Clone, Deserialize)]
pub struct Controller {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: Option<ControllerSpec>,
    pub status: Option<ControllerStatus>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControllerSpec {
    /// Deployment and StatefulSet.
    pub replicas: Option<i32>,
    /// Deployment.
    pub paused: Option<bool>,
    #[serde(default, deserialize_with = "nullable")]
    pub selector: LabelSelector,
    /// Deployment.
    pub strategy: Option<Strategy>,
    /// StatefulSet and DaemonSet.
    pub update_strategy: Option<Strategy>,
    #[serde(default, deserialize_with = "nullable")]
    pub template: PodTemplateSpec,
}

/// Deployment `strategy`, StatefulSet and DaemonSet `updateStrategy`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Strategy {
    #[serde(rename = "type")]
    pub type_: Option<String>,
    pub rolling_update: Option<RollingUpdate>,
}

/// The union of the three kinds' rolling-update parameters.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdate {
    pub max_surge: Option<IntOrString>,
    pub max_unavailable: Option<IntOrString>,
    pub partition: Option<i32>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControllerStatus {
    pub observed_generation: Option<i64>,
    /// Deployment and StatefulSet.
    pub replicas: Option<i32>,
    pub updated_replicas: Option<i32>,
    pub ready_replicas: Option<i32>,
    pub available_replicas: Option<i32>,
    /// Deployment.
    pub conditions: Option<Vec<Condition>>,
    /// StatefulSet.
    pub current_revision: Option<String>,
    pub update_revision: Option<String>,
    /// DaemonSet.
    pub desired_number_scheduled: Option<i32>,
    pub current_number_scheduled: Option<i32>,
    pub updated_number_scheduled: Option<i32>,
    pub number_ready: Option<i32>,
    pub number_available: Option<i32>,
}

/// Only the managedFields of an object: who owns which fields, and when each last wrote.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct Managed {
    #[serde(default)]
    pub metadata: ManagedMeta,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedMeta {
    #[serde(default, deserialize_with = "nullable")]
    pub managed_fields: Vec<ManagedFieldsEntry>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedFieldsEntry {
    pub manager: Option<String>,
    pub time: Option<Time>,
    #[serde(rename = "fieldsV1")]
    pub fields_v1: Option<serde_json::Value>,
}

#[derive(Debug, Default, Clone, Deserialize)]
pub struct Namespace {
    #[serde(default)]
    pub metadata: ObjectMeta,
}

/// metrics.k8s.io/v1beta1 PodMetrics.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct PodMetrics {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "nullable")]
    pub containers: Vec<ContainerMetrics>,
}

#[derive(Debug, Default, Clone, Deserialize)]
pub struct ContainerMetrics {
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    #[serde(default, deserialize_with = "nullable")]
    pub usage: Resources,
}

/// policy/v1 PodDisruptionBudget.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct PodDisruptionBudget {
    #[serde(default)]
    pub metadata: ObjectMeta,
    pub spec: Option<PdbSpec>,
    pub status: Option<PdbStatus>,
}

#[derive(Debug, Default, Clone, Deserialize)]
pub struct PdbSpec {
    pub selector: Option<LabelSelector>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PdbStatus {
    #[serde(default, deserialize_with = "nullable")]
    pub disruptions_allowed: i32,
}
