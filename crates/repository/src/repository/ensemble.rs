//! Triton's ensembles (`platform: "ensemble"`): a model whose requests run a pipeline of other
//! models. Each step of `ensemble_scheduling` runs one model (a version, or the latest); its
//! `input_map` names, for each of that model's inputs, the ensemble tensor that feeds it, and its
//! `output_map` names the ensemble tensor each output becomes. Ensemble tensors are the
//! ensemble's inputs and the steps' outputs.
//!
//! The plan is checked when the ensemble loads, as Triton checks it: every tensor is made once,
//! every step's inputs are made by the ensemble's inputs or by other steps, every ensemble input
//! is used, every ensemble output is made, and no steps depend on each other in a cycle. The
//! composing models themselves are looked up when a request runs, so an ensemble follows their
//! reloads; it is ready only while all of them are.

use crate::proto::inference::{model_config::SchedulingChoice, ModelConfig};
use std::collections::{BTreeMap, BTreeSet};

/// The platform name of ensembles.
pub const PLATFORM: &str = "ensemble";

/// Steps of an ensemble, in the order their inputs become available.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnsemblePlan {
    /// Groups of steps that can run at the same time: every step of a wave has its inputs once
    /// the waves before it have run.
    pub waves: Vec<Vec<Step>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub model: String,
    /// Empty: the latest version.
    pub version: String,
    /// (the model's input, the ensemble tensor that feeds it).
    pub inputs: Vec<(String, String)>,
    /// (the model's output, the ensemble tensor it becomes).
    pub outputs: Vec<(String, String)>,
}

impl EnsemblePlan {
    /// Every model the ensemble runs, by name.
    pub fn models(&self) -> BTreeSet<&str> {
        self.waves
            .iter()
            .flatten()
            .map(|step| step.model.as_str())
            .collect()
    }
}

pub fn is_ensemble(config: &ModelConfig) -> bool {
    config.platform == PLATFORM
}

