//! Choosing the next token from a row of logits: greedy (arg max) or sampled with temperature,
//! top-k and top-p (nucleus), from a small self-contained PRNG so that a seeded request draws the
//! same tokens on every run, whatever else runs in the same batch.

/// How one sequence picks its tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy; otherwise logits are divided by it before the softmax.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0: all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probabilities add up to `top_p` (1: all).
    pub top_p: f32,
    /// Seed of the sequence's random numbers; `None` draws one from the process.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding: temperature 0, or only one candidate left.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }
}

/// xoshiro256** seeded through SplitMix64: fast, small, and good enough for sampling.
#[derive(Debug, Clone)]
pub struct Rng {
    state: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            state: [next(), next(), next(), next()],
        }
    }

    /// A seed for a request that gave none: different for every call in the process.
    pub fn fresh_seed() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        nanos
            ^ COUNTER
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.state;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Picks tokens for one sequence.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let rng = Rng::new(params.seed.unwrap_or_else(Rng::fresh_seed));
        Sampler { params, rng }
    }

    /// The next token for `logits` (one row, vocabulary-sized).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.is_greedy() {
            return argmax(logits);
        }
        let candidates = candidates(logits, &self.params);
        let draw = self.rng.next_f64();
        pick(&candidates, draw)
    }
}

/// The natural log-probability of `token` under the softmax of `logits` (NaN and infinite logits
/// count for nothing); negative infinity for a token outside the row or that cannot be drawn.
pub fn logprob(logits: &[f32], token: u32) -> f32 {
    let Some(&chosen) = logits.get(token as usize) else {
        return f32::NEG_INFINITY;
    };
    let finite = || logits.iter().copied().filter(|l| l.is_finite());
    let Some(max) = finite().reduce(f32::max) else {
        return f32::NEG_INFINITY;
    };
    if !chosen.is_finite() {
        return f32::NEG_INFINITY;
    }
    let total: f64 = finite().map(|l| f64::from(l - max).exp()).sum();
    (f64::from(chosen - max) - total.ln()) as f32
}

/// The index of the largest logit; the first one on ties (as numpy's `argmax`). NaN never wins.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &value) in logits.iter().enumerate() {
        if value > logits[best] || logits[best].is_nan() {
            best = i;
        }
    }
    best as u32
}

/// The tokens that may be drawn with their probabilities (normalised, most likely first), after
/// temperature, top-k and top-p.
pub fn candidates(logits: &[f32], params: &SamplingParams) -> Vec<(u32, f64)> {
    let temperature = f64::from(params.temperature.max(f32::MIN_POSITIVE));
    let mut ranked: Vec<(u32, f64)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, &l)| (i as u32, f64::from(l) / temperature))
        .collect();
    if ranked.is_empty() {
        return vec![(0, 1.0)];
    }
    let by_score = |a: &(u32, f64), b: &(u32, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if params.top_k > 0 && params.top_k < ranked.len() {
        ranked.select_nth_unstable_by(params.top_k - 1, by_score);
        ranked.truncate(params.top_k);
    }
    ranked.sort_unstable_by(by_score);
    let max = ranked[0].1;
    let mut total = 0.0;
    for entry in &mut ranked {
        entry.1 = (entry.1 - max).exp();
        total += entry.1;
    }
    for entry in &mut ranked {
        entry.1 /= total;
    }
    if params.top_p < 1.0 {
        let mut mass = 0.0;
        let keep = ranked
            .iter()
            .position(|&(_, p)| {
                mass += p;
                mass >= f64::from(params.top_p)
            })
            .map_or(ranked.len(), |i| i + 1);
        ranked.truncate(keep.max(1));
        let kept: f64 = ranked.iter().map(|c| c.1).sum();
        for entry in &mut ranked {
            entry.1 /= kept;
        }
    }
    ranked
}

