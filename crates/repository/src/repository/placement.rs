//! Where a model's instances run: Triton's instance-group rules applied to what this process can
//! use, and the CUDA execution provider options the config sets.
//!
//! As Triton: a config without groups gets one `KIND_AUTO` group; `KIND_AUTO` takes the GPUs when
//! one is usable and the CPU otherwise; `KIND_GPU` runs `count` instances on **each** GPU it lists
//! (`gpus: [...]`; none listed: every usable GPU); `KIND_CPU` (and `KIND_MODEL`) runs `count` on
//! CPU. Counts default to 1 per GPU and 2 on CPU. A `KIND_GPU` group where no GPU is usable fails
//! the load with the reason (which library or device is missing), unless the server runs with
//! `--gpu-fallback-to-cpu`: then the group runs on CPU, and the model says so.
//!
//! CUDA options come from Triton's two places, for GPU instances only: the model `parameters`
//! `cudnn_conv_algo_search`, `gpu_mem_limit`, `arena_extend_strategy` and
//! `do_copy_in_default_stream` (the ONNX Runtime backend's older spelling), then any key of an
//! `optimization { execution_accelerators { gpu_execution_accelerator [ { name: "cuda" ... } ] } }`,
//! which wins over the former.

use crate::backend::{CudaOptions, Device, GpuInventory};
use crate::proto::inference::{model_instance_group::Kind, ModelConfig, ModelInstanceGroup};
use crate::scheduler::rate_limit::{InstanceLimit, ResourceKey};

/// Instances per CPU group when the config gives no count (Triton's ONNX Runtime default).
const DEFAULT_CPU_INSTANCE_COUNT: i32 = 2;
/// Instances per GPU of a GPU group when the config gives no count (Triton's default).
const DEFAULT_GPU_INSTANCE_COUNT: i32 = 1;
/// Model parameters Triton's ONNX Runtime backend reads as CUDA EP options.
const CUDA_PARAMETERS: &[&str] = &[
    "cudnn_conv_algo_search",
    "gpu_mem_limit",
    "arena_extend_strategy",
    "do_copy_in_default_stream",
];

/// Where each instance of a model runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// One entry per instance, in group order.
    pub devices: Vec<Device>,
    /// The index of each instance's group in the config's `instance_group`.
    pub groups: Vec<usize>,
    /// Why `KIND_GPU` groups run on CPU (only with `--gpu-fallback-to-cpu`).
    pub fallback: Option<String>,
}

