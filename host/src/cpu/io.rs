//! The executor's data in and out, between runs: input shards loaded into every device's
//! buffers (checked against the plan first), NaN poison in the outputs and workspaces, and the
//! output shards and exclusive workspaces read back.

use std::sync::atomic::Ordering;

use super::{CpuExecutor, ExclusiveState, ExecError};
use crate::dtype::Element;
use crate::plan::{DeviceInputs, Fp8DeviceInputs, SizeError};
use crate::schedule::BufferKind;

impl<T: Element> CpuExecutor<T> {
    /// Copies every device's input shards in (see
    /// [`Plan::shard_inputs`](crate::plan::Plan::shard_inputs)): one per device, each with the
    /// sizes the plan gives the device's buffers.
    pub fn load_inputs(&mut self, shards: &[DeviceInputs<T>]) -> Result<(), ExecError> {
        self.check_inputs(shards)?;
        for (mem, inputs) in self.memory.iter().zip(shards) {
            mem.store_inputs(inputs);
        }
        Ok(())
    }

    /// The plan's operand type, for [`ExecError::OperandMismatch`].
    fn operand_name(&self) -> &'static str {
        match self.plan.problem.fp8 {
            Some(_) => "e4m3",
            None => self.plan.problem.dtype.name(),
        }
    }

    /// Copies every device's FP8 input shards and their scales in (see
    /// [`Plan::shard_fp8_inputs`](crate::plan::Plan::shard_fp8_inputs)): one per device, with
    /// the sizes the plan gives the device's buffers and, row-wise, one scale per row of its A
    /// and B shards.
    pub fn load_fp8_inputs(&mut self, shards: &[Fp8DeviceInputs<T>]) -> Result<(), ExecError> {
        let Some(fp8) = self.plan.problem.fp8 else {
            return Err(ExecError::OperandMismatch {
                plan: self.operand_name(),
                inputs: "e4m3",
            });
        };
        if shards.len() != self.plan.tp {
            return Err(ExecError::ShardCount {
                got: shards.len(),
                expected: self.plan.tp,
            });
        }
        for (dev, inputs) in self.plan.devices.iter().zip(shards) {
            let device = dev.device;
            let c_len = inputs.c.as_ref().map_or(0, Vec::len);
            let given = [
                (BufferKind::A, inputs.a.len()),
                (BufferKind::B, inputs.b.len()),
                (BufferKind::C, c_len),
            ];
            for (buffer, got) in given {
                let expected = dev.buffer_elements(buffer);
                if got != expected {
                    return Err(ExecError::InputSize {
                        device,
                        buffer,
                        got,
                        expected,
                    });
                }
            }
            let scales = if inputs.scales.mode() == fp8.scales {
                inputs.scales.validate(dev.shards.a.rows, dev.shards.b.rows)
            } else {
                Err(SizeError::ScaleMode {
                    got: inputs.scales.mode(),
                    expected: fp8.scales,
                })
            };
            scales.map_err(|source| ExecError::Scales { device, source })?;
        }
        for (mem, inputs) in self.memory.iter().zip(shards) {
            mem.store_fp8_inputs(inputs);
        }
        Ok(())
    }

    /// One input shard set per device, each with the sizes the plan gives its buffers.
    pub(super) fn check_inputs(&self, shards: &[DeviceInputs<T>]) -> Result<(), ExecError> {
        if self.plan.problem.fp8.is_some() {
            return Err(ExecError::OperandMismatch {
                plan: "e4m3",
                inputs: T::DTYPE.name(),
            });
        }
        if shards.len() != self.plan.tp {
            return Err(ExecError::ShardCount {
                got: shards.len(),
                expected: self.plan.tp,
            });
        }
        for (dev, inputs) in self.plan.devices.iter().zip(shards) {
            let empty = Vec::new();
            let given = [
                (BufferKind::A, &inputs.a),
                (BufferKind::B, &inputs.b),
                (BufferKind::C, inputs.c.as_ref().unwrap_or(&empty)),
            ];
            for (buffer, data) in given {
                let expected = dev.buffer_elements(buffer);
                if data.len() != expected {
                    return Err(ExecError::InputSize {
                        device: dev.device,
                        buffer,
                        got: data.len(),
                        expected,
                    });
                }
            }
        }
        Ok(())
    }

    /// Fills every output and workspace element with NaN, so that anything a run fails to write
    /// (or reads before it is written) shows up in the result.
    pub fn poison(&mut self) {
        for mem in &mut self.memory {
            for buffer in [BufferKind::D, BufferKind::Workspace] {
                mem.get_mut(buffer).fill(T::nan());
            }
            if let Some(fp8) = &mut mem.fp8 {
                fp8.poison();
            }
        }
    }

    /// Every device's output shard.
    #[must_use]
    pub fn outputs(&self) -> Vec<Vec<T>> {
        self.memory
            .iter()
            .map(|m| m.read(BufferKind::D).clone())
            .collect()
    }

    /// The global D assembled from the output shards.
    pub fn gathered_output(&self) -> Result<Vec<T>, SizeError> {
        self.plan.gather_output(&self.outputs())
    }

    /// Every device's barrier counter and flags (a run leaves all counters at 0).
    #[must_use]
    pub fn exclusive_state(&self) -> Vec<ExclusiveState> {
        self.exclusive
            .iter()
            .map(|e| ExclusiveState {
                counter: e.counter.load(Ordering::Acquire),
                flags: e.flags.iter().map(|f| f.load(Ordering::Acquire)).collect(),
            })
            .collect()
    }
}
