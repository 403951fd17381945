-- Harness 14: the host's time per call of each case beside the device time (ms; null where not
-- taken), the speedup over device times alone, whether some case was launch-bound, and the
-- configs an autotuned kernel chose per case (JSON). Null for measurements made before.
ALTER TABLE measurements ADD COLUMN kernel_host_ms DOUBLE[];
ALTER TABLE measurements ADD COLUMN ref_host_ms DOUBLE[];
ALTER TABLE measurements ADD COLUMN device_speedup DOUBLE;
ALTER TABLE measurements ADD COLUMN launch_bound BOOLEAN;
ALTER TABLE measurements ADD COLUMN autotune_json VARCHAR;
