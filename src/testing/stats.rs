//! Summaries the benches print (p50/p99 and the like), computed one way everywhere.

/// The `p` quantile (0.0 ..= 1.0) of sorted samples: the sample at the rounded rank
/// `(len - 1) × p` (nearest rank; no interpolation between samples). Panics on no samples.
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> T {
    assert!(!sorted.is_empty(), "percentile of no samples");
    let i = ((sorted.len() as f64 - 1.0) * p.clamp(0.0, 1.0)).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The median (upper middle) of unsorted samples.
pub fn median(mut v: Vec<std::time::Duration>) -> std::time::Duration {
    v.sort();
    v[v.len() / 2]
}

/// A duration in milliseconds, for printing.
pub fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn nearest_rank_of_sorted_samples() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 51);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&v, 1.0), 100);
        assert_eq!(percentile(&[7.5], 0.99), 7.5);
    }
}
