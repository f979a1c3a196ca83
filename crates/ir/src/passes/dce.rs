//! Dead-code elimination: removes every op whose results reach no model output. Inputs and
//! parameters stay, used or not: they are the model's interface and checkpoint.

use super::{Pass, PassContext, PassError, PassStats};
use crate::{Graph, NodeKind};

/// The `dce` pass.
pub struct Dce;

impl Pass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }

    fn description(&self) -> &'static str {
        "remove ops whose results reach no output (inputs and parameters are kept)"
    }

    fn run(&self, g: &mut Graph, _cx: &PassContext) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        let ids = g.node_ids();
        let slots = ids.iter().map(|n| n.index()).max().map_or(0, |m| m + 1);
        let mut live = vec![false; slots];
        let mut stack: Vec<_> = g.outputs.iter().map(|(_, v)| v.node).collect();
        while let Some(n) = stack.pop() {
            if std::mem::replace(&mut live[n.index()], true) {
                continue;
            }
            stack.extend(g.inputs(n).into_iter().map(|v| v.node));
        }
        for id in ids {
            let is_op = matches!(g.node(id).kind, NodeKind::Op { .. });
            if is_op && !live[id.index()] {
                g.remove_node(id);
                stats.record(self.name(), "removed");
            }
        }
        Ok(stats)
    }
}