/// The checked plan of an ensemble's config.
///
/// # Errors
/// A message naming the step or tensor that is wrong.
pub fn plan(config: &ModelConfig) -> Result<EnsemblePlan, String> {
    let name = &config.name;
    let Some(SchedulingChoice::EnsembleScheduling(scheduling)) = &config.scheduling_choice else {
        return Err(format!(
            "ensemble '{name}' must have an ensemble_scheduling with at least one step"
        ));
    };
    if scheduling.step.is_empty() {
        return Err(format!("ensemble '{name}' must have at least one step"));
    }
    let mut steps = Vec::with_capacity(scheduling.step.len());
    // Who makes each tensor: None for an ensemble input, Some(step) for a step's output.
    let mut makers: BTreeMap<&str, Option<usize>> = BTreeMap::new();
    for input in &config.input {
        makers.insert(&input.name, None);
    }
    for (index, step) in scheduling.step.iter().enumerate() {
        let model = &step.model_name;
        if model.is_empty() {
            return Err(format!("ensemble '{name}': step {index} names no model"));
        }
        if model == name {
            return Err(format!("ensemble '{name}' cannot run itself as a step"));
        }
        let version = match step.model_version {
            -1 => String::new(),
            v if v >= 1 => v.to_string(),
            v => {
                return Err(format!(
                    "ensemble '{name}': step '{model}' has model_version {v}; use -1 (the latest) \
                     or a version number"
                ))
            }
        };
        if step.output_map.is_empty() {
            return Err(format!(
                "ensemble '{name}': step '{model}' maps no output to an ensemble tensor"
            ));
        }
        for tensor in step.output_map.values() {
            if makers.insert(tensor, Some(index)).is_some() {
                return Err(format!(
                    "ensemble '{name}': tensor '{tensor}' is made more than once (an ensemble \
                     input, or the output of two steps)"
                ));
            }
        }
        let sorted = |map: &std::collections::HashMap<String, String>| {
            let mut pairs: Vec<(String, String)> =
                map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            pairs.sort();
            pairs
        };
        steps.push(Step {
            model: model.clone(),
            version,
            inputs: sorted(&step.input_map),
            outputs: sorted(&step.output_map),
        });
    }
    let mut used: BTreeSet<&str> = BTreeSet::new();
    for step in &steps {
        for (_, tensor) in &step.inputs {
            if !makers.contains_key(tensor.as_str()) {
                return Err(format!(
                    "ensemble '{name}': step '{}' reads tensor '{tensor}', which is neither an \
                     ensemble input nor any step's output",
                    step.model
                ));
            }
            used.insert(tensor);
        }
    }
    if let Some(unused) = config
        .input
        .iter()
        .find(|i| !used.contains(i.name.as_str()))
    {
        return Err(format!(
            "ensemble '{name}': input '{}' is not read by any step",
            unused.name
        ));
    }
    if let Some(missing) = config
        .output
        .iter()
        .find(|o| !matches!(makers.get(o.name.as_str()), Some(Some(_))))
    {
        return Err(format!(
            "ensemble '{name}': output '{}' is not made by any step",
            missing.name
        ));
    }
    // Waves: a step runs once every tensor it reads exists.
    let mut available: BTreeSet<String> = config.input.iter().map(|i| i.name.clone()).collect();
    let mut remaining = steps;
    let mut waves = Vec::new();
    while !remaining.is_empty() {
        let (ready, waiting): (Vec<Step>, Vec<Step>) = remaining
            .into_iter()
            .partition(|step| step.inputs.iter().all(|(_, t)| available.contains(t)));
        if ready.is_empty() {
            let stuck: Vec<&str> = waiting.iter().map(|s| s.model.as_str()).collect();
            return Err(format!(
                "ensemble '{name}': steps {stuck:?} wait on each other's outputs in a cycle"
            ));
        }
        for step in &ready {
            available.extend(step.outputs.iter().map(|(_, t)| t.clone()));
        }
        waves.push(ready);
        remaining = waiting;
    }
    Ok(EnsemblePlan { waves })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repository::config::parse_config;

    fn config(steps: &str) -> ModelConfig {
        parse_config(&format!(
            r#"name: "e" platform: "ensemble" max_batch_size: 8
               input [ {{ name: "A" data_type: TYPE_FP32 dims: [4] }},
                       {{ name: "B" data_type: TYPE_FP32 dims: [4] }} ]
               output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [4] }} ]
               ensemble_scheduling {{ {steps} }}"#
        ))
        .unwrap()
    }

    fn step(
        model: &str,
        version: i64,
        inputs: &[(&str, &str)],
        outputs: &[(&str, &str)],
    ) -> String {
        let map = |name: &str, pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| format!(r#"{name} {{ key: "{k}" value: "{v}" }}"#))
                .collect::<Vec<_>>()
                .join(" ")
        };
        format!(
            r#"step [ {{ model_name: "{model}" model_version: {version} {} {} }} ]"#,
            map("input_map", inputs),
            map("output_map", outputs)
        )
    }

    #[test]
    fn steps_run_in_waves_of_what_their_inputs_need() {
        // add(A, B) -> SUM; scale(SUM) -> OUT; a parallel side branch copy(A) -> COPY unused.
        let steps = [
            step("scale", 2, &[("X", "SUM")], &[("Y", "OUT")]),
            step(
                "add",
                -1,
                &[("INPUT0", "A"), ("INPUT1", "B")],
                &[("OUTPUT0", "SUM")],
            ),
            step("copy", -1, &[("X", "A")], &[("Y", "COPY")]),
        ]
        .join(" ");
        let plan = plan(&config(&steps)).unwrap();
        let names: Vec<Vec<&str>> = plan
            .waves
            .iter()
            .map(|wave| wave.iter().map(|s| s.model.as_str()).collect())
            .collect();
        assert_eq!(names, [vec!["add", "copy"], vec!["scale"]]);
        let scale = &plan.waves[1][0];
        assert_eq!(scale.version, "2");
        assert_eq!(plan.waves[0][0].version, "");
        assert_eq!(
            plan.waves[0][0].inputs,
            [
                ("INPUT0".to_string(), "A".to_string()),
                ("INPUT1".into(), "B".into())
            ]
        );
        assert_eq!(
            plan.models().into_iter().collect::<Vec<_>>(),
            ["add", "copy", "scale"]
        );
    }

    #[test]
    fn broken_plans_are_refused_with_the_reason() {
        let add = step(
            "add",
            -1,
            &[("INPUT0", "A"), ("INPUT1", "B")],
            &[("OUTPUT0", "OUT")],
        );
        let cases = [
            ("", "at least one step"),
            (
                &step("e", -1, &[("X", "A"), ("Y", "B")], &[("Z", "OUT")])[..],
                "cannot run itself",
            ),
            (
                &step("add", 0, &[("X", "A"), ("Y", "B")], &[("Z", "OUT")]),
                "model_version 0",
            ),
            (
                &step("add", -1, &[("X", "A"), ("Y", "B")], &[]),
                "maps no output",
            ),
            (
                &format!("{add} {add}"),
                "tensor 'OUT' is made more than once",
            ),
            (
                &step(
                    "add",
                    -1,
                    &[("X", "A"), ("Y", "B")],
                    &[("Z", "A"), ("W", "OUT")],
                ),
                "tensor 'A' is made more than once",
            ),
            (
                &step("add", -1, &[("X", "A"), ("Y", "NOPE")], &[("Z", "OUT")]),
                "reads tensor 'NOPE'",
            ),
            (
                &step("add", -1, &[("X", "A")], &[("Z", "OUT")]),
                "input 'B' is not read by any step",
            ),
            (
                &step("add", -1, &[("X", "A"), ("Y", "B")], &[("Z", "OTHER")]),
                "output 'OUT' is not made by any step",
            ),
            (
                &[
                    step("p", -1, &[("X", "A"), ("Y", "Q_OUT")], &[("Z", "P_OUT")]),
                    step(
                        "q",
                        -1,
                        &[("X", "B"), ("Y", "P_OUT")],
                        &[("Z", "Q_OUT"), ("W", "OUT")],
                    ),
                ]
                .join(" "),
                "in a cycle",
            ),
        ];
        for (steps, expected) in cases {
            let error = plan(&config(steps)).unwrap_err();
            assert!(error.contains(expected), "{steps}: {error}");
        }
        let mut no_scheduling = config("");
        no_scheduling.scheduling_choice = None;
        assert!(plan(&no_scheduling)
            .unwrap_err()
            .contains("ensemble_scheduling"));
    }
}
