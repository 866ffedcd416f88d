//! The rendezvous of a TP group, implemented by a Python object.
//!
//! distgemm's per-rank builder exchanges a few hundred bytes among the ranks (IPC handles,
//! device UUIDs, the problem and schedule) through the [`Rendezvous`] trait. From Python the
//! group is a `torch.distributed` process group, so the exchange is a call back into Python:
//! `distgemm._rendezvous.GroupRendezvous.all_gather(bytes) -> list[bytes]`, which runs
//! `all_gather_object` on the group. The callback takes the GIL itself ([`Python::attach`]),
//! so the blocking Rust calls that reach it (build, teardown) run with the GIL released.

use distgemm::cuda::{Rendezvous, RendezvousError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// A [`Rendezvous`] whose collective is a Python object's `all_gather(bytes) -> list[bytes]`.
pub struct PyRendezvous {
    rank: usize,
    world_size: usize,
    group: Py<PyAny>,
}

impl PyRendezvous {
    /// Wraps `group`, reading its `rank` and `world_size` attributes once.
    pub fn new(group: &Bound<'_, PyAny>) -> PyResult<Self> {
        let rank: usize = group.getattr("rank")?.extract()?;
        let world_size: usize = group.getattr("world_size")?.extract()?;
        if rank >= world_size {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "rendezvous: rank {rank} is not below world_size {world_size}"
            )));
        }
        Ok(PyRendezvous {
            rank,
            world_size,
            group: group.clone().unbind(),
        })
    }

    fn call_all_gather(&self, py: Python<'_>, mine: &[u8]) -> PyResult<Vec<Vec<u8>>> {
        let reply = self
            .group
            .call_method1(py, "all_gather", (PyBytes::new(py, mine),))?;
        let parts: Vec<Vec<u8>> = reply.extract(py)?;
        Ok(parts)
    }
}

impl Rendezvous for PyRendezvous {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, RendezvousError> {
        let parts = Python::attach(|py| self.call_all_gather(py, mine))
            .map_err(|e| RendezvousError::new(format!("the Python all_gather failed: {e}")))?;
        if parts.len() != self.world_size {
            return Err(RendezvousError::new(format!(
                "the Python all_gather returned {} parts for a group of {} ranks",
                parts.len(),
                self.world_size
            )));
        }
        if parts[self.rank] != mine {
            return Err(RendezvousError::new(format!(
                "the Python all_gather returned other bytes at this rank's index {} than it was \
                 given: the group's rank order differs from the rank it reported",
                self.rank
            )));
        }
        Ok(parts)
    }
}
