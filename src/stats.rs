//! The statistics the benchmark reports use: medians, ranges and bootstrap intervals.

/// Median, minimum and maximum; `None` for no values.
pub fn spread(v: &[f64]) -> Option<(f64, f64, f64)> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let med = match n {
        0 => return None,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    };
    Some((med, v[0], v[n - 1]))
}

/// The median; `None` for no values.
pub fn median(v: &[f64]) -> Option<f64> {
    spread(v).map(|s| s.0)
}

/// 95% percentile-bootstrap interval of the median of `v` (2,000 resamples, a fixed
/// seed so a report prints the same every time), from 5 values on: how precisely the
/// runs pin a paired ratio down, where [min-max] shows how far single runs stray.
pub fn median_interval(v: &[f64]) -> Option<(f64, f64)> {
    use rand::{Rng, SeedableRng};
    const RESAMPLES: usize = 2000;
    if v.len() < 5 {
        return None;
    }
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x5EED);
    let mut sample = vec![0.0; v.len()];
    let mut medians: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            for x in sample.iter_mut() {
                *x = v[rng.random_range(0..v.len())];
            }
            median(&sample).unwrap_or(f64::NAN)
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    Some((
        medians[RESAMPLES / 40],
        medians[RESAMPLES - 1 - RESAMPLES / 40],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_ranges_and_intervals() {
        assert_eq!(spread(&[3.0, 1.0, 2.0, 4.0]), Some((2.5, 1.0, 4.0)));
        assert_eq!(spread(&[]), None);
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        // The bootstrap interval: none from fewer than 5 runs; it holds the median, lies
        // within [min, max], and narrows with more runs of the same spread.
        assert_eq!(median_interval(&[1.0, 1.1, 0.9, 1.0]), None);
        let few = [0.9, 1.2, 1.0, 1.1, 0.95, 1.05, 1.0];
        let many: Vec<f64> = few.iter().cycle().take(70).copied().collect();
        let (a, b) = median_interval(&few).unwrap();
        let (c, d) = median_interval(&many).unwrap();
        assert!(
            (0.9..=1.0).contains(&a) && (1.0..=1.2).contains(&b),
            "{a} {b}"
        );
        assert!(
            c <= 1.0 && 1.0 <= d && d - c < b - a,
            "{c} {d} against {a} {b}"
        );
    }
}
