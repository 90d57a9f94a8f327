//! Who reverted a bounce: the workload's managedFields, read once the revert is proven, and
//! judged by `core::verify::reverters`.

use chrono::{DateTime, Utc};
use kube::Client;

use super::kinds;
use super::retry::with_retries;
use crate::core::model::WorkloadRef;
use crate::core::verify::{self, Reverters};

/// The likely reverters of a bounce patched at `since`. A failed read is logged and yields no
/// names: the revert itself is already proven.
pub async fn reverters(client: &Client, target: &WorkloadRef, since: DateTime<Utc>) -> Reverters {
    let writes = with_retries(&format!("read managedFields of {target}"), || {
        kinds::field_writes(client, target)
    })
    .await;
    match writes {
        Ok(writes) => verify::reverters(&writes, since),
        Err(e) => {
            tracing::warn!("reading managedFields of {target}: {e}");
            Reverters {
                managers: Vec::new(),
                wrote_after: false,
            }
        }
    }
}
