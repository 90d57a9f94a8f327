//! Stamps the build for `bouncer version`: the git commit (when built from a checkout, else
//! BUILD_GIT_COMMIT, else "unknown"), the build date (SOURCE_DATE_EPOCH for reproducible builds,
//! else now) and the Kubernetes API version k8s-openapi was built for.

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

fn main() {
    println!("cargo::rerun-if-env-changed=BUILD_GIT_COMMIT");
    println!("cargo::rerun-if-env-changed=SOURCE_DATE_EPOCH");
    // Rebuild the stamp when the checked-out commit moves (HEAD, or the branch it points at).
    for path in ["HEAD", "packed-refs"] {
        if let Some(p) = git(&["rev-parse", "--git-path", path]) {
            println!("cargo::rerun-if-changed={p}");
        }
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(p) = git(&["rev-parse", "--git-path", &branch])
    {
        println!("cargo::rerun-if-changed={p}");
    }
    let commit = std::env::var("BUILD_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    let epoch = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64)
        });
    let (y, m, d) = civil(epoch.div_euclid(86_400));
    let secs = epoch.rem_euclid(86_400);
    let date = format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    );
    // k8s-openapi publishes the version its feature selected as links metadata:
    // 0x00_01_MM_00 for 1.MM.
    let kubernetes = std::env::vars()
        .find(|(k, _)| k.starts_with("DEP_K8S_OPENAPI_") && k.ends_with("_VERSION"))
        .and_then(|(_, v)| v.parse::<u32>().ok())
        .map_or_else(
            || "unknown".into(),
            |v| format!("{}.{}", (v >> 16) & 0xff, (v >> 8) & 0xff),
        );
    println!("cargo::rustc-env=BUILD_GIT_COMMIT={commit}");
    println!("cargo::rustc-env=BUILD_DATE={date}");
    println!("cargo::rustc-env=BUILD_KUBERNETES_API={kubernetes}");
}
