//! The families of every model version's series (labels `model`, `version`, and `gpu_uuid` for
//! what ran on a GPU), with Triton's help texts word for word (the compute summaries share their
//! counters' texts in Triton too) and kiln's for the generation series.

use super::series::Family;

const fn family(name: &'static str, help: &'static str) -> Family {
    Family { name, help }
}

pub const SUCCESS: Family = family(
    "nv_inference_request_success",
    "Number of successful inference requests, all batch sizes",
);
/// With a `reason` label as well.
pub const FAILURE: Family = family(
    "nv_inference_request_failure",
    "Number of failed inference requests, all batch sizes",
);
pub const INFERENCE_COUNT: Family = family(
    "nv_inference_count",
    "Number of inferences performed (does not include cached requests)",
);
pub const EXEC_COUNT: Family = family(
    "nv_inference_exec_count",
    "Number of model executions performed (does not include cached requests)",
);
pub const REQUEST_DURATION: Family = family(
    "nv_inference_request_duration_us",
    "Cumulative inference request duration in microseconds (includes cached requests)",
);
pub const QUEUE_DURATION: Family = family(
    "nv_inference_queue_duration_us",
    "Cumulative inference queuing duration in microseconds (includes cached requests)",
);
pub const COMPUTE_INPUT_DURATION: Family = family(
    "nv_inference_compute_input_duration_us",
    "Cumulative compute input duration in microseconds (does not include cached requests)",
);
pub const COMPUTE_INFER_DURATION: Family = family(
    "nv_inference_compute_infer_duration_us",
    "Cumulative compute inference duration in microseconds (does not include cached requests)",
);
pub const COMPUTE_OUTPUT_DURATION: Family = family(
    "nv_inference_compute_output_duration_us",
    "Cumulative inference compute output duration in microseconds (does not include cached requests)",
);
pub const REQUEST_SUMMARY: Family = family(
    "nv_inference_request_summary_us",
    "Summary of inference request duration in microseconds (includes cached requests)",
);
pub const QUEUE_SUMMARY: Family = family(
    "nv_inference_queue_summary_us",
    "Summary of inference queuing duration in microseconds (includes cached requests)",
);
pub const COMPUTE_INPUT_SUMMARY: Family = family(
    "nv_inference_compute_input_summary_us",
    "Cumulative compute input duration in microseconds (does not include cached requests)",
);
pub const COMPUTE_INFER_SUMMARY: Family = family(
    "nv_inference_compute_infer_summary_us",
    "Cumulative compute inference duration in microseconds (does not include cached requests)",
);
pub const COMPUTE_OUTPUT_SUMMARY: Family = family(
    "nv_inference_compute_output_summary_us",
    "Cumulative inference compute output duration in microseconds (does not include cached requests)",
);
pub const PENDING: Family = family(
    "nv_inference_pending_request_count",
    "Instantaneous number of pending requests awaiting execution per-model.",
);
pub const LOAD_DURATION: Family =
    family("nv_model_load_duration_secs", "Model load time in seconds");
pub const CACHE_HITS: Family = family(
    "nv_cache_num_hits_per_model",
    "Number of cache hits per model",
);
pub const CACHE_MISSES: Family = family(
    "nv_cache_num_misses_per_model",
    "Number of cache misses per model",
);
pub const CACHE_HIT_DURATION: Family = family(
    "nv_cache_hit_duration_per_model",
    "Total cache hit duration per model, in microseconds",
);
pub const CACHE_MISS_DURATION: Family = family(
    "nv_cache_miss_duration_per_model",
    "Total cache miss (insert+lookup) duration per model, in microseconds",
);
pub const CACHE_HIT_SUMMARY: Family = family(
    "nv_cache_hit_summary_per_model",
    "Summary of cache hit counts/durations per model, in microseconds.",
);
pub const CACHE_MISS_SUMMARY: Family = family(
    "nv_cache_miss_summary_per_model",
    "Summary of cache miss counts/durations per model, in microseconds.",
);
pub const FIRST_RESPONSE: Family = family(
    "nv_inference_first_response_histogram_ms",
    "Duration from request to first response in milliseconds",
);
pub const TIME_TO_FIRST_TOKEN: Family = family(
    "kiln_time_to_first_token_seconds",
    "Time from a generation request's arrival to its first token, in seconds",
);
pub const INTER_TOKEN_LATENCY: Family = family(
    "kiln_inter_token_latency_seconds",
    "Time between a generation's tokens, in seconds",
);
pub const GENERATION_TOKENS: Family = family(
    "kiln_generation_tokens_total",
    "Tokens generated per model version",
);
pub const PROMPT_TOKENS: Family = family(
    "kiln_prompt_tokens_total",
    "Prompt tokens read per model version",
);
pub const ACTIVE_SEQUENCES: Family = family(
    "kiln_active_sequences",
    "Generation requests in progress per model version",
);