/// Normalises `config`'s instance groups (name, kind, count, GPUs, as the effective config then
/// shows them) and places every instance. `inventory` is asked only when a group may want a GPU.
///
/// # Errors
/// The reason, as the index reports it: a GPU group without a usable GPU (no fallback), a GPU id
/// that does not exist, GPUs listed on a CPU group, or a bad CUDA option.
pub fn place(
    config: &mut ModelConfig,
    inventory: &dyn Fn() -> GpuInventory,
    fallback_to_cpu: bool,
) -> Result<Placement, String> {
    let model = config.name.clone();
    // As Triton: the group a config leaves out is named after the model; unnamed groups the
    // config lists are `<model>_<index>`.
    if config.instance_group.is_empty() {
        config.instance_group.push(ModelInstanceGroup {
            name: model.clone(),
            ..ModelInstanceGroup::default()
        });
    }
    let mut known: Option<GpuInventory> = None;
    let mut usable = || known.get_or_insert_with(inventory).clone();
    // (group, count, GPU) per placement unit
    let mut placed: Vec<(usize, usize, Option<i32>)> = Vec::new();
    let mut fallback = None;
    for (index, group) in config.instance_group.iter_mut().enumerate() {
        if group.name.is_empty() {
            group.name = format!("{model}_{index}");
        }
        check_group(group, &model)?;
        let kind = Kind::try_from(group.kind).unwrap_or(Kind::Auto);
        let wants_gpu = match kind {
            Kind::Gpu => true,
            // A KIND_AUTO group that names GPUs asks for them.
            Kind::Auto => !group.gpus.is_empty() || matches!(usable(), GpuInventory::Usable(_)),
            Kind::Cpu | Kind::Model => {
                if !group.gpus.is_empty() {
                    return Err(format!(
                        "instance group '{}' of model '{model}' has kind {} but specifies one or \
                         more GPUs",
                        group.name,
                        kind.as_str_name()
                    ));
                }
                false
            }
        };
        if !wants_gpu {
            to_cpu(group);
            placed.push((index, group.count as usize, None));
            continue;
        }
        match usable() {
            GpuInventory::Usable(gpus) => {
                if group.gpus.is_empty() {
                    group.gpus = gpus.iter().map(|g| g.id).collect();
                }
                if let Some(bad) = group
                    .gpus
                    .iter()
                    .find(|id| !gpus.iter().any(|g| g.id == **id))
                {
                    let ids: Vec<String> = gpus.iter().map(|g| g.id.to_string()).collect();
                    return Err(format!(
                        "instance group '{}' of model '{model}' specifies invalid or unsupported \
                         gpu id {bad}; the usable GPUs are: {}",
                        group.name,
                        ids.join(" ")
                    ));
                }
                group.kind = Kind::Gpu as i32;
                if group.count < 1 {
                    group.count = DEFAULT_GPU_INSTANCE_COUNT;
                }
                for &id in &group.gpus {
                    placed.push((index, group.count as usize, Some(id)));
                }
            }
            GpuInventory::Unusable(reason) => {
                let why = format!(
                    "KIND_GPU requested by instance group '{}' of model '{model}', but {reason}",
                    group.name
                );
                if !fallback_to_cpu {
                    return Err(why);
                }
                fallback = Some(format!("running on CPU (--gpu-fallback-to-cpu): {why}"));
                group.gpus.clear();
                to_cpu(group);
                placed.push((index, group.count as usize, None));
            }
        }
    }
    let options = if placed.iter().any(|(_, _, gpu)| gpu.is_some()) {
        cuda_options(config)?
    } else {
        CudaOptions::default()
    };
    if placed.iter().any(|(_, _, gpu)| gpu.is_none()) {
        check_cpu_accelerators(config)?;
    }
    let gpus = match known {
        Some(GpuInventory::Usable(gpus)) => gpus,
        _ => Vec::new(),
    };
    let mut devices = Vec::new();
    let mut groups = Vec::new();
    for (group, count, gpu) in placed {
        let device = match gpu.and_then(|id| gpus.iter().find(|g| g.id == id)) {
            Some(gpu) => Device::Cuda {
                gpu: gpu.clone(),
                options: options.clone(),
            },
            None => Device::Cpu,
        };
        devices.extend(std::iter::repeat_n(device, count));
        groups.extend(std::iter::repeat_n(group, count));
    }
    Ok(Placement {
        devices,
        groups,
        fallback,
    })
}

/// Refuses a group's settings that would change which instances serve, or where, rather than
/// ignoring them; a host policy only pins threads, and is left alone with a warning.
fn check_group(group: &ModelInstanceGroup, model: &str) -> Result<(), String> {
    if group.passive {
        return Err(format!(
            "instance group '{}' of model '{model}' is passive: kiln schedules every \
             instance it loads (remove `passive`)",
            group.name
        ));
    }
    if !group.secondary_devices.is_empty() {
        return Err(format!(
            "instance group '{}' of model '{model}' lists secondary_devices, which kiln's \
             ONNX Runtime instances do not use",
            group.name
        ));
    }
    if !group.host_policy.is_empty() {
        tracing::warn!(
            "instance group '{}' of model '{model}': host_policy '{}' is ignored (instances \
             are not pinned to NUMA nodes or cores)",
            group.name,
            group.host_policy
        );
    }
    Ok(())
}

