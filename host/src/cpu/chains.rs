//! Splitting a device DAG into chains that run concurrently (the CPU analogue of a CUDA graph's
//! independent branches): a node joins the chain of its first predecessor when it is that
//! chain's tail, otherwise it starts a new chain. Other dependencies are waited for explicitly.

use crate::plan::DevicePlan;

/// Chains of node indices, each in topological order; chain 0 starts with node 0.
#[must_use]
pub(crate) fn chains(dev: &DevicePlan) -> Vec<Vec<usize>> {
    let mut chains: Vec<Vec<usize>> = Vec::new();
    for node in 0..dev.nodes.len() {
        let extend = dev
            .predecessors(node)
            .next()
            .and_then(|(pred, _)| chains.iter().position(|c| c.last() == Some(&pred)));
        match extend {
            Some(c) => chains[c].push(node),
            None => chains.push(vec![node]),
        }
    }
    chains
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Plan;
    use crate::problem::Problem;
    use crate::schedule::ScheduleKind;

    #[test]
    fn all_gather_has_a_copy_chain_and_a_gemm_chain() {
        let plan = Plan::build(
            ScheduleKind::AllGatherRotatingA,
            Problem::new(64, 64, 64),
            4,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let c = chains(&plan.devices[0]);
        assert_eq!(c.len(), 2);
        // The barrier, then per peer a copy, its stage flag and the peer's release flag.
        assert_eq!(c[0].len(), 1 + 3 * 3);
        // The stage GEMMs, then the release wait (which also waits for chain 0's tail).
        assert_eq!(c[1].len(), 4 + 1);
        let rs = Plan::build(
            ScheduleKind::ReduceScatterTilingA,
            Problem::new(64, 64, 64),
            4,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(chains(&rs.devices[0]).len(), 1);
    }
}
