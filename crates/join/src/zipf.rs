//! Zipf-distributed ranks for skewed test and benchmark workloads (in Rödiger's
//! Flow-Join experiments the probe keys are Zipf-distributed over the build keys, z =
//! 1.25 in the skew experiments).
//!
//! Rejection-inversion sampling (Hörmann and Derflinger, 1996): O(1) time and memory per
//! draw for any number of ranks, so 16 M draws over 16 M keys need no CDF table.

use rand::Rng;

/// Samples ranks `1..=n` with P(k) proportional to k^-s (s > 0).
#[derive(Debug, Clone)]
pub struct Zipf {
    n: f64,
    s: f64,
    h_x1: f64,
    h_n: f64,
    shortcut: f64,
}

/// (exp(x) - 1) / x, accurate near 0.
fn expm1_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x / 2.0 + x * x / 6.0
    }
}

/// ln(1 + x) / x, accurate near 0.
fn ln1p_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x / 2.0 + x * x / 3.0
    }
}

impl Zipf {
    /// `n >= 1` ranks with exponent `s > 0`.
    pub fn new(n: u64, s: f64) -> Self {
        assert!(n >= 1, "Zipf needs at least one rank");
        assert!(s > 0.0 && s.is_finite(), "Zipf exponent must be positive");
        let mut z = Zipf {
            n: n as f64,
            s,
            h_x1: 0.0,
            h_n: 0.0,
            shortcut: 0.0,
        };
        z.h_x1 = z.h_integral(1.5) - 1.0;
        z.h_n = z.h_integral(z.n + 0.5);
        z.shortcut = 2.0 - z.h_integral_inv(z.h_integral(2.5) - z.h(2.0));
        z
    }

    /// x^-s
    fn h(&self, x: f64) -> f64 {
        (-self.s * x.ln()).exp()
    }

    /// Integral of h: (x^(1-s) - 1) / (1 - s), continuous through s = 1.
    fn h_integral(&self, x: f64) -> f64 {
        let lx = x.ln();
        expm1_over_x((1.0 - self.s) * lx) * lx
    }

    fn h_integral_inv(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.s)).max(-1.0);
        (ln1p_over_x(t) * x).exp()
    }

    /// One rank in `1..=n`.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        loop {
            let u = self.h_n + rng.random::<f64>() * (self.h_x1 - self.h_n);
            let x = self.h_integral_inv(u);
            let k = (x + 0.5).floor().clamp(1.0, self.n);
            if k - x <= self.shortcut || u >= self.h_integral(k + 0.5) - self.h(k) {
                return k as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    #[test]
    fn frequencies_follow_the_power_law() {
        let z = Zipf::new(1000, 1.25);
        let mut rng = SmallRng::seed_from_u64(7);
        let mut counts = vec![0u64; 1001];
        let draws = 200_000;
        for _ in 0..draws {
            let k = z.sample(&mut rng);
            assert!((1..=1000).contains(&k));
            counts[k as usize] += 1;
        }
        let norm: f64 = (1..=1000).map(|k| (k as f64).powf(-1.25)).sum();
        for k in [1usize, 2, 5, 10] {
            let expected = draws as f64 * (k as f64).powf(-1.25) / norm;
            let got = counts[k] as f64;
            assert!(
                (got - expected).abs() < 0.05 * expected + 50.0,
                "rank {k}: {got} vs {expected}"
            );
        }
    }

    #[test]
    fn exponent_one_and_single_rank_work() {
        let mut rng = SmallRng::seed_from_u64(1);
        let z = Zipf::new(10, 1.0);
        assert!((0..1000).all(|_| (1..=10).contains(&z.sample(&mut rng))));
        let z = Zipf::new(1, 2.0);
        assert!((0..100).all(|_| z.sample(&mut rng) == 1));
    }
}