/// Each instance's `rate_limiter` needs (see [`group_limit`]).
///
/// # Errors
/// A resource without a name.
pub fn instance_limits(
    config: &ModelConfig,
    placement: &Placement,
) -> Result<Vec<Option<InstanceLimit>>, String> {
    placement
        .devices
        .iter()
        .zip(&placement.groups)
        .map(|(device, &group)| group_limit(config, group, device.gpu().map_or(0, |gpu| gpu.id)))
        .collect()
}

/// What an instance of instance group `group` on `device` needs from the rate limiter (`None`:
/// the group lists no resources): its resources on that device (a GPU's ordinal, 0 for CPU
/// instances: Triton's numbering), unless `global`.
///
/// # Errors
/// A resource without a name.
pub fn group_limit(
    config: &ModelConfig,
    group: usize,
    device: i32,
) -> Result<Option<InstanceLimit>, String> {
    let Some(group) = config.instance_group.get(group) else {
        return Ok(None);
    };
    let Some(limiter) = group.rate_limiter.as_ref() else {
        return Ok(None);
    };
    let mut resources = Vec::new();
    for resource in &limiter.resources {
        if resource.name.is_empty() {
            return Err(format!(
                "instance group '{}' of model '{}' lists a rate_limiter resource without a name",
                group.name, config.name
            ));
        }
        let key = ResourceKey {
            name: resource.name.clone(),
            device: (!resource.global).then_some(device),
        };
        resources.push((key, resource.count));
    }
    Ok((!resources.is_empty()).then_some(InstanceLimit {
        resources,
        priority: limiter.priority,
    }))
}

fn to_cpu(group: &mut ModelInstanceGroup) {
    group.kind = Kind::Cpu as i32;
    if group.count < 1 {
        group.count = DEFAULT_CPU_INSTANCE_COUNT;
    }
}

/// The CUDA options `config` sets (see the module docs for where and in which order).
///
/// # Errors
/// The first bad option, naming where it was set.
pub fn cuda_options(config: &ModelConfig) -> Result<CudaOptions, String> {
    let model = &config.name;
    let mut options = CudaOptions::default();
    for key in CUDA_PARAMETERS {
        if let Some(parameter) = config.parameters.get(*key) {
            options
                .set(key, &parameter.string_value)
                .map_err(|e| format!("parameter '{key}' of model '{model}': {e}"))?;
        }
    }
    let accelerators = config
        .optimization
        .as_ref()
        .and_then(|o| o.execution_accelerators.as_ref())
        .map(|a| a.gpu_execution_accelerator.as_slice())
        .unwrap_or_default();
    for accelerator in accelerators {
        if accelerator.name != "cuda" {
            return Err(format!(
                "unknown Execution Accelerator '{}' is requested for the GPU instances of model \
                 '{model}' (kiln supports \"cuda\")",
                accelerator.name
            ));
        }
        let mut keys: Vec<&String> = accelerator.parameters.keys().collect();
        keys.sort();
        for key in keys {
            options
                .set(key, &accelerator.parameters[key])
                .map_err(|e| {
                    format!("gpu_execution_accelerator \"cuda\" of model '{model}': {e}")
                })?;
        }
    }
    Ok(options)
}