/// The candidate whose cumulative probability first exceeds `draw` (in [0, 1)).
fn pick(candidates: &[(u32, f64)], draw: f64) -> u32 {
    let mut mass = 0.0;
    for &(token, p) in candidates {
        mass += p;
        if draw < mass {
            return token;
        }
    }
    candidates.last().map_or(0, |c| c.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            seed: Some(7),
        }
    }

    #[test]
    fn logprobs_are_the_log_softmax_of_the_row() {
        let logits = [1.0f32, 2.0, 3.0];
        let total: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        for (token, &l) in logits.iter().enumerate() {
            let expected = (f64::from(l).exp() / total).ln() as f32;
            assert!((logprob(&logits, token as u32) - expected).abs() < 1e-6);
        }
        // Large logits do not overflow; the probabilities still add up to one.
        let big = [1000.0f32, 1000.0];
        assert!((logprob(&big, 0) - 0.5f32.ln()).abs() < 1e-6);
        assert_eq!(logprob(&[0.0, f32::NEG_INFINITY], 0), 0.0);
        assert_eq!(logprob(&[0.0, f32::NEG_INFINITY], 1), f32::NEG_INFINITY);
        assert_eq!(logprob(&[0.0, f32::NAN], 0), 0.0);
        assert_eq!(logprob(&[0.0], 5), f32::NEG_INFINITY);
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        assert_eq!(argmax(&[0.1, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0]), 1);
        let mut sampler = Sampler::new(params(0.0, 0, 1.0));
        assert_eq!(sampler.sample(&[0.0, 0.5, 2.0]), 2);
        let mut top1 = Sampler::new(params(1.5, 1, 1.0));
        assert_eq!(top1.sample(&[0.0, 0.5, 2.0]), 2);
    }

    #[test]
    fn top_k_keeps_the_k_best() {
        let logits = [1.0, 4.0, 3.0, 2.0, 0.0];
        let kept = candidates(&logits, &params(1.0, 2, 1.0));
        let tokens: Vec<u32> = kept.iter().map(|c| c.0).collect();
        assert_eq!(tokens, vec![1, 2]);
        let sum: f64 = kept.iter().map(|c| c.1).sum();
        assert!((sum - 1.0).abs() < 1e-12);
        // e^4 / (e^4 + e^3)
        assert!((kept[0].1 - 1.0 / (1.0 + (-1.0f64).exp())).abs() < 1e-9);
    }

    #[test]
    fn top_p_keeps_the_smallest_nucleus() {
        // Probabilities 0.5, 0.3, 0.2 (log-probabilities as logits).
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
        let tokens = |p: f32| -> Vec<u32> {
            candidates(&logits, &params(1.0, 0, p))
                .iter()
                .map(|c| c.0)
                .collect()
        };
        assert_eq!(tokens(0.4), vec![0]);
        assert_eq!(tokens(0.75), vec![0, 1]);
        assert_eq!(tokens(0.95), vec![0, 1, 2]);
        assert_eq!(tokens(1.0), vec![0, 1, 2]);
        let renormalised = candidates(&logits, &params(1.0, 0, 0.75));
        assert!((renormalised[0].1 - 0.625).abs() < 1e-6);
    }

    #[test]
    fn temperature_sharpens_and_flattens() {
        let logits = [1.0, 2.0];
        let cold = candidates(&logits, &params(0.25, 0, 1.0));
        let hot = candidates(&logits, &params(4.0, 0, 1.0));
        assert!(cold[0].1 > 0.98, "{cold:?}");
        assert!(hot[0].1 < 0.57 && hot[0].1 > 0.5, "{hot:?}");
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_follows_the_distribution() {
        let logits = [0.0f32, 1.0, 2.0, 3.0];
        let draw = |seed| {
            let mut sampler = Sampler::new(SamplingParams {
                seed: Some(seed),
                ..params(1.0, 0, 1.0)
            });
            (0..2000)
                .map(|_| sampler.sample(&logits))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(42), draw(42));
        assert_ne!(draw(42), draw(43));
        let counts = draw(42).iter().fold([0usize; 4], |mut c, &t| {
            c[t as usize] += 1;
            c
        });
        // Expected shares: 0.032, 0.087, 0.237, 0.644.
        assert!(counts[3] > 1150 && counts[3] < 1430, "{counts:?}");
        assert!(counts[0] > 20 && counts[0] < 120, "{counts:?}");
    }

    #[test]
    fn uniform_draws_stay_in_range() {
        let mut rng = Rng::new(0);
        for _ in 0..10_000 {
            let x = rng.next_f64();
            assert!((0.0..1.0).contains(&x));
        }
        assert_ne!(Rng::fresh_seed(), Rng::fresh_seed());
    }
}
