//! `bouncer version`: what this binary is, stamped at build time by `build.rs`.

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Version {
    pub version: &'static str,
    pub git_commit: &'static str,
    pub build_date: &'static str,
    /// The Kubernetes API version of the k8s-openapi types it was built with.
    pub kubernetes_api: &'static str,
}

pub const VERSION: Version = Version {
    version: env!("CARGO_PKG_VERSION"),
    git_commit: env!("BUILD_GIT_COMMIT"),
    build_date: env!("BUILD_DATE"),
    kubernetes_api: env!("BUILD_KUBERNETES_API"),
};

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "bouncer {}", self.version)?;
        writeln!(f, "git commit:     {}", self.git_commit)?;
        writeln!(f, "build date:     {}", self.build_date)?;
        writeln!(f, "Kubernetes API: {}", self.kubernetes_api)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stamp_is_complete() {
        assert_eq!(VERSION.version, env!("CARGO_PKG_VERSION"));
        // The API version follows the k8s-openapi feature in Cargo.toml.
        let manifest = include_str!("../../Cargo.toml");
        let feature = format!(
            "features = [\"v{}\"]",
            VERSION.kubernetes_api.replace('.', "_")
        );
        assert!(manifest.contains(&feature), "{feature}");
        assert!(
            chrono::DateTime::parse_from_rfc3339(VERSION.build_date).is_ok(),
            "{}",
            VERSION.build_date
        );
        assert!(!VERSION.git_commit.is_empty());
        let text = VERSION.to_string();
        assert!(
            text.starts_with(&format!("bouncer {}\n", VERSION.version)),
            "{text}"
        );
    }
}
