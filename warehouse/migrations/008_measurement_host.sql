-- Harness 14: the host's time per call of each case beside the device time (ms; null where not
-- taken), the speedup over the slower of the two per case (a program whose host does not keep
-- ahead of the GPU), whether some case was launch-bound, and the configs an autotuned kernel
-- chose per case (JSON). Null for measurements made before.
ALTER TABLE measurements ADD COLUMN kernel_host_ms DOUBLE[];
ALTER TABLE measurements ADD COLUMN ref_host_ms DOUBLE[];
ALTER TABLE measurements ADD COLUMN program_speedup DOUBLE;
ALTER TABLE measurements ADD COLUMN launch_bound BOOLEAN;
ALTER TABLE measurements ADD COLUMN autotune_json VARCHAR;
