//! Bin edges of a numeric column with more distinct values than bins:
//! equal-width (from the column's range) or quantile (from a sample).

use crate::map::Bin;

/// How the bins of a column with many distinct values are cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Binning {
    /// Bins of equal width over `[min, max]` (integer widths for integer columns).
    #[default]
    EqualWidth,
    /// Bins holding about equally many rows, cut at quantiles of a sample of the column.
    Quantile,
}

/// The first value above `max`: the end of the last bin.
fn top(max: f64, integer: bool) -> f64 {
    if integer { max + 1.0 } else { max.next_up() }
}

/// At most `n` equal-width bins covering `[min, max]`.
pub fn equal_width(min: f64, max: f64, integer: bool, n: usize) -> Vec<Bin> {
    let n = n.max(1);
    let mut edges: Vec<f64> = if integer {
        let span = max - min + 1.0;
        let width = (span / n as f64).ceil();
        let count = (span / width).ceil() as usize;
        // Every bin as wide as the others, the last one too.
        (0..=count).map(|i| min + i as f64 * width).collect()
    } else {
        let width = (max - min) / n as f64;
        (0..n).map(|i| min + i as f64 * width).collect()
    };
    edges.push(top(max, integer));
    bins_between(edges)
}

/// At most `n` bins cut at the quantiles of `sample` (values of the column
/// between `min` and `max`); sorts `sample`.
pub fn quantile(sample: &mut [f64], min: f64, max: f64, integer: bool, n: usize) -> Vec<Bin> {
    let n = n.max(1);
    sample.sort_unstable_by(f64::total_cmp);
    let mut edges = vec![min];
    edges.extend((1..n).map(|i| sample[i * sample.len() / n]));
    edges.push(top(max, integer));
    bins_between(edges)
}

/// The bins between consecutive edges, skipping edges that do not ascend.
fn bins_between(edges: Vec<f64>) -> Vec<Bin> {
    let mut kept: Vec<f64> = Vec::with_capacity(edges.len());
    for edge in edges {
        if kept.last().is_none_or(|&last| edge > last) {
            kept.push(edge);
        }
    }
    kept.windows(2)
        .map(|w| Bin { lo: w[0], hi: w[1] })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(bins: &[Bin]) -> Vec<(f64, f64)> {
        bins.iter().map(|b| (b.lo, b.hi)).collect()
    }

    #[test]
    fn integer_bins_have_integer_edges_and_cover_the_range() {
        let bins = equal_width(18.0, 90.0, true, 64);
        assert_eq!(bins.len(), 37);
        assert_eq!(pairs(&bins[..2]), [(18.0, 20.0), (20.0, 22.0)]);
        assert_eq!(bins.last().unwrap().hi, 92.0);
        assert_eq!(pairs(&equal_width(0.0, 9.0, true, 5)).len(), 5);
    }

    #[test]
    fn float_bins_end_just_above_the_largest_value() {
        let bins = equal_width(0.0, 1.0, false, 4);
        assert_eq!(bins.len(), 4);
        assert_eq!(bins[1], Bin { lo: 0.25, hi: 0.5 });
        let last = bins.last().unwrap();
        assert!(last.lo <= 1.0 && 1.0 < last.hi);
    }

    #[test]
    fn quantile_bins_follow_the_data_and_never_repeat_an_edge() {
        let mut sample: Vec<f64> = (0..100)
            .map(|i| if i < 90 { 1.0 } else { i as f64 })
            .collect();
        let bins = quantile(&mut sample, 1.0, 99.0, true, 10);
        assert_eq!(bins[0].lo, 1.0);
        assert!(
            bins.windows(2)
                .all(|w| w[0].hi == w[1].lo && w[0].lo < w[0].hi)
        );
        assert_eq!(bins.last().unwrap().hi, 100.0);
        assert!(
            bins.len() < 10,
            "the repeated 1s collapse into one bin: {bins:?}"
        );
    }
}
