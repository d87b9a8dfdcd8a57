/* gpu_metrics.h - per-GPU metrics for /metrics, read from NVML.
 *
 * NVML is loaded at run time (dlopen of libnvidia-ml.so.1, or the path in
 * $KILN_NVML_LIBRARY): kiln has no build dependency on it, and a machine
 * without the NVIDIA driver simply has no GPU metrics. Thread-safe. */
#ifndef KILN_GPU_METRICS_H
#define KILN_GPU_METRICS_H

/* Returns malloc'd Prometheus text exposition lines (HELP, TYPE and one
 * sample per GPU, labelled gpu="<index>" and gpu_uuid="GPU-...") for:
 *   kiln_gpu_utilization                ratio 0..1 of time a kernel ran
 *   kiln_gpu_memory_used_bytes / kiln_gpu_memory_total_bytes
 *   kiln_gpu_temperature_celsius
 *   kiln_gpu_power_usage_watts / kiln_gpu_power_limit_watts
 *   kiln_gpu_energy_consumption_joules  (counter, since the driver loaded)
 * A value the GPU does not report is left out. Returns "" (malloc'd) when
 * there is no NVML or no GPU, NULL only when out of memory. The caller
 * frees it. */
char *gpu_metrics_text(void);

#endif
