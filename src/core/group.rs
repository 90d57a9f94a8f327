//! Restart groups (`spec.target.groupBy`): the workloads one policy selects in one namespace
//! whose pod templates share the label's value are bounced as one, in an order that restarts
//! what the others connect to first.

use std::fmt;

use crate::core::model::{Kind, Workload};
use crate::core::policy::Policy;
use crate::core::reasons::SkipReason;

/// A group, named by its label and value (the namespace is the members').
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Group {
    pub label: String,
    pub value: String,
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.label, self.value)
    }
}

/// The group `w` belongs to under `policy`; None when the policy does not group or the pod
/// template lacks the label (such a workload is bounced alone).
pub fn of(policy: &Policy, w: &Workload) -> Option<Group> {
    let label = policy.group_by.as_ref()?;
    let value = w.template_labels.get(label)?;
    Some(Group {
        label: label.clone(),
        value: value.clone(),
    })
}

/// The order inside a group. StatefulSets first: they hold the state and serve the others (a
/// ToolHive MCP server's backend behind its proxy Deployment), and a client restarted after its
/// backend connects to the new one instead of holding a connection to a pod that is gone.
pub fn rank(kind: Kind) -> u8 {
    match kind {
        Kind::StatefulSet => 0,
        Kind::Deployment => 1,
        Kind::DaemonSet => 2,
        Kind::Pod => 3,
    }
}

/// Skips that leave a workload out of its group instead of holding the group: the policy does
/// not bounce its kind, or it has no pods to restart. Any other reason a member cannot be bounced
/// (an opt-out, a cooldown, a rollout in progress...) holds the whole group.
pub fn leaves_out(reason: &SkipReason) -> bool {
    matches!(
        reason,
        SkipReason::KindNotSelected { .. } | SkipReason::NoPods
    )
}
