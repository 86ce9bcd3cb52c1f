//! Device scratch of the libraries the CUDA executors call (cuBLASLt's and cuDNN's workspaces):
//! one buffer per live stream, so that runs on several streams (each plan workspace queues on
//! its own) never share one.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::device::cuda_error;
use crate::error::Result;

/// `(stream, buffer)` pairs, one per stream a library ran on.
#[derive(Default)]
pub(crate) struct StreamWorkspaces {
    buffers: Vec<(usize, CudaSlice<u8>)>,
}

impl StreamWorkspaces {
    /// The buffer of `stream`, of at least `bytes` (at least 1), made (or grown) the first time
    /// a run on that stream needs it. Buffers of streams nobody else holds any more (their plan
    /// workspaces were dropped) are freed first, ordered after their stream's work, so there is
    /// one per live stream.
    pub fn get(&mut self, stream: &Arc<CudaStream>, bytes: usize) -> Result<&CudaSlice<u8>> {
        let key = stream.cu_stream() as usize;
        let bytes = bytes.max(1);
        let fits = self.buffers.iter().any(|(s, b)| *s == key && b.len() >= bytes);
        if !fits {
            self.buffers.retain(|(s, b)| *s != key && Arc::strong_count(b.stream()) > 1);
            // SAFETY: the libraries only write their workspace; it needs no initial value.
            let buffer = unsafe { stream.alloc::<u8>(bytes) }.map_err(|e| cuda_error("workspace", e))?;
            self.buffers.push((key, buffer));
        }
        let found = self.buffers.iter().find(|(s, _)| *s == key).map(|(_, b)| b);
        found.ok_or_else(|| cuda_error("workspace", "missing"))
    }
}
