//! A turn on the cluster-wide ToolHive CRDs, shared by the test processes of one target dir.
//!
//! The CRDs differ between operator versions, so an operator of one version must not run while
//! another version's CRDs may be installed; operators of the same version watch namespaces of
//! their own and may run side by side. cargo-nextest runs every test in a process of its own, so
//! an in-process mutex cannot hold this: the turn lives in a file, guarded by an advisory lock,
//! naming the version and its holders. A holder whose process is gone (a test killed on timeout)
//! is dropped from the file by the next one that looks, so a killed test never blocks the rest.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::cluster::target_dir;

/// How often a waiting holder looks again.
const POLL: Duration = Duration::from_millis(500);

/// Held while an operator of `version` may run; dropping it gives the turn back.
#[derive(Debug)]
pub struct CrdTurn {
    dir: PathBuf,
    holder: String,
}

/// The file's content: the version whose CRDs are in use and who uses them (`PID:N`).
#[derive(Debug, Default, PartialEq)]
struct State {
    version: String,
    holders: Vec<String>,
}

impl State {
    fn parse(text: &str) -> Self {
        let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
        let version = lines.next().unwrap_or_default().to_string();
        Self {
            version,
            holders: lines.map(str::to_string).collect(),
        }
    }

    fn render(&self) -> String {
        let mut out = format!("{}\n", self.version);
        for h in &self.holders {
            out.push_str(h);
            out.push('\n');
        }
        out
    }

    /// Takes the turn for `version` if it is free or already that version's.
    fn take(&mut self, version: &str, holder: &str, alive: impl Fn(&str) -> bool) -> bool {
        self.holders.retain(|h| alive(h));
        if !self.holders.is_empty() && self.version != version {
            return false;
        }
        self.version = version.to_string();
        self.holders.push(holder.to_string());
        true
    }
}

fn alive(holder: &str) -> bool {
    holder
        .split(':')
        .next()
        .is_some_and(|pid| Path::new("/proc").join(pid).exists())
}

/// Runs `f` on the state file while holding its lock, writing back what `f` leaves.
fn with_state<T>(dir: &Path, f: impl FnOnce(&mut State) -> T) -> Result<T> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("state");
    let mut file: File = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    file.lock()
        .with_context(|| format!("locking {}", path.display()))?;
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    let mut state = State::parse(&text);
    let out = f(&mut state);
    file.set_len(0)?;
    file.rewind()?;
    file.write_all(state.render().as_bytes())?;
    Ok(out)
}

impl CrdTurn {
    /// Waits until no other version's operator runs, then holds the turn for `version`.
    pub async fn take(version: &str) -> Result<Self> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let dir = target_dir().join("toolhive-crd-turn");
        let holder = format!(
            "{}:{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        loop {
            if with_state(&dir, |s| s.take(version, &holder, alive))? {
                return Ok(Self { dir, holder });
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for CrdTurn {
    fn drop(&mut self) {
        let _ = with_state(&self.dir, |s| s.holders.retain(|h| h != &self.holder));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_version_shares_and_another_waits_until_every_holder_is_gone() {
        let all = |_: &str| true;
        let mut s = State::default();
        assert!(s.take("v0.44.0", "1:0", all));
        assert!(s.take("v0.44.0", "2:0", all));
        assert!(!s.take("v0.45.0", "3:0", all));
        s.holders.retain(|h| h != "1:0");
        assert!(!s.take("v0.45.0", "3:0", all));
        s.holders.clear();
        assert!(s.take("v0.45.0", "3:0", all));
        assert_eq!(State::parse(&s.render()), s);
    }

    #[test]
    fn a_dead_holder_does_not_block_another_version() {
        let mut s = State::parse("v0.44.0\n4194304:0\n");
        assert!(s.take("v0.45.0", "1:0", |h| h != "4194304:0"));
        assert_eq!(s.version, "v0.45.0");
        assert_eq!(s.holders, ["1:0"]);
    }

    #[test]
    fn only_a_running_process_is_a_holder() {
        assert!(alive(&format!("{}:7", std::process::id())));
        assert!(!alive("4194304:0"), "pid_max is at most 2^22");
    }
}
