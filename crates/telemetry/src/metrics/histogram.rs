//! Triton's first-response histogram, `nv_inference_first_response_histogram_ms` (labels `model`,
//! `version`): from a request's arrival to its first response, in milliseconds, for decoupled
//! (generation) models, published with `--metrics-config histogram_latencies=true`.
//!
//! Its buckets are Triton's (100, 500, 2000, 5000 ms) unless the model's config sets others
//! (`model_metrics { metric_control [ { metric_identifier { family: "..." } histogram_options {
//! buckets: [...] } } ] }`), so each model version may have its own ([`super::series`] keeps
//! each series' bounds).

use crate::proto::inference::model_metrics::metric_control::MetricOptions;
use crate::proto::inference::ModelConfig;

/// The family's name, as Triton spells it.
const FIRST_RESPONSE: &str = super::families::FIRST_RESPONSE.name;

/// Triton's default bucket bounds (ms).
pub const DEFAULT_BUCKETS: &[f64] = &[100.0, 500.0, 2000.0, 5000.0];

/// Most bounds one histogram may have (each is a series on every scrape).
const MAX_BUCKETS: usize = 128;

/// The first-response buckets `config` sets, or Triton's defaults.
///
/// # Errors
/// A family kiln does not publish, a setting that is not a histogram's, or bounds that are not
/// finite and increasing.
pub fn first_response_buckets(config: &ModelConfig) -> Result<Vec<f64>, String> {
    let model = &config.name;
    let mut buckets = DEFAULT_BUCKETS.to_vec();
    let Some(metrics) = &config.model_metrics else {
        return Ok(buckets);
    };
    for control in &metrics.metric_control {
        let family = control
            .metric_identifier
            .as_ref()
            .map_or("", |id| id.family.as_str());
        let bad = |why: String| format!("model_metrics of model '{model}': {why}");
        if family != FIRST_RESPONSE {
            return Err(bad(format!(
                "metric family '{family}' has no settings (only {FIRST_RESPONSE} has)"
            )));
        }
        let Some(MetricOptions::HistogramOptions(options)) = &control.metric_options else {
            return Err(bad(format!("{FIRST_RESPONSE} needs histogram_options")));
        };
        if options.buckets.len() > MAX_BUCKETS
            || options.buckets.iter().any(|b| !b.is_finite())
            || options.buckets.windows(2).any(|pair| pair[0] >= pair[1])
        {
            return Err(bad(format!(
                "the buckets of {FIRST_RESPONSE} must be at most {MAX_BUCKETS} finite numbers in \
                 increasing order, got {:?}",
                options.buckets
            )));
        }
        buckets.clone_from(&options.buckets);
    }
    Ok(buckets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::descriptor_pool;
    use prost_reflect::DynamicMessage;

    /// A model config of the text format (the repository's parser, which takes Triton's
    /// colon-less lists, is a layer above: the one list here gets its colon).
    fn parse_config(text: &str) -> Result<ModelConfig, String> {
        let descriptor = descriptor_pool()
            .get_message_by_name("inference.ModelConfig")
            .unwrap();
        let text = text.replace("metric_control [", "metric_control: [");
        DynamicMessage::parse_text_format(descriptor, &text)
            .map_err(|e| e.to_string())?
            .transcode_to::<ModelConfig>()
            .map_err(|e| e.to_string())
    }

    fn buckets(text: &str) -> Result<Vec<f64>, String> {
        let mut config = parse_config(text).unwrap();
        config.name = "m".into();
        first_response_buckets(&config)
    }

    #[test]
    fn buckets_are_tritons_unless_the_config_sets_them() {
        assert_eq!(buckets("").unwrap(), DEFAULT_BUCKETS);
        let set = r#"model_metrics { metric_control [ {
            metric_identifier { family: "nv_inference_first_response_histogram_ms" }
            histogram_options { buckets: [ -1, 0.0, 1, 2.5 ] } } ] }"#;
        assert_eq!(buckets(set).unwrap(), [-1.0, 0.0, 1.0, 2.5]);
        let empty = set.replace("[ -1, 0.0, 1, 2.5 ]", "[ ]");
        assert_eq!(buckets(&empty).unwrap(), Vec::<f64>::new());
    }

    #[test]
    fn bad_model_metrics_are_refused() {
        for (text, needle) in [
            (
                r#"model_metrics { metric_control [ { metric_identifier { family: "nv_inference_count" }
                   histogram_options { buckets: [ 1 ] } } ] }"#,
                "metric family 'nv_inference_count' has no settings",
            ),
            (
                r#"model_metrics { metric_control [ {
                   metric_identifier { family: "nv_inference_first_response_histogram_ms" } } ] }"#,
                "needs histogram_options",
            ),
            (
                r#"model_metrics { metric_control [ {
                   metric_identifier { family: "nv_inference_first_response_histogram_ms" }
                   histogram_options { buckets: [ 5, 1 ] } } ] }"#,
                "increasing order, got [5.0, 1.0]",
            ),
        ] {
            let error = buckets(text).unwrap_err();
            assert!(error.starts_with("model_metrics of model 'm': "), "{error}");
            assert!(error.contains(needle), "{error}");
        }
    }
}
