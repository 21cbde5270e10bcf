//! Statistics shared by the benchmarks (and the chaos soak): one nearest-rank percentile.

use std::time::Duration;

/// `d` in milliseconds (fractional).
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Nearest-rank percentile `p` (0..=100) of `values` (any order); `None` when empty.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v.get(rank.clamp(1, v.len()) - 1).copied()
}

/// `p50 X ms, p95 Y ms, max Z ms (n=N)` for millisecond values, or `no values`.
pub fn summary_ms(values: &[f64]) -> String {
    match (
        percentile(values, 50.0),
        percentile(values, 95.0),
        percentile(values, 100.0),
    ) {
        (Some(a), Some(b), Some(c)) => {
            format!(
                "p50 {a:.0} ms, p95 {b:.0} ms, max {c:.0} ms (n={})",
                values.len()
            )
        }
        _ => "no values".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(10.0));
        assert_eq!(percentile(&v, 95.0), Some(19.0));
        assert_eq!(percentile(&v, 100.0), Some(20.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&[], 50.0), None);
        let unsorted = [5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(percentile(&unsorted, 50.0), Some(3.0));
        assert_eq!(percentile(&unsorted, 95.0), Some(5.0));
        let many: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&many, 95.0), Some(95.0));
    }
}
