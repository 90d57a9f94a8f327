//! Per-workload overrides: annotations on a workload that change, for that workload only, the
//! memory threshold and the cooldown of every policy that selects it. The policy file stays the
//! default; the team that owns a workload tunes it where the workload is defined.

use std::borrow::Cow;

use crate::core::literals::{
    COOLDOWN_ANNOTATION, MEMORY_ABOVE_ANNOTATION, PERCENT_OF_LIMIT_ANNOTATION,
};
use crate::core::model::Workload;
use crate::core::policy::{Policy, Threshold, bytes_value, duration_value, percent_value};
use crate::core::reasons::SkipReason;

/// `policy` as it applies to `w`: its threshold and cooldown replaced by the workload's
/// override annotations. A threshold override changes the threshold the policy's memory trigger
/// has; it adds none to a policy without one. A bad value is a skip naming the annotation, never a guess.
pub fn effective<'p>(policy: &'p Policy, w: &Workload) -> Result<Cow<'p, Policy>, SkipReason> {
    let get = |key: &'static str| w.annotations.get(key).map(|v| (key, v.trim()));
    let above = get(MEMORY_ABOVE_ANNOTATION);
    let percent = get(PERCENT_OF_LIMIT_ANNOTATION);
    let cooldown = get(COOLDOWN_ANNOTATION);
    if above.is_none() && percent.is_none() && cooldown.is_none() {
        return Ok(Cow::Borrowed(policy));
    }
    let invalid = |(key, value): (&str, &str), problem: String| SkipReason::InvalidOverride {
        annotation: key.to_string(),
        value: value.to_string(),
        problem,
    };
    let threshold = match (above, percent) {
        (Some(a), Some(_)) => {
            let problem = format!(
                "set one of {MEMORY_ABOVE_ANNOTATION} and {PERCENT_OF_LIMIT_ANNOTATION}, not both"
            );
            return Err(invalid(a, problem));
        }
        (Some(a), None) => Some(Threshold::Bytes(
            bytes_value(a.1).map_err(|p| invalid(a, p))?,
        )),
        (None, Some(p)) => {
            let number =
                p.1.parse::<f64>()
                    .map_err(|_| invalid(p, "not a number".into()))?;
            Some(Threshold::PercentOfLimit(
                percent_value(number).map_err(|e| invalid(p, e))?,
            ))
        }
        (None, None) => None,
    };
    let mut out = policy.clone();
    // Only a threshold the policy has: a history-only trigger (growth, predict to the limit)
    // gains no threshold trigger from an annotation.
    if let (Some(threshold), Some(memory)) = (threshold, out.memory.as_mut())
        && memory.threshold.is_some()
    {
        memory.threshold = Some(threshold);
    }
    if let Some(c) = cooldown {
        out.cooldown = duration_value(c.1).map_err(|p| invalid(c, p))?;
    }
    Ok(Cow::Owned(out))
}
