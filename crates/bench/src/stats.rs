//! Statistics of the benchmark: percentiles, per-metric summaries, ratios.

use serde::{Deserialize, Serialize};

/// Linear-interpolated percentile (numpy's default), `p` in [0, 100].
/// `None` for an empty input.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    if v.len() == 1 {
        return Some(v[0]);
    }
    let k = (v.len() - 1) as f64 * (p.clamp(0.0, 100.0) / 100.0);
    let lo = k.floor() as usize;
    let hi = (lo + 1).min(v.len() - 1);
    Some(v[lo] + (v[hi] - v[lo]) * (k - lo as f64))
}

pub fn median(values: &[f64]) -> Option<f64> {
    percentile(values, 50.0)
}

pub fn p90(values: &[f64]) -> Option<f64> {
    percentile(values, 90.0)
}

pub fn mean(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        None
    } else {
        Some(values.iter().sum::<f64>() / values.len() as f64)
    }
}

pub fn geomean(values: &[f64]) -> Option<f64> {
    if values.is_empty() || values.iter().any(|v| *v <= 0.0) {
        None
    } else {
        Some((values.iter().map(|v| v.ln()).sum::<f64>() / values.len() as f64).exp())
    }
}

/// Median, p90 and count of one metric.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub median: f64,
    pub p90: f64,
    pub n: usize,
}

impl Summary {
    pub fn of(values: &[f64]) -> Option<Summary> {
        Some(Summary { median: median(values)?, p90: p90(values)?, n: values.len() })
    }
}

/// `base / new`: how many times faster `new` is than `base` (e.g. lazy / prefetch).
pub fn speedup(base: f64, new: f64) -> Option<f64> {
    (base > 0.0 && new > 0.0).then(|| base / new)
}

/// Share of `base` removed by `new` (1.0 = all of it), e.g. fault reduction.
pub fn reduction(base: f64, new: f64) -> Option<f64> {
    (base > 0.0).then(|| 1.0 - new / base)
}

/// Relative overhead of `new` over `base` (0.28 = +28%).
pub fn overhead(base: f64, new: f64) -> Option<f64> {
    (base > 0.0).then(|| new / base - 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn percentiles_of_known_vectors() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(p90(&[7.0]), Some(7.0));
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        // 1..=10: numpy.percentile(range(1, 11), 90) == 9.1
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert!(close(p90(&v).unwrap(), 9.1));
        assert!(close(median(&v).unwrap(), 5.5));
        assert!(close(percentile(&v, 0.0).unwrap(), 1.0));
        assert!(close(percentile(&v, 100.0).unwrap(), 10.0));
        // order does not matter; NaN is ignored
        assert!(close(p90(&[10.0, 1.0, 5.0, f64::NAN, 2.0, 3.0]).unwrap(), 8.0));
        let s = Summary::of(&[5.0, 1.0, 4.0, 2.0, 3.0]).unwrap();
        assert_eq!(s, Summary { median: 3.0, p90: 4.6, n: 5 });
    }

    #[test]
    fn ratios() {
        assert!(close(speedup(37.0, 10.0).unwrap(), 3.7));
        assert_eq!(speedup(1.0, 0.0), None);
        assert!(close(reduction(1000.0, 50.0).unwrap(), 0.95));
        assert!(close(reduction(10.0, 0.0).unwrap(), 1.0));
        assert_eq!(reduction(0.0, 0.0), None);
        assert!(close(overhead(100.0, 128.0).unwrap(), 0.28));
        assert!(close(mean(&[2.0, 4.0]).unwrap(), 3.0));
        assert!(close(geomean(&[2.0, 8.0]).unwrap(), 4.0));
        assert_eq!(geomean(&[]), None);
    }
}
