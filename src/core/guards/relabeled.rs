//! A guard shown under another label: what `passes::Grad` puts around the backward of an op
//! for guards that answer [`OnBackward::Relabeled`](super::OnBackward::Relabeled).

use std::sync::Arc;

use super::{Guard, GuardKind, GuardPolicy, GuardSite, ScopedGuard};
use crate::error::Result;

/// `inner`, prepared at each site as if the site's label were `label`.
pub(crate) struct Relabeled {
    pub inner: Arc<dyn Guard>,
    pub label: String,
}

impl Guard for Relabeled {
    fn kind(&self) -> GuardKind {
        self.inner.kind()
    }

    fn policy(&self) -> GuardPolicy {
        self.inner.policy()
    }

    fn is_profiling(&self) -> bool {
        self.inner.is_profiling()
    }

    fn label(&self) -> Option<&str> {
        Some(&self.label)
    }

    fn merge_key(&self) -> Option<String> {
        self.inner.merge_key()
    }

    fn nvtx_domain(&self) -> Option<&str> {
        self.inner.nvtx_domain()
    }

    fn prepare(&self, site: &GuardSite<'_>) -> Result<Box<dyn ScopedGuard>> {
        self.inner.prepare(&GuardSite { label: &self.label, ..*site })
    }
}
