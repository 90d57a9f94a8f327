//! Whether a restart bouncer writes will hold, from who owns the pod template's
//! `kubectl.kubernetes.io/restartedAt` (managedFields, read with every workload).
//!
//! A server-side apply (`Apply`) owner of the key writes its own value back on its next apply:
//! kustomize-controller when Git sets the key, Argo CD with server-side apply, Helm 4,
//! `kubectl apply --server-side`. Its reconcile may come minutes after bouncer verified, so the
//! revert is rarely seen inside the rollout wait: the restart is not written at all. An
//! `Update` owner (an operator's controller) is only known to revert once it did; then the
//! value it left in place of bouncer's is a revert found late, and bouncer does not restart
//! through the template again while that owner holds the key.

use chrono::{DateTime, Utc};

use crate::core::literals::{rfc3339, whole_seconds};
use crate::core::mark::AttemptMark;
use crate::core::model::{AttemptOutcome, Method, Workload};
use crate::core::reasons::SkipReason;
use crate::core::verify::supersedes;

pub use crate::core::model::{RestartOwner, RestartOwners};

/// Why a restart through the pod template would not hold, or None when it would. Read only for
/// bounces that would write restartedAt (`Method::Rollout`).
pub fn undone(w: &Workload, now: DateTime<Utc>) -> Option<SkipReason> {
    let owners = w.restart_owners.as_deref()?;
    if let Some(reason) = reverted_since(w, owners, now) {
        return Some(reason);
    }
    let applier = owners.owners.iter().find(|o| o.apply)?;
    Some(SkipReason::RestartPinned {
        manager: applier.manager.clone(),
        kustomization: owners.kustomization.clone(),
    })
}

/// bouncer's last restart through the template, replaced since by a value another manager
/// owns that is no later restart (an earlier time, a time ahead of now, or no time at all).
fn reverted_since(w: &Workload, owners: &RestartOwners, now: DateTime<Utc>) -> Option<SkipReason> {
    let latest = match &w.attempt {
        AttemptMark::Seen(h) => h.latest()?,
        _ => return None,
    };
    // A rollout's mark keeps `Started` once verified (it rode on the patch); a revert already
    // found in its own run was told then.
    let ours = latest.method == Method::Rollout
        && matches!(
            latest.outcome,
            AttemptOutcome::Started | AttemptOutcome::Bounced
        );
    if !ours {
        return None;
    }
    let written = rfc3339(whole_seconds(latest.time));
    let found = w.restarted_at.map(rfc3339);
    if found.as_deref() == Some(written.as_str())
        || found
            .as_deref()
            .is_some_and(|f| supersedes(f, &written, now))
    {
        return None;
    }
    // Prefer an applier: it is the one that will write its value back again.
    let by = owners
        .owners
        .iter()
        .find(|o| o.apply)
        .or(owners.owners.first())?;
    Some(SkipReason::RevertedSince {
        manager: by.manager.clone(),
        written,
        found,
    })
}
