//! One copy of the values thousands of pods repeat: their label maps (once only the labels the
//! policies and budgets read are kept, a map is shared by every pod of a workload, and often by
//! the same app's pods in every namespace) and their container names.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

pub type Labels = Arc<BTreeMap<String, String>>;

/// The values handed out so far; a pod's are looked up here and shared when equal.
#[derive(Debug, Default)]
pub struct Shared {
    labels: BTreeSet<Labels>,
    names: BTreeSet<Arc<str>>,
}

impl Shared {
    pub fn labels(&mut self, labels: BTreeMap<String, String>) -> Labels {
        if let Some(same) = self.labels.get(&labels) {
            return Arc::clone(same);
        }
        let labels = Arc::new(labels);
        self.labels.insert(Arc::clone(&labels));
        labels
    }

    pub fn name(&mut self, name: &str) -> Arc<str> {
        if let Some(same) = self.names.get(name) {
            return Arc::clone(same);
        }
        let name: Arc<str> = Arc::from(name);
        self.names.insert(Arc::clone(&name));
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_are_one_allocation_and_different_ones_stay_apart() {
        let mut shared = Shared::default();
        let web = || BTreeMap::from([("app".to_string(), "web".to_string())]);
        let (a, b) = (shared.labels(web()), shared.labels(web()));
        assert!(Arc::ptr_eq(&a, &b));
        let db = shared.labels(BTreeMap::from([("app".to_string(), "db".to_string())]));
        assert_eq!(db["app"], "db");
        assert!(!Arc::ptr_eq(&a, &db));
        let (x, y, z) = (shared.name("app"), shared.name("app"), shared.name("proxy"));
        assert!(Arc::ptr_eq(&x, &y));
        assert_eq!((&*x, &*z), ("app", "proxy"));
    }
}
