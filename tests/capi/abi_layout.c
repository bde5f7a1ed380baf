/* Prints the size and field offsets of every C ABI struct as JSON, as the
 * compiler lays them out from strata.h: python/tests/test_abi.py checks
 * the Python mirrors (python/strata/_native.py) against it. */
#include <stddef.h>
#include <stdio.h>

#include "strata/strata.h"

static int first_struct = 1;
static int first_field = 1;

static void Begin(const char* name, size_t size) {
  printf("%s\n  \"%s\": {\"size\": %zu, \"fields\": {",
         first_struct ? "{" : ",", name, size);
  first_struct = 0;
  first_field = 1;
}

static void Field(const char* name, size_t offset) {
  printf("%s\"%s\": %zu", first_field ? "" : ", ", name, offset);
  first_field = 0;
}

#define BEGIN(type) Begin(#type, sizeof(type))
#define FIELD(type, field) Field(#field, offsetof(type, field))
#define END() printf("}}")

int main(void) {
  BEGIN(strata_engine_options);
  FIELD(strata_engine_options, struct_size);
  FIELD(strata_engine_options, device);
  FIELD(strata_engine_options, cuda_device);
  FIELD(strata_engine_options, swap_files);
  FIELD(strata_engine_options, device_budget);
  FIELD(strata_engine_options, host_budget);
  FIELD(strata_engine_options, nvme_budget);
  FIELD(strata_engine_options, swap_dir);
  FIELD(strata_engine_options, home);
  FIELD(strata_engine_options, io_threads);
  FIELD(strata_engine_options, prefetch);
  FIELD(strata_engine_options, lock_host);
  FIELD(strata_engine_options, numa_node);
  FIELD(strata_engine_options, device_roles);
  FIELD(strata_engine_options, host_to_device_gbps);
  FIELD(strata_engine_options, device_to_host_gbps);
  FIELD(strata_engine_options, nvme_read_gbps);
  FIELD(strata_engine_options, nvme_write_gbps);
  FIELD(strata_engine_options, state_format);
  END();
  BEGIN(strata_engine_info);
  FIELD(strata_engine_info, struct_size);
  FIELD(strata_engine_info, on_cuda);
  FIELD(strata_engine_info, cuda_device);
  FIELD(strata_engine_info, host_locked);
  FIELD(strata_engine_info, device);
  FIELD(strata_engine_info, device_name);
  FIELD(strata_engine_info, device_reason);
  FIELD(strata_engine_info, host_backing);
  FIELD(strata_engine_info, aio_backend);
  END();
  BEGIN(strata_tier_stats);
  FIELD(strata_tier_stats, budget);
  FIELD(strata_tier_stats, used);
  FIELD(strata_tier_stats, peak);
  END();
  BEGIN(strata_engine_stats);
  FIELD(strata_engine_stats, struct_size);
  FIELD(strata_engine_stats, reserved);
  FIELD(strata_engine_stats, tiers);
  FIELD(strata_engine_stats, bytes);
  FIELD(strata_engine_stats, fetches);
  FIELD(strata_engine_stats, hits);
  FIELD(strata_engine_stats, prefetch_hits);
  FIELD(strata_engine_stats, late_prefetches);
  FIELD(strata_engine_stats, prefetches);
  FIELD(strata_engine_stats, evictions);
  FIELD(strata_engine_stats, writebacks);
  FIELD(strata_engine_stats, trace_invalidations);
  FIELD(strata_engine_stats, steps);
  FIELD(strata_engine_stats, stall_seconds);
  FIELD(strata_engine_stats, update_wait_seconds);
  FIELD(strata_engine_stats, abandoned_prefetches);
  FIELD(strata_engine_stats, role_bytes);
  FIELD(strata_engine_stats, discarded_bytes);
  FIELD(strata_engine_stats, nvme_bytes_hashed);
  END();
  BEGIN(strata_tensor_spec);
  FIELD(strata_tensor_spec, name);
  FIELD(strata_tensor_spec, shape);
  FIELD(strata_tensor_spec, ndim);
  FIELD(strata_tensor_spec, dtype);
  FIELD(strata_tensor_spec, roles);
  FIELD(strata_tensor_spec, reserved);
  END();
  BEGIN(strata_group_spec);
  FIELD(strata_group_spec, struct_size);
  FIELD(strata_group_spec, num_tensors);
  FIELD(strata_group_spec, name);
  FIELD(strata_group_spec, tensors);
  FIELD(strata_group_spec, use_default_placement);
  FIELD(strata_group_spec, home);
  FIELD(strata_group_spec, device_roles);
  END();
  BEGIN(strata_tensor_info);
  FIELD(strata_tensor_info, struct_size);
  FIELD(strata_tensor_info, role);
  FIELD(strata_tensor_info, dtype);
  FIELD(strata_tensor_info, ndim);
  FIELD(strata_tensor_info, name);
  FIELD(strata_tensor_info, shape);
  FIELD(strata_tensor_info, data);
  FIELD(strata_tensor_info, bytes);
  FIELD(strata_tensor_info, tier);
  FIELD(strata_tensor_info, on_cuda);
  END();
  BEGIN(strata_optimizer_options);
  FIELD(strata_optimizer_options, struct_size);
  FIELD(strata_optimizer_options, algo);
  FIELD(strata_optimizer_options, mode);
  FIELD(strata_optimizer_options, micro_batches);
  FIELD(strata_optimizer_options, skip_on_overflow);
  FIELD(strata_optimizer_options, threads);
  FIELD(strata_optimizer_options, grad_buffers);
  FIELD(strata_optimizer_options, read_ahead);
  FIELD(strata_optimizer_options, speculate);
  FIELD(strata_optimizer_options, reserved);
  FIELD(strata_optimizer_options, clip_norm);
  END();
  BEGIN(strata_step_hyper);
  FIELD(strata_step_hyper, struct_size);
  FIELD(strata_step_hyper, reserved);
  FIELD(strata_step_hyper, lr);
  FIELD(strata_step_hyper, beta1);
  FIELD(strata_step_hyper, beta2);
  FIELD(strata_step_hyper, eps);
  FIELD(strata_step_hyper, weight_decay);
  FIELD(strata_step_hyper, lr_decay);
  FIELD(strata_step_hyper, loss_scale);
  END();
  BEGIN(strata_step_report);
  FIELD(strata_step_report, struct_size);
  FIELD(strata_step_report, skipped);
  FIELD(strata_step_report, step);
  FIELD(strata_step_report, grad_norm);
  FIELD(strata_step_report, clip_coef);
  FIELD(strata_step_report, step_seconds);
  FIELD(strata_step_report, hidden_seconds);
  FIELD(strata_step_report, finish_wait_seconds);
  FIELD(strata_step_report, acquire_wait_seconds);
  FIELD(strata_step_report, speculated);
  FIELD(strata_step_report, undone);
  FIELD(strata_step_report, overflow_group);
  FIELD(strata_step_report, reserved);
  END();
  BEGIN(strata_step_checks);
  FIELD(strata_step_checks, struct_size);
  FIELD(strata_step_checks, overflow);
  FIELD(strata_step_checks, sum_squares);
  END();

  BEGIN(strata_abort_report);
  FIELD(strata_abort_report, struct_size);
  FIELD(strata_abort_report, applied);
  FIELD(strata_abort_report, completed);
  FIELD(strata_abort_report, skipped);
  FIELD(strata_abort_report, overflow_group);
  FIELD(strata_abort_report, reserved);
  FIELD(strata_abort_report, grad_norm);
  END();
  BEGIN(strata_gradients_info);
  FIELD(strata_gradients_info, struct_size);
  FIELD(strata_gradients_info, group);
  FIELD(strata_gradients_info, data);
  FIELD(strata_gradients_info, bytes);
  FIELD(strata_gradients_info, on_cuda);
  FIELD(strata_gradients_info, num_tensors);
  END();
  BEGIN(strata_dlpack_versioned);
  FIELD(strata_dlpack_versioned, version);
  FIELD(strata_dlpack_versioned, manager_ctx);
  FIELD(strata_dlpack_versioned, deleter);
  FIELD(strata_dlpack_versioned, flags);
  FIELD(strata_dlpack_versioned, dl_tensor);
  END();
  printf("\n}\n");
  return 0;
}
