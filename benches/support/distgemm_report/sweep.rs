//! The token sweep's points and its verdicts: where pipelining stops paying, and whether
//! `Auto` follows.

use distgemm::schedule::ScheduleKind;
use serde::Serialize;
use std::collections::BTreeMap;

use super::NOISE;

#[derive(Debug, Clone, Default, Serialize)]
pub struct SweepPoint {
    pub preset: String,
    pub tp: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub dtype: String,
    /// The family judged (the preset's natural one: `ag-a` for fc1, `rs-a` for fc2).
    pub family: String,
    /// Every fixed schedule's distgemm time (null: not measured, see `missing`).
    pub schedules_ms: BTreeMap<String, Option<f64>>,
    /// Fastest pipelined schedule of any family.
    pub best_pipelined: Option<String>,
    pub best_pipelined_ms: Option<f64>,
    /// The family's pipelined and single-stage schedules.
    pub family_pipelined_ms: Option<f64>,
    pub family_single_stage_ms: Option<f64>,
    /// What `Auto` picks for the family, and that schedule's time.
    pub auto_choice: Option<String>,
    pub auto_ms: Option<f64>,
    /// (e) for the family's collective.
    pub nccl_cublas_variant: String,
    pub nccl_cublas_ms: Option<f64>,
    /// The family's pipelined schedule beats both its single-stage variant and (e).
    pub pipelining_pays: Option<bool>,
    /// `Auto` is within 3 % of the fastest of: the family's two schedules and (e).
    pub auto_follows: Option<bool>,
    pub missing: BTreeMap<String, String>,
    pub machine: String,
    pub commit: String,
    pub date: String,
}

impl SweepPoint {
    /// Fills the best-of and verdict fields from `schedules_ms`, `auto_choice` and
    /// `nccl_cublas_ms`.
    pub fn derive(&mut self) {
        let time = |name: &str| self.schedules_ms.get(name).copied().flatten();
        self.best_pipelined = None;
        self.best_pipelined_ms = None;
        if let Some((t, name)) = ScheduleKind::ALL
            .iter()
            .filter(|k| k.is_pipelined())
            .filter_map(|k| time(k.cli_name()).map(|t| (t, k.cli_name())))
            .min_by(|a, b| a.0.total_cmp(&b.0))
        {
            self.best_pipelined_ms = Some(t);
            self.best_pipelined = Some(name.to_owned());
        }
        let family = ScheduleKind::ALL
            .iter()
            .find(|k| k.cli_name() == self.family)
            .copied();
        self.family_pipelined_ms = family.and_then(|f| time(f.pipelined().cli_name()));
        self.family_single_stage_ms = family.and_then(|f| time(f.single_stage().cli_name()));
        self.auto_ms = self.auto_choice.as_deref().and_then(time);
        let alternative = [self.family_single_stage_ms, self.nccl_cublas_ms]
            .into_iter()
            .flatten()
            .fold(f64::INFINITY, f64::min);
        self.pipelining_pays = match self.family_pipelined_ms {
            Some(p) if alternative.is_finite() => Some(p < alternative),
            _ => None,
        };
        let fastest = alternative.min(self.family_pipelined_ms.unwrap_or(f64::INFINITY));
        self.auto_follows = match self.auto_ms {
            Some(a) if fastest.is_finite() => Some(a <= NOISE * fastest),
            _ => None,
        };
    }
}

/// The smallest M from which pipelining pays at every larger measured M (None if it never
/// does at the largest M). Points must be sorted by M.
pub fn pipelining_threshold(points: &[(usize, Option<bool>)]) -> Option<usize> {
    let mut threshold = None;
    for &(m, pays) in points.iter().rev() {
        match pays {
            Some(true) => threshold = Some(m),
            Some(false) => break,
            None => continue,
        }
    }
    threshold
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_verdicts() {
        let mut p = SweepPoint {
            family: "ag-a".into(),
            ..Default::default()
        };
        p.schedules_ms.insert("ag-a".into(), Some(10.0));
        p.schedules_ms.insert("ag-b".into(), Some(9.0));
        p.schedules_ms.insert("ag-a-single".into(), Some(10.5));
        p.schedules_ms.insert("rs-a".into(), None);
        p.nccl_cublas_ms = Some(12.0);
        p.auto_choice = Some("ag-a".into());
        p.derive();
        assert_eq!(p.best_pipelined.as_deref(), Some("ag-b"));
        assert_eq!(p.family_pipelined_ms, Some(10.0));
        assert_eq!(p.family_single_stage_ms, Some(10.5));
        assert_eq!((p.pipelining_pays, p.auto_ms), (Some(true), Some(10.0)));
        assert_eq!(p.auto_follows, Some(true));
        p.auto_choice = Some("ag-a-single".into());
        p.derive();
        assert_eq!(p.auto_follows, Some(false));
        p.nccl_cublas_ms = Some(9.5);
        p.derive();
        assert_eq!(p.pipelining_pays, Some(false));

        assert_eq!(
            pipelining_threshold(&[
                (256, Some(false)),
                (512, Some(true)),
                (1024, Some(false)),
                (2048, Some(true)),
                (4096, None),
                (8192, Some(true)),
            ]),
            Some(2048)
        );
        assert_eq!(
            pipelining_threshold(&[(256, Some(true)), (512, Some(false))]),
            None
        );
        assert_eq!(pipelining_threshold(&[(256, None)]), None);
    }
}