/// CPU instances run on ONNX Runtime's own CPU provider: an accelerator asked for them (Triton's
/// backend offers OpenVINO) is refused, with Triton's message, rather than ignored.
fn check_cpu_accelerators(config: &ModelConfig) -> Result<(), String> {
    let requested = config
        .optimization
        .as_ref()
        .and_then(|o| o.execution_accelerators.as_ref())
        .and_then(|a| a.cpu_execution_accelerator.first());
    match requested {
        None => Ok(()),
        Some(accelerator) => Err(format!(
            "unknown Execution Accelerator '{}' is requested for the CPU instances of model '{}' \
             (kiln runs them on ONNX Runtime's CPU provider, which the PyPI build has alone)",
            accelerator.name, config.name
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Gpu;
    use crate::repository::config::parse_config;

    fn gpus(ids: &[i32]) -> GpuInventory {
        GpuInventory::Usable(
            ids.iter()
                .map(|&id| Gpu {
                    id,
                    uuid: format!("GPU-{id}"),
                })
                .collect(),
        )
    }

    fn no_gpu() -> GpuInventory {
        GpuInventory::Unusable("libcuda.so.1 not found (no NVIDIA driver)".into())
    }

    fn config(text: &str) -> ModelConfig {
        let mut config = parse_config(text).unwrap();
        config.name = "m".into();
        config
    }

    /// The device of each instance: "cpu" or the GPU id.
    fn where_(placement: &Placement) -> Vec<String> {
        placement
            .devices
            .iter()
            .map(|d| d.gpu().map_or("cpu".into(), |g| g.id.to_string()))
            .collect()
    }

    #[test]
    fn passive_groups_and_secondary_devices_are_refused() {
        let mut passive = config("instance_group [ { kind: KIND_CPU passive: true } ]");
        let error = place(&mut passive, &no_gpu, false).unwrap_err();
        assert!(error.contains("'m_0' of model 'm' is passive"), "{error}");
        let mut secondary = config(
            "instance_group [ { kind: KIND_CPU secondary_devices [ { kind: KIND_NVDLA device_id: 0 } ] } ]",
        );
        let error = place(&mut secondary, &no_gpu, false).unwrap_err();
        assert!(error.contains("secondary_devices"), "{error}");
        let mut pinned = config(r#"instance_group [ { kind: KIND_CPU host_policy: "numa0" } ]"#);
        assert!(place(&mut pinned, &no_gpu, false).is_ok());
    }

    #[test]
    fn rate_limits_follow_each_instance_to_its_device() {
        let mut grouped = config(
            r#"instance_group [
                 { kind: KIND_GPU count: 1 gpus: [ 0, 1 ]
                   rate_limiter { resources [ { name: "mem" count: 2 }, { name: "g" global: true count: 1 } ] priority: 3 } },
                 { kind: KIND_CPU count: 1 rate_limiter { resources [ { name: "mem" count: 1 } ] } },
                 { kind: KIND_CPU count: 1 } ]"#,
        );
        let placement = place(&mut grouped, &|| gpus(&[0, 1]), false).unwrap();
        assert_eq!(placement.groups, [0, 0, 1, 2]);
        let limits = instance_limits(&grouped, &placement).unwrap();
        let key = |name: &str, device| ResourceKey {
            name: name.into(),
            device,
        };
        let gpu1 = limits[1].as_ref().unwrap();
        assert_eq!(
            gpu1.resources,
            [(key("mem", Some(1)), 2), (key("g", None), 1)]
        );
        assert_eq!(gpu1.priority, 3);
        // CPU instances count as device 0, as in Triton.
        assert_eq!(
            limits[2].as_ref().unwrap().resources,
            [(key("mem", Some(0)), 1)]
        );
        assert!(limits[3].is_none());
        let mut unnamed =
            config("instance_group [ { rate_limiter { resources [ { count: 1 } ] } } ]");
        let placement = place(&mut unnamed, &no_gpu, false).unwrap();
        assert!(instance_limits(&unnamed, &placement)
            .unwrap_err()
            .contains("without a name"));
    }

    #[test]
    fn without_groups_one_auto_group_takes_the_gpus_or_the_cpu() {
        let mut cpu = config("");
        let placement = place(&mut cpu, &no_gpu, false).unwrap();
        assert_eq!(where_(&placement), ["cpu", "cpu"]);
        let group = &cpu.instance_group[0];
        assert_eq!(
            (group.name.as_str(), group.count, group.kind),
            ("m", 2, Kind::Cpu as i32)
        );
        let mut gpu = config("");
        let placement = place(&mut gpu, &|| gpus(&[0, 1]), false).unwrap();
        assert_eq!(where_(&placement), ["0", "1"]);
        let group = &gpu.instance_group[0];
        assert_eq!(
            (group.count, group.kind, group.gpus.clone()),
            (1, Kind::Gpu as i32, vec![0, 1])
        );
        assert_eq!(placement.fallback, None);
    }

    #[test]
    fn gpu_groups_run_count_instances_on_each_listed_gpu() {
        let mut config = config(
            "instance_group [ { kind: KIND_GPU count: 2 gpus: [ 1, 2 ] }, \
             { kind: KIND_CPU count: 1 }, { kind: KIND_GPU } ]",
        );
        let placement = place(&mut config, &|| gpus(&[0, 1, 2]), false).unwrap();
        assert_eq!(
            where_(&placement),
            ["1", "1", "2", "2", "cpu", "0", "1", "2"]
        );
        assert_eq!(config.instance_group[2].gpus, vec![0, 1, 2]);
        match &placement.devices[0] {
            Device::Cuda { gpu, options } => {
                assert_eq!(gpu.uuid, "GPU-1");
                assert_eq!(options, &CudaOptions::default());
            }
            Device::Cpu => panic!("expected a GPU instance"),
        }
    }

    #[test]
    fn cpu_only_configs_never_ask_for_gpus() {
        let mut config =
            config("instance_group [ { kind: KIND_CPU count: 3 }, { kind: KIND_MODEL } ]");
        let asked = || -> GpuInventory { panic!("the inventory was asked for a CPU-only model") };
        let placement = place(&mut config, &asked, false).unwrap();
        assert_eq!(where_(&placement), ["cpu", "cpu", "cpu", "cpu", "cpu"]);
        assert_eq!(config.instance_group[1].kind, Kind::Cpu as i32);
    }

    #[test]
    fn a_gpu_group_without_a_usable_gpu_fails_and_names_what_is_missing() {
        let mut config = config("instance_group [ { kind: KIND_GPU count: 1 } ]");
        let err = place(&mut config, &no_gpu, false).unwrap_err();
        assert_eq!(
            err,
            "KIND_GPU requested by instance group 'm_0' of model 'm', but libcuda.so.1 not found \
             (no NVIDIA driver)"
        );
        // KIND_AUTO naming GPUs asks for them just as firmly.
        let mut auto = parse_config("instance_group [ { gpus: [ 0 ] } ]").unwrap();
        auto.name = "m".into();
        assert_eq!(
            place(&mut auto, &no_gpu, false).unwrap_err(),
            "KIND_GPU requested by instance group 'm_0' of model 'm', but libcuda.so.1 not found \
             (no NVIDIA driver)"
        );
    }

    #[test]
    fn the_fallback_flag_runs_gpu_groups_on_cpu_and_says_why() {
        let mut config = config(
            "instance_group [ { kind: KIND_GPU count: 3 gpus: [ 0 ] }, { kind: KIND_GPU } ]",
        );
        let placement = place(&mut config, &no_gpu, true).unwrap();
        assert_eq!(where_(&placement), ["cpu", "cpu", "cpu", "cpu", "cpu"]);
        assert_eq!(
            placement.fallback.as_deref(),
            Some(
                "running on CPU (--gpu-fallback-to-cpu): KIND_GPU requested by instance group \
                 'm_1' of model 'm', but libcuda.so.1 not found (no NVIDIA driver)"
            )
        );
        let group = &config.instance_group[0];
        assert_eq!((group.kind, group.count), (Kind::Cpu as i32, 3));
        assert!(group.gpus.is_empty());
    }

    #[test]
    fn bad_gpu_ids_and_gpus_on_cpu_groups_are_refused() {
        let mut bad = config("instance_group [ { kind: KIND_GPU gpus: [ 0, 3 ] } ]");
        let err = place(&mut bad, &|| gpus(&[0, 1]), true).unwrap_err();
        assert_eq!(
            err,
            "instance group 'm_0' of model 'm' specifies invalid or unsupported gpu id 3; the \
             usable GPUs are: 0 1"
        );
        let mut cpu = config("instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]");
        let err = place(&mut cpu, &|| gpus(&[0]), false).unwrap_err();
        assert_eq!(
            err,
            "instance group 'm_0' of model 'm' has kind KIND_CPU but specifies one or more GPUs"
        );
    }

    #[test]
    fn cuda_options_come_from_parameters_then_the_cuda_accelerator() {
        let mut config = config(
            r#"instance_group [ { kind: KIND_GPU } ]
            parameters { key: "cudnn_conv_algo_search" value: { string_value: "1" } }
            parameters { key: "gpu_mem_limit" value: { string_value: "1073741824" } }
            parameters { key: "max_inflight_requests" value: { string_value: "8" } }
            optimization { execution_accelerators { gpu_execution_accelerator [ {
              name: "cuda"
              parameters { key: "cudnn_conv_algo_search" value: "DEFAULT" }
              parameters { key: "use_tf32" value: "0" }
            } ] } }"#,
        );
        let placement = place(&mut config, &|| gpus(&[0]), false).unwrap();
        let Device::Cuda { options, .. } = &placement.devices[0] else {
            panic!("expected a GPU instance");
        };
        let pairs: Vec<(&str, &str)> = options.pairs().collect();
        assert_eq!(
            pairs,
            vec![
                ("cudnn_conv_algo_search", "DEFAULT"),
                ("gpu_mem_limit", "1073741824"),
                ("use_tf32", "0"),
            ]
        );
    }

    #[test]
    fn bad_cuda_options_fail_gpu_models_only() {
        let bad_parameter =
            r#"parameters { key: "arena_extend_strategy" value: { string_value: "fast" } }"#;
        let mut gpu = config(&format!(
            "instance_group [ {{ kind: KIND_GPU }} ] {bad_parameter}"
        ));
        let err = place(&mut gpu, &|| gpus(&[0]), false).unwrap_err();
        assert!(
            err.starts_with(
                "parameter 'arena_extend_strategy' of model 'm': invalid value 'fast' for CUDA \
                 option 'arena_extend_strategy'"
            ),
            "{err}"
        );
        // Triton ignores GPU settings for CPU instances; so does kiln.
        let mut cpu = config(&format!(
            "instance_group [ {{ kind: KIND_CPU }} ] {bad_parameter}"
        ));
        assert!(place(&mut cpu, &|| gpus(&[0]), false).is_ok());

        let mut unknown = config(
            r#"instance_group [ { kind: KIND_GPU } ]
            optimization { execution_accelerators { gpu_execution_accelerator [ {
              name: "cuda" parameters { key: "cuda_graph" value: "1" } } ] } }"#,
        );
        let err = place(&mut unknown, &|| gpus(&[0]), false).unwrap_err();
        assert!(
            err.starts_with(
                "gpu_execution_accelerator \"cuda\" of model 'm': unknown CUDA option 'cuda_graph'"
            ),
            "{err}"
        );
        let mut tensorrt = config(
            r#"instance_group [ { kind: KIND_GPU } ]
            optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt" } ] } }"#,
        );
        let err = place(&mut tensorrt, &|| gpus(&[0]), false).unwrap_err();
        assert!(
            err.starts_with("unknown Execution Accelerator 'tensorrt' is requested"),
            "{err}"
        );
    }

    #[test]
    fn cpu_accelerators_are_refused_for_cpu_instances() {
        let openvino = r#"instance_group [ { kind: KIND_CPU } ]
            optimization { execution_accelerators { cpu_execution_accelerator [ { name: "openvino" } ] } }"#;
        let err = place(&mut config(openvino), &no_gpu, false).unwrap_err();
        assert!(
            err.starts_with(
                "unknown Execution Accelerator 'openvino' is requested for the CPU instances of model 'm'"
            ),
            "{err}"
        );
        // GPU instances do not read the CPU accelerators.
        let on_gpu = openvino.replace("KIND_CPU", "KIND_GPU");
        assert!(place(&mut config(&on_gpu), &|| gpus(&[0]), false).is_ok());
    }
}
